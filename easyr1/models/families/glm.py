"""GLM-4.1V (``glm4v``): Qwen-VL-shaped vision inputs (flattened patches + ``grid_thw``, tower under ``visual``)
and m-rope positions, with three differences the trainer must know.

- Video frames are ``<|image|>`` tokens, each frame wrapped in ``<|begin_of_image|>``/``<|end_of_image|>`` and
  followed by its timestamp as text, the whole video between ``<|begin_of_video|>`` and ``<|end_of_video|>``. A
  token id alone cannot tell a video frame from an image, so the m-rope index takes the image tokens between those
  two markers for video frames (:class:`~easyr1.models.families.base.Family` ``video_frame_markers``); each frame is
  its own (1, h, w) grid, as in Qwen3-VL.
- transformers 5.19 cannot run images and videos in one forward (it counts every ``<|image|>`` token against the
  image features), so the dataset hands the forward each row's video frames as images
  (:func:`video_frames_as_images`, ``Family.forward_vision_inputs``); positions are computed before, from the
  processor's own grids. The engines get the raw prompt and frames as before.
- The image processor bounds the pixels of a temporal patch (two copies of the image), not of the image
  (``pixel_bounds_frames``), so the dataset halves its size bounds to size images the way the processor will.
- vLLM gives q/k/v their biases only with ``attention_bias: true`` in the text config (transformers always has
  them), and otherwise drops the checkpoint's biases without a word; the tiny config sets it, as GLM-4.5V's
  released config does.

The begin/end markers are banned from sampling along with the placeholders: a sampled ``<|begin_of_video|>`` would
turn the next image of a multi-turn prompt into "video frames".
"""

from __future__ import annotations

from typing import Any

from easyr1.models.families.base import (
    QWEN_VISION_MODULES,
    Family,
    TinyRecipe,
    qwen_dummy_image,
    qwen_turns_chat_template,
)


IMAGE_TOKEN = "<|image|>"
VIDEO_TOKEN = "<|video|>"
# GLM-4.1V's six vision tokens; vLLM looks up all of them (the video ones too) whatever the prompt holds.
GLM_TOKENS = (
    "<|begin_of_image|>",
    IMAGE_TOKEN,
    "<|end_of_image|>",
    "<|begin_of_video|>",
    VIDEO_TOKEN,
    "<|end_of_video|>",
)
_TOKEN_ATTRIBUTES = {
    "image_start_token_id": "<|begin_of_image|>",
    "image_token_id": IMAGE_TOKEN,
    "image_end_token_id": "<|end_of_image|>",
    "video_start_token_id": "<|begin_of_video|>",
    "video_token_id": VIDEO_TOKEN,
    "video_end_token_id": "<|end_of_video|>",
}

# The tiny model's chat format: Qwen's turns (so <|im_end|> ends a response, as in every tiny model) with images and
# videos rendered the way GLM-4.1V's own template renders them.
CHAT_TEMPLATE = qwen_turns_chat_template(
    "<|begin_of_image|><|image|><|end_of_image|>", "<|begin_of_video|><|video|><|end_of_video|>"
)

PATCH_SIZE = 14
# Images of 56x56 to 112x112 pixels (4 to 16 tokens). GLM's processor bounds a temporal patch of two copies of the
# image, so its size bounds are twice these.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
TEMPORAL_PATCH = 2


def video_frames_as_images(input_ids: Any, inputs: dict[str, Any], settings: Any) -> dict[str, Any]:
    """One row's processor tensors with its videos passed as images: every temporal patch of a video becomes a
    (1, h, w) image, images and frames in the order their tokens appear, ``pixel_values`` following.

    transformers 5.19 counts every ``<|image|>`` token against the image features (and again against the video
    features), so a forward holding both images and videos raises "Image features and image tokens do not match".
    The tower encodes each frame as its own (1, h, w) grid either way, and the trainer passes its own position ids,
    so the features and the logits are the same. ``input_ids`` are the row's expanded ids (padding allowed),
    ``settings`` its :class:`~easyr1.models.rope.MRopeSettings`, which tell frames from images.
    """
    import torch

    if "video_grid_thw" not in inputs:
        return inputs
    merge = settings.spatial_merge_size
    images = list(zip(_patches(inputs.get("pixel_values"), inputs.get("image_grid_thw")), _grids(inputs, "image")))
    frames = []
    videos = _patches(inputs["pixel_values_videos"], inputs["video_grid_thw"])
    for video, (t, h, w) in zip(videos, _grids(inputs, "video")):
        size = h * w
        frames.extend((video[k * size : (k + 1) * size], (1, h, w)) for k in range(t))
    pending = {"image": iter(images), "video": iter(frames)}
    pixels, grids = [], []
    kinds = settings.token_kinds(torch.as_tensor(input_ids).tolist())
    position = 0
    while position < len(kinds):
        kind = kinds[position]
        if kind is None:
            position += 1
            continue
        patches, grid = next(pending[kind])
        pixels.append(patches)
        grids.append(grid)
        position += grid[0] * grid[1] * grid[2] // (merge * merge)
    rest = {key: value for key, value in inputs.items() if key not in _VISION_KEYS}
    return {**rest, "pixel_values": torch.cat(pixels), "image_grid_thw": torch.tensor(grids, dtype=torch.long)}


_VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


def _grids(inputs: dict[str, Any], kind: str) -> list[tuple[int, int, int]]:
    grid = inputs.get(f"{kind}_grid_thw")
    return [] if grid is None else [tuple(int(x) for x in row) for row in grid.tolist()]


def _patches(pixels: Any, grid: Any) -> list[Any]:
    """``pixels`` split into each grid's rows of patches."""
    if pixels is None or grid is None:
        return []
    return list(pixels.split([int(t * h * w) for t, h, w in grid.tolist()]))


def _tiny_config(tokenizer: Any, shape: Any) -> Any:
    """GLM-4.1V at the tiny size: head_dim 32, half of it rotated (8 frequencies split (t, h, w) as [2, 3, 3],
    GLM-4.1V's [8, 12, 12] scaled), a 2-block vision tower of width 64 on 14-pixel patches."""
    from transformers import Glm4vConfig

    token_ids = {attribute: tokenizer.convert_tokens_to_ids(token) for attribute, token in _TOKEN_ATTRIBUTES.items()}
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,  # head_dim = hidden / heads = 32
        "num_key_value_heads": shape.num_kv_heads,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 3, 3],
        },
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "tie_word_embeddings": False,  # vLLM reads the text config's flag, transformers the top-level one: equal
        # transformers always gives q/k/v a bias; vLLM builds (and loads) one only when this key says so. Without it
        # vLLM drops the biases: invisible while they are the initial zeros, 0.5 in log-prob once training moves them.
        "attention_bias": True,
        "dtype": "float32",
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": PATCH_SIZE,
        "image_size": 56,  # a 4x4 grid of learned position embeddings, interpolated to each image's grid
        "out_hidden_size": shape.hidden_size,  # the merger's output feeds the language model directly
        "spatial_merge_size": 2,
        "temporal_patch_size": TEMPORAL_PATCH,
    }
    return Glm4vConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, dtype="float32", **token_ids)


def _tiny_processor(tokenizer: Any) -> Any:
    """GLM-4.1V's processor with the tiny image sizes (4 to 16 tokens an image) and video frames of the same sizes."""
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    size = {"shortest_edge": TEMPORAL_PATCH * MIN_PIXELS, "longest_edge": TEMPORAL_PATCH * MAX_PIXELS}
    vision = {"patch_size": PATCH_SIZE, "temporal_patch_size": TEMPORAL_PATCH, "merge_size": 2}
    image_processor = Glm4vImageProcessor(size=size, **vision)
    # a clip's pixels are bounded over all its frames: room for 16 frames of the largest image
    video_size = {"shortest_edge": TEMPORAL_PATCH * MIN_PIXELS, "longest_edge": 16 * MAX_PIXELS}
    video_processor = Glm4vVideoProcessor(size=video_size, fps=2, **vision)
    return Glm4vProcessor(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)


FAMILIES = (
    Family(
        model_type="glm4v",
        name="GLM-4.1V",
        vision_modules=QWEN_VISION_MODULES,
        placeholder_attributes=tuple(_TOKEN_ATTRIBUTES),
        mrope=True,
        video_frames_as_grids=True,
        video_frame_markers=("video_start_token_id", "video_end_token_id"),
        pixel_bounds_frames=TEMPORAL_PATCH,
        dummy_image=qwen_dummy_image,
        forward_vision_inputs=video_frames_as_images,
        tiny=TinyRecipe(
            config=_tiny_config,
            processor=_tiny_processor,
            special_tokens=GLM_TOKENS,
            chat_template=CHAT_TEMPLATE,
        ),
    ),
)
