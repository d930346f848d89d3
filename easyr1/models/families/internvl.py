"""InternVL 3 / 3.5 in the transformers format (``InternVLForConditionalGeneration``, model_type ``internvl``).

The language model is a Qwen2 (InternVL3) or Qwen3 (InternVL3.5); the vision tower (InternViT) and the projector
live in ``model.vision_tower`` and ``model.multi_modal_projector``, whose linears share leaf names with the language
model's (``q_proj``...), so LoRA and FSDP must tell them apart by module name. Positions are plain 1-D.

The processor (``InternVLProcessor`` with GotOcr2's image processor) cuts each image into tiles of the vision
tower's input size (plus a thumbnail when there is more than one tile) and replaces the image placeholder
``<IMG_CONTEXT>`` by ``<img>`` + ``image_seq_length`` x tiles ``<IMG_CONTEXT>`` + ``</img>``; ``pixel_values`` are
``(tiles, 3, H, W)``, one row per tile, with no grid: a sample's tiles are its own rows of the concatenation, which
the per-sample ``multi_modal_inputs`` keep together. vLLM serves this architecture as
``InternS1ForConditionalGeneration`` and runs the same HF processor, so both sides cut the same tiles.

A video placeholder ``<video>`` becomes ``Frame1: <img>...</img>\nFrame2: ...``, one tile per frame; its frames'
rows join ``pixel_values`` in the prompt's order. The HF processor writes the frames' context tokens as
``<IMG_CONTEXT>`` (the model embeds every one of them alike), vLLM as ``<video>``: the engine's expanded prompt equals
the trainer's once ``<video>`` is read as ``<IMG_CONTEXT>`` (:func:`engine_token_map`), which are the same
positions carrying the same vision features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from easyr1.models.families.base import Family, TinyRecipe, qwen_turns_chat_template


if TYPE_CHECKING:
    import torch
    from torch import nn


VISION_MODULES = ("vision_tower", "multi_modal_projector")

# The tokenizer attributes InternVLProcessor reads, with the tokens of the released checkpoints.
NAMED_TOKENS = (
    ("start_image_token", "<img>"),
    ("end_image_token", "</img>"),
    ("context_image_token", "<IMG_CONTEXT>"),
    ("video_token", "<video>"),  # vLLM requires it to be one token even for image-only prompts
)

# Qwen's chat format (InternVL3.5's language model is a Qwen3) with the images as InternVL's chat template writes
# them: <IMG_CONTEXT> on a line of its own, which the processor expands.
CHAT_TEMPLATE = qwen_turns_chat_template("<IMG_CONTEXT>\n", "<video>\n")

# The tiny model: 64-pixel tiles of 16-pixel patches, pixel-shuffled by 0.5: (64 / 16)^2 * 0.5^2 = 4 tokens a tile.
TINY_TILE = 64
TINY_PATCH = 16
TINY_DOWNSAMPLE = 0.5
TINY_TOKENS_PER_TILE = int((TINY_TILE // TINY_PATCH) ** 2 * TINY_DOWNSAMPLE**2)
TINY_MAX_TILES = 4  # tiling on: an image of another aspect ratio than 1:1 becomes several tiles and a thumbnail


def _token_id(tokenizer: Any, token: str) -> int:
    return int(tokenizer.convert_tokens_to_ids(token))


def expansion_matches(expanded_ids: Sequence[int], raw_ids: Sequence[int], processor: Any, config: Any) -> bool:
    """Whether the processor's ids are the raw ids with each ``<IMG_CONTEXT>`` replaced by ``<img>``, a positive
    multiple of ``image_seq_length`` ``<IMG_CONTEXT>`` (one run per tile) and ``</img>``."""
    context = int(config.image_token_id)
    start, end = int(processor.start_image_token_id), int(processor.end_image_token_id)
    per_tile = int(processor.image_seq_length)
    expanded, collapsed, position = list(expanded_ids), [], 0
    while position < len(expanded):
        token = expanded[position]
        if token == context:  # every image context token lies inside an <img> ... </img> block
            return False
        if token != start:
            collapsed.append(token)
            position += 1
            continue
        run = position + 1
        while run < len(expanded) and expanded[run] == context:
            run += 1
        tokens = run - position - 1
        if run == len(expanded) or expanded[run] != end or tokens == 0 or tokens % per_tile:
            return False
        collapsed.append(context)
        position = run + 1
    return collapsed == list(raw_ids)


def image_tokens(processor: Any, height: int, width: int, factor: int) -> tuple[int, int]:
    """Tokens the placeholder of an image of ``height`` x ``width`` becomes (``<img>``, one run of
    ``image_seq_length`` per tile, ``</img>``) and the vision tokens among them, from the processor's own tile
    count (the processor's defaults: tiling as the dataset's processor call does it)."""
    counts = processor._get_num_multimodal_tokens(image_sizes=[(height, width)])
    tiles = int(counts["num_image_patches"][0])
    vision = tiles * int(processor.image_seq_length)
    return vision + 2, vision


def video_placeholder(
    processor: Any, num_frames: int, height: int, width: int, fps: float, where: str
) -> tuple[str, int]:
    """The text one ``<video>`` becomes (the processor's own rule: a line ``FrameN: <img>...</img>`` per frame, each
    frame one tile) and its vision tokens; the frames are taken as sampled (no padding, no resampling)."""
    import torch

    # replace_video_token reads only the number of frames of the video's pixel values
    text = processor.replace_video_token({"pixel_values_videos": [torch.empty(num_frames, 0)]}, video_idx=0)
    return text, num_frames * int(processor.image_seq_length)


def engine_token_map(config: Any, tokenizer: Any) -> dict[int, int]:
    """vLLM writes a video frame's context tokens as ``<video>``, the HF processor as ``<IMG_CONTEXT>``."""
    video = tokenizer.convert_tokens_to_ids(getattr(tokenizer, "video_token", None) or "<video>")
    return {int(video): int(config.image_token_id)}


def dummy_image(model: nn.Module, device: torch.device | str) -> dict[str, torch.Tensor]:
    """One black tile at the vision tower's input size: ``get_image_features(pixel_values=(1, 3, H, W))`` (the
    feature layer and selection come from the config)."""
    import torch

    vision = model.config.vision_config
    height, width = vision.image_size
    channels = int(getattr(vision, "num_channels", 3))
    dtype = next(model.parameters()).dtype
    return {"pixel_values": torch.zeros(1, channels, height, width, dtype=dtype, device=device)}


def _tiny_config(tokenizer: Any, shape: Any) -> Any:
    """A tiny InternVL3.5: a Qwen3 language model sized by ``shape`` and a 2-layer InternViT of width 64."""
    from transformers import InternVLConfig

    pad_id = _token_id(tokenizer, "<|endoftext|>")
    text = {
        "model_type": "qwen3",
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": 32,  # vLLM's CPU attention takes head sizes from 32
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "bos_token_id": pad_id,
        "eos_token_id": _token_id(tokenizer, "<|im_end|>"),
        "pad_token_id": pad_id,
        # transformers reads the top-level flag, vLLM's language model this one: the same value in both
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    vision = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "image_size": TINY_TILE,
        "patch_size": TINY_PATCH,
    }
    return InternVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=_token_id(tokenizer, "<IMG_CONTEXT>"),
        # vLLM recomputes the tokens per tile from the sizes; the processor's image_seq_length must equal it
        image_seq_length=TINY_TOKENS_PER_TILE,
        downsample_ratio=TINY_DOWNSAMPLE,
        tie_word_embeddings=False,
        dtype="float32",
    )


def _tiny_processor(tokenizer: Any) -> Any:
    """InternVL's processor at the tiny tile size, tiling on (up to :data:`TINY_MAX_TILES` tiles and a thumbnail)."""
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    tile = {"height": TINY_TILE, "width": TINY_TILE}
    # InternVL normalises with ImageNet's statistics
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    image_processor = GotOcr2ImageProcessor(
        size=tile, crop_to_patches=True, min_patches=1, max_patches=TINY_MAX_TILES, image_mean=mean, image_std=std
    )
    video_processor = InternVLVideoProcessor(size=tile, image_mean=mean, image_std=std)
    return InternVLProcessor(
        image_processor,
        tokenizer,
        video_processor,
        image_seq_length=TINY_TOKENS_PER_TILE,
        chat_template=CHAT_TEMPLATE,
    )


FAMILIES = (
    Family(
        model_type="internvl",
        name="InternVL 3 / 3.5",
        vision_modules=VISION_MODULES,
        # <IMG_CONTEXT> (the config has no video token id: the HF processor writes frames with it too); and vLLM's
        # <video>, which vLLM reads as a video's placeholder in a later turn's prompt
        placeholder_attributes=("image_token_id",),
        placeholder_tokenizer_attributes=("video_token",),
        mrope=False,
        dummy_image=dummy_image,
        expansion_matches=expansion_matches,
        image_tokens=image_tokens,
        video_placeholder=video_placeholder,
        engine_token_map=engine_token_map,
        tiny=TinyRecipe(
            config=_tiny_config,
            processor=_tiny_processor,
            special_tokens=tuple(token for _, token in NAMED_TOKENS),
            named_tokens=NAMED_TOKENS,
            chat_template=CHAT_TEMPLATE,
        ),
    ),
)
