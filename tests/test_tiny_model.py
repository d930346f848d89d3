"""The tiny model builder: tokenizer properties, determinism, loading with transformers and serving with vLLM."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from easyr1.tools.tiny_model import COLOUR_WORDS, SPECIAL_TOKENS, TEXT_FAMILIES, VISION_FAMILIES, build_tiny_model


IMAGE_SIDE = {"qwen2_vl": 56, "qwen2_5_vl": 56, "qwen3_vl": 64, "qwen3_5": 64}  # min_pixels of each family's processor


def _messages(with_image: bool) -> list[dict]:
    content = [{"type": "text", "text": "What colour is the shape?"}]
    if with_image:
        content.insert(0, {"type": "image"})
    return [{"role": "user", "content": content}]


def test_answer_words_and_digits_are_single_tokens(tiny_qwen2_5_vl_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl_dir)
    for word in COLOUR_WORDS:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
        assert len(tokenizer.encode(" " + word, add_special_tokens=False)) == 1, " " + word
    for digit in "0123456789":
        assert len(tokenizer.encode(digit, add_special_tokens=False)) == 1, digit
    # A response follows "<|im_start|>assistant\n": the answer word is one token there, then <|im_end|>.
    prompt = tokenizer.apply_chat_template(_messages(True), add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    for word in COLOUR_WORDS:
        full = tokenizer.encode(prompt + word + "<|im_end|>", add_special_tokens=False)
        assert full[: len(prompt_ids)] == prompt_ids
        assert len(full) == len(prompt_ids) + 2
        assert tokenizer.decode(full[len(prompt_ids)]) == word


def test_special_tokens_follow_qwen_order_and_roles(tiny_qwen2_5_vl_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2_5_vl_dir)
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert ids == list(range(ids[0], ids[0] + len(SPECIAL_TOKENS)))
    assert ids[-1] == len(tokenizer) - 1
    assert 330 <= len(tokenizer) <= 400
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    # special tokens are never split and are dropped when decoding with skip_special_tokens
    text = "<|vision_start|><|image_pad|><|vision_end|>red<|im_end|>"
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(encoded[:3]) == ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "red"


def test_chat_template_renders_qwen_format(tiny_qwen2_5_vl_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_vl_dir)
    text = processor.apply_chat_template(_messages(True), add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is the shape?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = processor.tokenizer.apply_chat_template(with_system, add_generation_prompt=False, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_same_seed_gives_identical_files_and_another_seed_does_not(tmp_path, tiny_qwen2_5_vl_dir):
    again = build_tiny_model(tmp_path / "again", family="qwen2_5_vl", seed=0)
    other = build_tiny_model(tmp_path / "other", family="qwen2_5_vl", seed=1)
    names = sorted(path.name for path in tiny_qwen2_5_vl_dir.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert names == sorted(path.name for path in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (tiny_qwen2_5_vl_dir / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_size_arguments_build_a_larger_model_that_runs_a_forward(tmp_path, tiny_qwen2_5_vl_dir):
    path = build_tiny_model(tmp_path / "wide", hidden_size=256, num_layers=3, intermediate_size=512)
    text = AutoConfig.from_pretrained(path).text_config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (256, 3, 512)
    assert (text.num_attention_heads, text.num_key_value_heads) == (8, 4)  # head_dim stays 32
    model = AutoModelForImageTextToText.from_pretrained(path)
    default = AutoModelForImageTextToText.from_pretrained(tiny_qwen2_5_vl_dir)
    assert model.config.vision_config.out_hidden_size == 256  # the merger feeds the wider language model
    assert sum(p.numel() for p in model.parameters()) > 2 * sum(p.numel() for p in default.parameters())
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tokenizer.encode("What colour is the shape?", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()


def test_size_arguments_reject_a_head_dim_other_than_32(tmp_path):
    with pytest.raises(ValueError, match="32 \\* num_heads"):
        build_tiny_model(tmp_path / "bad", hidden_size=256, num_heads=4)
    assert not (tmp_path / "bad" / "model.safetensors").exists()


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_config_matches_tokenizer_and_size_limits(tiny_model_dir, family):
    path = tiny_model_dir(family)
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert config.model_type == family
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.video_token_id == tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_end_token_id == tokenizer.convert_tokens_to_ids("<|vision_end|>")
    text = config.text_config
    assert text.vocab_size == len(tokenizer)
    assert text.hidden_size == 128 and text.num_hidden_layers == 2
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert head_dim >= 32  # vLLM's CPU attention kernels need it
    # the sections split the rotary frequencies: all of head_dim's, or Qwen3.5's quarter (partial_rotary_factor)
    rotary_dim = int(head_dim * text.rope_parameters.get("partial_rotary_factor", 1.0))
    assert sum(text.rope_parameters["mrope_section"]) == rotary_dim // 2
    assert config.vision_config.depth == 2
    generation = json.loads((path / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation["eos_token_id"]


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_loads_with_transformers_and_runs_an_image_forward(tiny_model_dir, family):
    path = tiny_model_dir(family)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    side = IMAGE_SIDE[family]
    text = processor.apply_chat_template(_messages(True), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (side, side), (200, 30, 30))], return_tensors="pt")
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    assert image_tokens == 4  # one 2x2 merged grid: the smallest image the processor allows
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.vllm
def test_vllm_serves_the_tiny_model_with_text_and_image_prompts(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    from helpers import vllm_generate
    from vllm import SamplingParams

    from easyr1.data import RLDataset
    from easyr1.models.rope import extend_position_ids

    data_file = str(tiny_dataset_dir / "train.jsonl")
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_vl_dir)
    dataset = RLDataset(data_file, processor.tokenizer, processor, prompt_key="problem", max_prompt_length=64)
    item = dataset[0]
    text_ids = processor.tokenizer.encode("What is 3 + 4?", add_special_tokens=False)
    image_request = {
        "prompt_token_ids": item["raw_prompt_ids"],
        "multi_modal_data": {"image": item["multi_modal_data"]["images"]},
    }
    params = SamplingParams(max_tokens=6, temperature=1.0, logprobs=0, seed=0, ignore_eos=True)
    outputs = vllm_generate(
        tiny_qwen2_5_vl_dir, [{"prompt_token_ids": text_ids}, image_request], params, limit_mm_per_prompt={"image": 1}
    )
    text_result, image_result = (
        {
            "prompt_token_ids": list(output.prompt_token_ids),
            "token_ids": list(sample.token_ids),
            "logprobs": [entry[token].logprob for entry, token in zip(sample.logprobs, sample.token_ids)],
        }
        for output, sample in ((output, output.outputs[0]) for output in outputs)
    )
    assert len(text_result["token_ids"]) == 6 and len(image_result["token_ids"]) == 6

    # vLLM expanded the single image pad itself: its prompt ids are exactly the ids the actor trains on.
    mask = item["attention_mask"].bool()
    assert image_result["prompt_token_ids"] == item["input_ids"][mask].tolist()

    # and it saw the same pixels: its sampled-token log-probs equal a transformers forward on the dataset's inputs
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2_5_vl_dir).eval()
    response = torch.tensor([image_result["token_ids"]])
    input_ids = torch.cat([item["input_ids"][None], response], dim=1)
    attention_mask = torch.cat([item["attention_mask"][None], torch.ones_like(response)], dim=1)
    position_ids = extend_position_ids(item["position_ids"][None], response.shape[1])
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids.transpose(0, 1),
            **item["multi_modal_inputs"],
        ).logits
    log_probs = torch.log_softmax(logits[0, -response.shape[1] - 1 : -1].double(), dim=-1)
    expected = log_probs.gather(-1, response[0, :, None]).squeeze(-1)
    assert torch.allclose(expected, torch.tensor(image_result["logprobs"], dtype=torch.float64), atol=1e-4)


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_text_only_families_are_causal_lms_without_a_processor(tiny_model_dir, family):
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(family)
    assert not (path / "preprocessor_config.json").exists()
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert config.model_type == family and getattr(config, "vision_config", None) is None
    assert config.vocab_size == len(tokenizer) and tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = tokenizer.apply_chat_template(_messages(False), add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()
