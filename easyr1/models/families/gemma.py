"""Gemma 3 (``Gemma3ForConditionalGeneration``, ``Gemma3Processor``): a SigLIP tower and a projector that pools its
patches to ``mm_tokens_per_image`` soft tokens, 1-D positions, and image blocks that attend bidirectionally.

What differs from Qwen-VL, and where the trainer reads it:

- **Placeholders.** The chat template writes ``<start_of_image>`` (the BOI token, which is also what the
  processor's ``image_token_id`` attribute names); the processor replaces it with ``"\\n\\n" + BOI + N soft tokens
  + EOI + "\\n\\n"`` and tokenizes again, so newlines next to an image merge into ``"\\n\\n\\n"`` or
  ``"\\n\\n\\n\\n"`` tokens. vLLM applies the same replacement to the raw ids and re-merges the newline tokens,
  looking them up in the vocabulary by their text; :func:`gemma3_expansion_matches` checks the processor's ids
  against that rule. The model's image placeholder is the soft token (``config.image_token_id`` maps to
  ``image_token_index``); it and BOI (which would start an image in a later turn's prompt) are never sampled.
- **Bidirectional image blocks.** ``token_type_ids`` (1 on soft tokens) make each image's block of soft tokens
  attend to itself in both directions. They are a function of the ids (the processor marks exactly the soft
  tokens), so the forward computes them from whatever ids it runs on: padded, packed (the blocks of different
  samples stay apart: a block never spans a sample boundary, since an EOI ends each) or the HF engine's prompt, and
  response tokens get 0 because they are never soft tokens. The model then builds its masks itself (full and
  sliding-window layers, packed samples from the restarting positions); an explicit mask would replace both the
  image blocks and the sliding windows, so this family gets none and shares no prompts.
- **Images** go to the tower as ``(N, 3, H, W)`` at the processor's fixed size; the dummy image is one of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from easyr1.models.families.base import Family, TinyRecipe


if TYPE_CHECKING:
    import torch
    from torch import nn


GEMMA3_VISION_MODULES = ("vision_tower", "multi_modal_projector")
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
SOFT_TOKEN = "<image_soft_token>"
# vLLM's Gemma 3 prompt processing looks these up by their text (gemma3_mm.py, _apply_token_matches)
NEWLINE_TOKENS = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")


def gemma3_dummy_image(model: nn.Module, device: torch.device | str) -> dict[str, torch.Tensor]:
    """One black image at the tower's input size, ``(1, 3, H, W)``: ``get_image_features``' keyword arguments."""
    import torch

    vision = model.config.vision_config
    size = int(vision.image_size)
    channels = int(getattr(vision, "num_channels", 3))
    dtype = next(model.parameters()).dtype
    return {"pixel_values": torch.zeros(1, channels, size, size, dtype=dtype, device=device)}


def _merge_pairs(ids: list[int], pair: tuple[int, int], merged: int) -> list[int]:
    """``ids`` with every non-overlapping occurrence of ``pair``, left to right, replaced by ``merged``."""
    out: list[int] = []
    position = 0
    while position < len(ids):
        if position + 1 < len(ids) and (ids[position], ids[position + 1]) == pair:
            out.append(merged)
            position += 2
        else:
            out.append(ids[position])
            position += 1
    return out


def gemma3_expanded_ids(raw_ids: Sequence[int], processor: Any, config: Any) -> list[int]:
    """The ids the engine derives from the raw prompt: each BOI replaced by ``\\n\\n BOI soft*N EOI \\n\\n``, then
    the newline tokens that meet merged (``\\n`` + ``\\n\\n`` and ``\\n\\n`` + ``\\n`` into ``\\n\\n\\n``, ``\\n\\n`` +
    ``\\n\\n`` into ``\\n\\n\\n\\n``), in vLLM's order."""
    vocab = processor.tokenizer.get_vocab()
    one, two, three, four = (vocab[text] for text in NEWLINE_TOKENS)
    boi, eoi, soft = int(config.boi_token_id), int(config.eoi_token_id), int(config.image_token_id)
    block = [two, boi, *([soft] * int(processor.image_seq_length)), eoi, two]
    ids: list[int] = []
    for token in raw_ids:
        ids.extend(block if token == boi else [token])
    ids = _merge_pairs(ids, (one, two), three)
    ids = _merge_pairs(ids, (two, one), three)
    return _merge_pairs(ids, (two, two), four)


def gemma3_expansion_matches(expanded_ids: Sequence[int], raw_ids: Sequence[int], processor: Any, config: Any) -> bool:
    """Whether the processor's ids are the raw ids expanded as vLLM expands them (:func:`gemma3_expanded_ids`)."""
    return gemma3_expanded_ids(raw_ids, processor, config) == list(expanded_ids)


def gemma3_image_text(processor: Any) -> str:
    """What the processor writes in place of one ``<start_of_image>`` (no pan-and-scan crops)."""
    return processor.full_image_sequence


def gemma3_checkpoint_name(name: str) -> str:
    """Gemma 3 checkpoints (and vLLM) keep the SigLIP tower's weights under ``vision_tower.vision_model.``;
    transformers 5.19 holds and saves them one level up (``vision_tower.embeddings...``)."""
    return _TOWER_LEVEL.sub(r"\1vision_tower.vision_model.", name)


_TOWER_LEVEL = re.compile(r"(^|\.)vision_tower\.(?!vision_model\.)")


def gemma3_token_types(input_ids: torch.Tensor, config: Any) -> dict[str, torch.Tensor]:
    """``token_type_ids``: 1 on image soft tokens, as the processor sets them, for ids of any shape."""
    return {"token_type_ids": (input_ids == int(config.image_token_id)).long()}


# The Gemma 3 chat layout (a user turn's image part is <start_of_image>, the processor expands it) with the tiny
# tokenizer's turn markers: its end of turn is Qwen's <|im_end|>, the EOS of its generation config.
GEMMA3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<start_of_image>"
    "{% elif 'text' in part %}"
    "{{ part['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>model\n"
    "{% endif %}"
)
TINY_IMAGE_SIZE = 64  # SigLIP patches of 8: an 8x8 grid, pooled 2x2 into 16 soft tokens
TINY_TOKENS_PER_IMAGE = 16


def _tiny_config(tokenizer: Any, shape: Any) -> Any:
    """Gemma 3 at the tiny size: one sliding-window and one full-attention layer, head_dim 32 scaled by 1/sqrt(32)
    (``query_pre_attn_scalar``), a window longer than any test sequence; a 2-layer SigLIP without its pooling head
    (released checkpoints have none: it would get no gradient)."""
    from transformers import Gemma3Config

    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    head_dim = shape.hidden_size // shape.num_heads
    layers = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shape.num_layers)]
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": 4096,
        "layer_types": layers,
        "max_position_embeddings": 8192,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        "rms_norm_eps": 1e-6,
        "bos_token_id": pad_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": pad_id,
        "tie_word_embeddings": True,  # as Gemma 3; the top-level flag (transformers reads it) says the same
        "dtype": "float32",
    }
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": TINY_IMAGE_SIZE,
        "patch_size": 8,
        "vision_use_head": False,
    }
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TINY_TOKENS_PER_IMAGE,
        boi_token_index=tokenizer.convert_tokens_to_ids(BOI_TOKEN),
        eoi_token_index=tokenizer.convert_tokens_to_ids(EOI_TOKEN),
        image_token_index=tokenizer.convert_tokens_to_ids(SOFT_TOKEN),
        tie_word_embeddings=True,
        dtype="float32",
    )


def _tiny_processor(tokenizer: Any) -> Any:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    half = [0.5, 0.5, 0.5]  # Gemma 3 normalises with mean = std = 0.5
    image_processor = Gemma3ImageProcessor(
        size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE}, image_mean=half, image_std=half
    )
    return Gemma3Processor(
        image_processor, tokenizer, chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=TINY_TOKENS_PER_IMAGE
    )


FAMILIES = (
    Family(
        model_type="gemma3",
        name="Gemma 3",
        vision_modules=GEMMA3_VISION_MODULES,
        placeholder_attributes=("image_token_id", "boi_token_id"),
        dummy_image=gemma3_dummy_image,
        expansion_matches=gemma3_expansion_matches,
        image_text=gemma3_image_text,
        token_types=gemma3_token_types,
        checkpoint_name=gemma3_checkpoint_name,
        tiny=TinyRecipe(
            config=_tiny_config,
            processor=_tiny_processor,
            special_tokens=(BOI_TOKEN, EOI_TOKEN, SOFT_TOKEN),
            chat_template=GEMMA3_CHAT_TEMPLATE,
            named_tokens=(("boi_token", BOI_TOKEN), ("eoi_token", EOI_TOKEN), ("image_token", SOFT_TOKEN)),
            literal_tokens=NEWLINE_TOKENS,
        ),
    ),
)
