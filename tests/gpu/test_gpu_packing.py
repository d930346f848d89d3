"""The padding-free (packed) forward with the GPU attention implementations equals the padded forward.

Rows of text and images with responses of different lengths are scored twice by the same model, padded and packed
into one row (``workers/packing.py``), for each attention implementation the machine has: ``sdpa`` always,
``flash_attention_2`` / ``flash_attention_4`` where installed. Compared: response log-probs and the gradients of
a loss on them.

Tolerances. In float32 both paths compute the same sums in a different order (other kernels, other tile shapes), so
they agree to float32 rounding amplified by the depth: 1e-4 on log-probs. In bfloat16 each path rounds every
matmul output to 8 mantissa bits (relative error up to 2^-9), and the two paths round at different places; the
difference between them is of the same size as the difference of either from float32. So the bf16 check is
relative: the packed path may be at most twice as far from the float32 result as the padded path is (plus 1e-3 for
tokens where the padded path happens to be nearly exact), which any real packing error (a token attending
across samples moves log-probs by ~0.2, ``docs/architecture.md``) exceeds by far.
"""

from __future__ import annotations

import pytest
import torch
from helpers import training_batch
from loop import DEVICE

from easyr1.models.loading import load_model
from easyr1.protocol import Batch
from easyr1.workers.actor import response_log_probs
from easyr1.workers.placement import batch_to


def _available(check: str) -> bool:
    from transformers import utils

    return DEVICE == "cuda" and getattr(utils, check, lambda: False)()


IMPLEMENTATIONS = [
    "sdpa",
    pytest.param(
        "flash_attention_2",
        marks=pytest.mark.skipif(not _available("is_flash_attn_2_available"), reason="needs CUDA and flash-attn"),
    ),
    pytest.param(
        "flash_attention_4",
        marks=pytest.mark.skipif(
            not _available("is_flash_attn_4_available") or torch.cuda.get_device_capability()[0] < 9,
            reason="needs a Hopper or newer GPU and flash-attn-4",
        ),
    ),
]
# the same layers the CPU tests probe: one decoder weight, one vision weight
PROBES = ("model.language_model.layers.0.self_attn.q_proj.weight", "model.visual.blocks.0.attn.qkv.weight")


@pytest.fixture(scope="module")
def batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory) -> Batch:
    """Two text rows and four image rows, responses of 1-6 tokens."""
    import json

    text_dir = tmp_path_factory.mktemp("text_rows")
    with (text_dir / "train.jsonl").open("w") as file:
        for question, answer in (("Name a colour.", "red"), ("Which colour is grass?", "green")):
            file.write(json.dumps({"problem": question, "answer": answer}) + "\n")
    text = training_batch(tiny_qwen2_5_vl_dir, text_dir, 2, seed=1)
    images = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 4, seed=2)
    return Batch.concat([text, images])


def score(model_dir, batch: Batch, dtype: torch.dtype, attn: str, padding_free: bool) -> dict[str, torch.Tensor]:
    """Response log-probs (host, float32) and the probes' gradients of their masked sum."""
    torch.manual_seed(0)
    model = load_model(str(model_dir), dtype, attn_implementation=attn).to(DEVICE)
    assert model.config._attn_implementation == attn
    micro = batch_to(batch, DEVICE)
    log_probs, _ = response_log_probs(model, micro, 1.0, padding_free=padding_free)
    (log_probs * micro["response_mask"]).sum().backward()
    parameters = dict(model.named_parameters())
    result = {"log_probs": log_probs.detach().float().cpu()}
    for name in PROBES:
        result[name] = parameters[name].grad.detach().float().cpu()
    return result


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two flattened tensors."""
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
def test_packed_equals_padded_in_float32(attn, batch, tiny_qwen2_5_vl_dir):
    mask = batch["response_mask"].bool()
    padded = score(tiny_qwen2_5_vl_dir, batch, torch.float32, attn, padding_free=False)
    packed = score(tiny_qwen2_5_vl_dir, batch, torch.float32, attn, padding_free=True)
    torch.testing.assert_close(packed["log_probs"][mask], padded["log_probs"][mask], rtol=0, atol=1e-4)
    for name in PROBES:
        scale = padded[name].abs().max().item()
        assert scale > 0, f"{name} got no gradient"
        torch.testing.assert_close(packed[name], padded[name], rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
def test_packed_equals_padded_in_bfloat16(attn, batch, tiny_qwen2_5_vl_dir):
    mask = batch["response_mask"].bool()
    reference = score(tiny_qwen2_5_vl_dir, batch, torch.float32, "sdpa", padding_free=False)
    padded = score(tiny_qwen2_5_vl_dir, batch, torch.bfloat16, attn, padding_free=False)
    packed = score(tiny_qwen2_5_vl_dir, batch, torch.bfloat16, attn, padding_free=True)
    padded_error = (padded["log_probs"] - reference["log_probs"])[mask].abs()
    packed_error = (packed["log_probs"] - reference["log_probs"])[mask].abs()
    assert packed_error.max().item() <= 2 * padded_error.max().item() + 1e-3, (packed_error, padded_error)
    assert packed_error.mean().item() <= 2 * padded_error.mean().item() + 1e-3
    for name in PROBES:
        # the gradients point the same way as the padded bf16 ones, as closely as those match float32
        floor = min(cosine(padded[name], reference[name]), 0.999)
        assert cosine(packed[name], padded[name]) >= floor - 0.01, name
