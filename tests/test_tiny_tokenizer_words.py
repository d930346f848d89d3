"""The tiny tokenizer's ``extra_words`` (the agent demo's action words as single tokens) and the agent demo model.

The default tokenizer must stay exactly the shape demo's: it is compared with the one built by ``tiny_model.py`` as
it was before ``extra_words`` existed, read from the repository's history.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoProcessor, AutoTokenizer

from easyr1.envs.target import ACTION_WORDS, TargetEnv
from easyr1.tools.demo_assets import AGENT_MODEL_NAME, ensure_agent_demo_model, prepare_demo_assets
from easyr1.tools.tiny_model import COLOUR_WORDS, build_tokenizer


REPO = Path(__file__).resolve().parents[1]
# The tiny model's prompt budget in the agent demo: the first turn's whole prompt, image tokens included.
AGENT_PROMPT_BUDGET = 64
# The last commit whose tiny_model.py had no extra_words: the shape demo's tokenizer as it was trained then.
BEFORE_EXTRA_WORDS = "6634d8f3a87e889a5f022a74aeef7ff4cc2ff776"


def single_tokens(tokenizer, words) -> dict[str, int]:
    """How many tokens each word takes, alone and after a space."""
    return {text: len(tokenizer.encode(text, add_special_tokens=False)) for w in words for text in (w, " " + w)}


def tokenizer_state(tokenizer) -> tuple[dict[str, int], dict]:
    """The vocabulary and the whole serialised tokenizer (merges, pre-tokenizer, added tokens)."""
    return tokenizer.get_vocab(), json.loads(tokenizer.backend_tokenizer.to_str())


def load_old_tiny_model(tmp_path: Path):
    try:
        source = subprocess.run(
            ["git", "show", f"{BEFORE_EXTRA_WORDS}:easyr1/tools/tiny_model.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the repository history is not available here ({error})")
    path = tmp_path / "old_tiny_model.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("old_tiny_model_for_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


def test_default_tokenizer_is_the_shape_demos_as_before(tmp_path):
    old = load_old_tiny_model(tmp_path)
    assert tokenizer_state(build_tokenizer()) == tokenizer_state(old.build_tokenizer())
    assert tokenizer_state(build_tokenizer(extra_words=())) == tokenizer_state(old.build_tokenizer())


def test_extra_words_become_single_tokens_and_colours_stay_single():
    plain = build_tokenizer()
    assert any(count > 1 for count in single_tokens(plain, ACTION_WORDS).values())  # not single without the option
    agent = build_tokenizer(extra_words=ACTION_WORDS)
    counts = single_tokens(agent, (*ACTION_WORDS, *COLOUR_WORDS))
    assert set(counts.values()) == {1}, counts
    assert len(agent) == len(plain)  # same vocabulary size: the model's shapes do not change


@pytest.mark.parametrize("words", [("two words",), ("",), ("up2",), "up"])
def test_extra_words_that_cannot_be_one_token_are_refused(words):
    with pytest.raises(ValueError, match="extra"):
        build_tokenizer(extra_words=words)


def test_agent_demo_model_is_built_once_with_action_words_as_answers(tmp_path, tiny_qwen2_5_vl_dir):
    model_dir = ensure_agent_demo_model(tmp_path)
    assert model_dir == tmp_path / "model" / AGENT_MODEL_NAME
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_agent_demo_model(tmp_path) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not built again

    config = json.loads((model_dir / "config.json").read_text())
    assert config == json.loads((tiny_qwen2_5_vl_dir / "config.json").read_text())  # the demo model's shape
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    for word in ACTION_WORDS:
        # A response follows "<|im_start|>assistant\n": the move is one token, then <|im_end|>.
        full = tokenizer.encode(prompt + word + "<|im_end|>", add_special_tokens=False)
        assert full[: len(prompt_ids)] == prompt_ids and len(full) == len(prompt_ids) + 2
        assert tokenizer.decode(full[len(prompt_ids)]) == word

    # The target task's first prompt fits the demo's budget once the processor has expanded the image.
    env = TargetEnv()
    observation = env.reset(0)
    assert observation.text == "<image>"
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": env.system_prompt()},
        {"role": "user", "content": [{"type": "image"}]},
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=observation.images, return_tensors="pt")
    image_tokens = int((inputs["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
    assert image_tokens == 9  # 84x84 pixels: a 3x3 grid of merged vision tokens, one per cell
    assert inputs["input_ids"].shape[1] <= AGENT_PROMPT_BUDGET


def test_a_config_pointing_at_the_agent_model_gets_it_built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo's assets live under .cache/demo of the working directory
    model_path = str(tmp_path / ".cache" / "demo" / "model" / AGENT_MODEL_NAME)
    model = SimpleNamespace(model_path=model_path)
    worker = SimpleNamespace(actor=SimpleNamespace(model=model), reward_model=SimpleNamespace(model_path=None))
    config = SimpleNamespace(worker=worker, data=SimpleNamespace(train_files=None))
    prepare_demo_assets(config)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    assert set(single_tokens(tokenizer, ACTION_WORDS).values()) == {1}
    assert not (tmp_path / ".cache" / "demo" / "data").exists()  # an agent run needs no dataset
