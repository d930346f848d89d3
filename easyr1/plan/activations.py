"""Activation, attention-mask and logits memory of one micro-batch, for the update and for the log-prob passes.

Token counts are worst cases: every sample at ``max_prompt_length + max_response_length`` (padding-free packing
and dynamic batching save memory only when sequences are shorter; the plan does not know the lengths).

Per decoder layer and token, the tensors autograd keeps for the backward of a Llama/Qwen layer (b bytes each, the
compute dtype): the two norm outputs and the two residual inputs (4h), query before and after rotary plus the
attention output (3 q, q = heads x head_dim), keys before and after rotary and values (3 kv, kv = kv_heads x
head_dim), the MLP's gate, up, activation and product (4 i); plus the two RMSNorm inputs upcast to fp32 (2 h x 4
bytes). With gradient checkpointing a layer keeps only its input (h x b) and one layer's full set is alive while it
is recomputed. The vision tower: per patch and block 13 v + 4 v_i elements (v its width, v_i its MLP width: the two
norms' inputs and outputs 4 v, the fused query-key-value output 3 v, the rotary's rotated halves of queries and keys
and their results 4 v, the attention output and the projection's input 2 v; the MLP as the decoder's), per patch
once the merger's 5 v and the patch embedding's input (3 x temporal patch x patch^2 pixels, 4 bytes: the
processor's fp32; twice that under sequence parallelism, below), for one image per sample at ``data.max_pixels``
(``worker.rollout.limit_images`` images when set), no more image tokens than ``max_prompt_length``; nothing is kept
for it when it is frozen. Measured by autograd's saved tensors on a Qwen2.5-VL tower (bench/ulysses_memory.py's):
2731 elements per patch and block against 13 v + 4 v_i = 2688.

Logits are computed only where they predict a response token (``logits_to_keep``), ``(mb, R, V)`` in the compute
dtype; the update also keeps, per chunk of ``algorithms/logits.py``, the fp32 copy its log-sum-exp saves (none when
the compute dtype is fp32), the softmax of the entropy bonus when ``entropy_coeff > 0``, and the logits' gradient.
SDPA's mask: ``mb x L^2`` bools padded, ``(mb x L)^2`` packed with shared prompts (a dense block mask), nothing
packed without them (a zero-stride view, ``workers/block_attention.py``); flash attention (GPU, 16-bit) none.

Ulysses sequence parallelism (``ulysses_size`` N > 1, ``distributed/sequence_parallel.py``) counts one rank of a
group, whose micro-batch is cut from the group's pooled rows (the caller sizes it) and always packed: the decoder
keeps T / N tokens' activations, plus per layer and token the attention output in the all-to-all's layout (q) and,
where N does not divide the key-value heads, keys and values repeated to the query heads (2 (q - kv) more), plus the
whole row's input embeddings (T x h: the slice is a view of them); the logits of the response positions inside its
slice (1/N of the samples' responses, at most T / N); the vision tower on 1/N of the images (each rank encodes a
share) when there are at least N, on all of them otherwise, plus every image's assembled embeddings (image tokens x
h) and the pixels twice (the forward's merged copy of all rows' beside the pooled rows and the share's copy); the
mask as without the split (a shared-prompt mask is the whole row's on every rank).
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


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _vision_patches(size: ModelSize, batch: MicroBatch, max_pixels: int, ulysses_size: int) -> int:
    """Patches one rank runs through the vision tower: all of the micro-batch's, or a 1/N share of them when a
    sequence-parallel group of N splits at least N images."""
    shape = size.vision_shape
    assert shape is not None
    images = batch.samples * batch.images
    patches = images * patches_per_image(shape, max_pixels, batch.images, batch.prompt)
    return _ceil(patches, ulysses_size) if images >= ulysses_size else patches


def _pixel_bytes(size: ModelSize, batch: MicroBatch, max_pixels: int, ulysses_size: int) -> int:
    """The micro-batch's pixel values (fp32, as the processor gives them): the forward's merged copy of every row's,
    which the patch embedding keeps; under sequence parallelism twice that: the merged copy, beside the rows pooled
    from the other members ((N - 1) / N of them) and the rank's own copy of its share (1 / N), which the patch
    embedding keeps."""
    shape = size.vision_shape
    assert shape is not None
    patches = _vision_patches(size, batch, max_pixels, 1)
    return patches * 3 * shape.temporal_patch_size * shape.patch_size**2 * 4 * (2 if ulysses_size > 1 else 1)


def _split_extras(size: ModelSize, batch: MicroBatch, compute_bytes: int, ulysses_size: int, max_pixels: int) -> int:
    """What a rank of a sequence-parallel group keeps beyond its T / N tokens' share of the decoder (module
    docstring): per layer the all-to-all layout's attention output and repeated key-value heads, the whole row's
    input embeddings, every image's assembled embeddings."""
    if ulysses_size == 1:
        return 0
    text = size.text
    q = text.heads * text.head_dim
    repeated = 2 * (q - text.kv_heads * text.head_dim) if text.kv_heads % ulysses_size else 0
    per_layer = _ceil(batch.tokens, ulysses_size) * (q + repeated) * compute_bytes * text.attention_layers
    embeddings = batch.tokens * text.hidden * compute_bytes
    image_tokens = 0
    if size.vision_shape is not None and batch.images:
        image_tokens = _vision_patches(size, batch, max_pixels, 1) // size.vision_shape.merge_size**2
    return per_layer + embeddings + image_tokens * text.hidden * compute_bytes


def _logit_rows(batch: MicroBatch, padding_free: bool, ulysses_size: int) -> int:
    """Logit rows one rank computes: every response position, or under a sequence-parallel group those inside its
    slice of T / N tokens (the samples it touches, at most the slice's length)."""
    rows = batch.response + (0 if padding_free else 1)
    if ulysses_size == 1:
        return batch.samples * rows
    touched = min(batch.samples, _ceil(batch.samples, ulysses_size) + (1 if batch.samples % ulysses_size else 0))
    return min(touched * rows, _ceil(batch.tokens, ulysses_size))


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
    share_prompt: bool = True,
    ulysses_size: int = 1,
) -> ActivationPlan:
    """One update micro-batch on one rank: forward activations kept for the backward, the attention mask and the
    logits (``ulysses_size``: the module docstring)."""
    text = size.text
    padding_free = padding_free or ulysses_size > 1  # the split always packs
    tokens = _ceil(batch.tokens, ulysses_size)
    full_layer = tokens * (layer_elements(text) * compute_bytes + 2 * text.hidden * 4)
    if checkpointing:
        layers = tokens * text.hidden * compute_bytes * text.layers + full_layer
    else:
        layers = full_layer * text.layers
    layers += _split_extras(size, batch, compute_bytes, ulysses_size, max_pixels)
    vision = 0
    if size.vision_shape is not None and batch.images and vision_trainable:
        shape = size.vision_shape
        patches = _vision_patches(size, batch, max_pixels, ulysses_size)
        per_block = patches * (13 * shape.hidden + 4 * shape.intermediate) * compute_bytes
        merger = patches * 5 * shape.hidden * compute_bytes
        vision = _pixel_bytes(size, batch, max_pixels, ulysses_size) + merger
        vision += (
            patches * shape.hidden * compute_bytes * shape.depth + per_block
            if checkpointing
            else (per_block * shape.depth)
        )
    per_logit = 2 * compute_bytes + (4 if compute_bytes < 4 else 0) + (4 if entropy_bonus else 0)
    logits = _logit_rows(batch, padding_free, ulysses_size) * text.vocab * per_logit
    mask = attention_mask_bytes(batch, padding_free, flash, share_prompt)
    return ActivationPlan(layers=layers, vision=vision, mask=mask, logits=logits)


def experience_activations(
    size: ModelSize,
    batch: MicroBatch,
    compute_bytes: int,
    *,
    padding_free: bool,
    flash: bool,
    max_pixels: int,
    share_prompt: bool = True,
    ulysses_size: int = 1,
) -> ActivationPlan:
    """One log-prob (or value) micro-batch on one rank without a graph: one layer's temporaries, the vision tower's
    output, the logits and one fp32 chunk of the log-softmax (``ulysses_size``: the module docstring)."""
    text = size.text
    padding_free = padding_free or ulysses_size > 1
    layers = _ceil(batch.tokens, ulysses_size) * (4 * text.hidden + 2 * text.intermediate) * compute_bytes
    if ulysses_size > 1:  # the whole row's input embeddings
        layers += batch.tokens * text.hidden * compute_bytes
    vision = 0
    if size.vision_shape is not None and batch.images:
        shape = size.vision_shape
        patches = _vision_patches(size, batch, max_pixels, ulysses_size)
        vision = patches * (4 * shape.hidden + 2 * shape.intermediate) * compute_bytes
    logit_rows = _logit_rows(batch, padding_free, ulysses_size)
    logits = logit_rows * text.vocab * compute_bytes + min(logit_rows, DEFAULT_CHUNK_TOKENS) * text.vocab * 4 * 2
    mask = attention_mask_bytes(batch, padding_free, flash, share_prompt)
    return ActivationPlan(layers=layers, vision=vision, mask=mask, logits=logits)


def attention_mask_bytes(batch: MicroBatch, padding_free: bool, flash: bool, share_prompt: bool = True) -> int:
    """The boolean mask SDPA gets: per row ``L^2`` padded, the whole packed row squared with shared prompts, none
    packed without them (a zero-stride view)."""
    if flash:
        return 0
    length = batch.prompt + batch.response
    if not padding_free:
        return batch.samples * length**2
    return batch.tokens**2 if share_prompt else 0
