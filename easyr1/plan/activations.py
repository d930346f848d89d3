"""Activation, attention-mask and logits memory of one micro-batch, for the update and for the log-prob passes.

Token counts are worst cases: every sample at ``max_prompt_length + max_response_length`` (padding-free packing
and dynamic batching save memory only when sequences are shorter; the plan does not know the lengths).

Per decoder layer and token, the tensors autograd keeps for the backward of a Llama/Qwen layer (b bytes each, the
compute dtype): the two norm outputs and the two residual inputs (4h), query before and after rotary plus the
attention output (3 q, q = heads x head_dim), keys before and after rotary and values (3 kv, kv = kv_heads x
head_dim), the MLP's gate, up, activation and product (4 i); plus the two RMSNorm inputs upcast to fp32 (2 h x 4
bytes). With gradient checkpointing a layer keeps only its input (h x b) and one layer's full set is alive while it
is recomputed. The vision tower: per patch and block 10 v + 4 v_i elements (v its width, v_i its MLP width), for one
image per sample at ``data.max_pixels`` (``worker.rollout.limit_images`` images when set), no more image
tokens than ``max_prompt_length``; nothing is kept for it
when it is frozen.

Logits are computed only where they predict a response token (``logits_to_keep``), ``(mb, R, V)`` in the compute
dtype; the update also keeps, per chunk of ``algorithms/logits.py``, the fp32 copy its log-sum-exp saves (none when
the compute dtype is fp32), the softmax of the entropy bonus when ``entropy_coeff > 0``, and the logits' gradient.
SDPA needs a dense mask: ``mb x L^2`` bools padded, ``(mb x L)^2`` packed; flash attention (GPU, 16-bit) none.
"""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.algorithms.logits import DEFAULT_CHUNK_TOKENS
from easyr1.plan.model_size import ModelSize, TextShape, VisionShape


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: ``samples`` rows of ``prompt`` + ``response`` tokens with ``images`` images each."""

    samples: int
    prompt: int
    response: int
    images: int

    @property
    def tokens(self) -> int:
        """Tokens the forward runs (worst case: every row at its maximum length)."""
        return self.samples * (self.prompt + self.response)


@dataclass(frozen=True)
class ActivationPlan:
    """Bytes of one micro-batch's pass: ``layers`` (decoder activations), ``vision``, ``mask``, ``logits``."""

    layers: int
    vision: int
    mask: int
    logits: int

    @property
    def total(self) -> int:
        """Everything the pass adds on top of the model states."""
        return self.layers + self.vision + self.mask + self.logits


def layer_elements(text: TextShape) -> int:
    """Elements autograd keeps per token in one decoder layer (the compute-dtype part; see the module docstring)."""
    q = text.heads * text.head_dim
    kv = text.kv_heads * text.head_dim
    return 4 * text.hidden + 3 * q + 3 * kv + 4 * text.intermediate


def patches_per_image(vision: VisionShape, max_pixels: int, images: int, max_prompt_length: int) -> int:
    """Vision-tower patches of one of ``images`` images resized to at most ``max_pixels`` pixels; their image tokens
    (``merge_size^2`` patches each) cannot outnumber the prompt's ``max_prompt_length`` tokens."""
    by_pixels = max_pixels // (vision.patch_size**2)
    by_prompt = vision.merge_size**2 * max_prompt_length // max(images, 1)
    return max(min(by_pixels, by_prompt), vision.merge_size**2)


def update_activations(
    size: ModelSize,
    batch: MicroBatch,
    compute_bytes: int,
    *,
    checkpointing: bool,
    padding_free: bool,
    flash: bool,
    vision_trainable: bool,
    max_pixels: int,
    entropy_bonus: bool,
) -> ActivationPlan:
    """One update micro-batch: forward activations kept for the backward, the attention mask and the logits."""
    text = size.text
    tokens = batch.tokens
    full_layer = tokens * (layer_elements(text) * compute_bytes + 2 * text.hidden * 4)
    if checkpointing:
        layers = tokens * text.hidden * compute_bytes * text.layers + full_layer
    else:
        layers = full_layer * text.layers
    vision = 0
    if size.vision_shape is not None and batch.images and vision_trainable:
        shape = size.vision_shape
        patches = batch.samples * batch.images * patches_per_image(shape, max_pixels, batch.images, batch.prompt)
        per_block = patches * (10 * shape.hidden + 4 * shape.intermediate) * compute_bytes
        vision = (
            patches * shape.hidden * compute_bytes * shape.depth + per_block
            if checkpointing
            else (per_block * shape.depth)
        )
    logit_rows = batch.samples * (batch.response + (0 if padding_free else 1))
    per_logit = 2 * compute_bytes + (4 if compute_bytes < 4 else 0) + (4 if entropy_bonus else 0)
    logits = logit_rows * text.vocab * per_logit
    return ActivationPlan(
        layers=layers, vision=vision, mask=attention_mask_bytes(batch, padding_free, flash), logits=logits
    )


def experience_activations(
    size: ModelSize, batch: MicroBatch, compute_bytes: int, *, padding_free: bool, flash: bool, max_pixels: int
) -> ActivationPlan:
    """One log-prob (or value) micro-batch without a graph: one layer's temporaries, the vision tower's output, the
    logits and one fp32 chunk of the log-softmax."""
    text = size.text
    layers = batch.tokens * (4 * text.hidden + 2 * text.intermediate) * compute_bytes
    vision = 0
    if size.vision_shape is not None and batch.images:
        shape = size.vision_shape
        patches = batch.samples * batch.images * patches_per_image(shape, max_pixels, batch.images, batch.prompt)
        vision = patches * (4 * shape.hidden + 2 * shape.intermediate) * compute_bytes
    logit_rows = batch.samples * (batch.response + (0 if padding_free else 1))
    logits = logit_rows * text.vocab * compute_bytes + min(logit_rows, DEFAULT_CHUNK_TOKENS) * text.vocab * 4 * 2
    return ActivationPlan(
        layers=layers, vision=vision, mask=attention_mask_bytes(batch, padding_free, flash), logits=logits
    )


def attention_mask_bytes(batch: MicroBatch, padding_free: bool, flash: bool) -> int:
    """The dense boolean mask SDPA gets: per row ``L^2`` padded, the whole packed row squared padding-free."""
    if flash:
        return 0
    length = batch.prompt + batch.response
    return batch.tokens**2 if padding_free else batch.samples * length**2
