"""How many tokens a prompt becomes once the processor expands its images and videos, computed without pixels.

The chat-formatted prompt holds one placeholder token per image / video. The processor replaces each image
placeholder by one token per merged patch of the resized image, and each video placeholder by the text its
``replace_video_token`` builds (video tokens per temporal patch, plus per-frame timestamps for Qwen3-VL). Sizes
come from file headers, so the length of every row is known while loading the data, before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from easyr1.data.checks import RowError
from easyr1.data.vision import VideoShape, VisionBounds, vision_token_count


@dataclass(frozen=True)
class PromptLength:
    """Tokens of an expanded prompt (``total``) and how many of them stand for images and videos (``vision``)."""

    total: int
    vision: int


def video_placeholder(
    processor: Any, num_frames: int, height: int, width: int, fps: float, where: str
) -> tuple[str, int]:
    """The text the processor puts in place of one video's placeholder token, and its number of video tokens.

    ``height`` x ``width`` is the size of the frames handed to the processor; its video processor may resize them
    again (Qwen3-VL bounds the pixels of the whole clip), which ``get_num_of_video_patches`` accounts for.
    """
    from transformers.video_utils import VideoMetadata

    video_processor = processor.video_processor
    try:
        patches = video_processor.get_num_of_video_patches(num_frames, height, width, {})
    except ValueError as error:  # e.g. Qwen3-VL refuses clips shorter than one temporal patch
        raise RowError(
            where,
            "unusable video",
            f"the processor cannot take a video of {num_frames} frame(s) of {width}x{height}: {error}",
            "give the video more frames",
        ) from error
    grid_t = -(-num_frames // video_processor.temporal_patch_size)  # the processor pads the last temporal patch
    tokens = patches // video_processor.merge_size**2
    # replace_video_token reads only grid_t and the product of the spatial grid, so (h * w, 1) stands for (h, w)
    grid = torch.tensor([[grid_t, patches // grid_t, 1]])
    metadata = VideoMetadata(total_num_frames=num_frames, fps=fps, frames_indices=list(range(num_frames)))
    text = processor.replace_video_token({"video_grid_thw": grid, "video_metadata": [metadata]}, video_idx=0)
    return text, tokens


def _check_placeholders(ids: list[int], processor: Any, images: int, videos: int, where: str) -> None:
    """The chat prompt must hold exactly one placeholder token per image and per video.

    More means the prompt text itself contains the model's vision tokens (the processor would then fail with
    "Image features and image tokens do not match", or the model in the middle of training); fewer means the chat
    template dropped them.
    """
    for kind, count in (("image", images), ("video", videos)):
        token_id = getattr(processor, f"{kind}_token_id", None)
        if token_id is None:
            continue
        found = ids.count(token_id)
        if found != count:
            token = getattr(processor, f"{kind}_token", f"<{kind} token>")
            raise RowError(
                where,
                "vision tokens in prompt text",
                f"the chat-formatted prompt holds {found} {token} token(s) for the row's {count} {kind}(s)",
                f"write <{kind}> markers instead of the model's own vision tokens in the prompt text, or fix "
                "data.override_chat_template",
            )


def expanded_length(
    tokenizer: Any,
    processor: Any,
    chat: str,
    image_sizes: Sequence[tuple[int, int]],
    video_shapes: Sequence[VideoShape],
    bounds: VisionBounds | None,
    where: str,
    image_text: str | None = None,
    image_tokens: Callable[[Any, int, int, int], tuple[int, int]] | None = None,
    video_text: Callable[[Any, int, int, int, float, str], tuple[str, int]] | None = None,
) -> PromptLength:
    """Length of ``chat`` after the processor expands its vision placeholders.

    ``image_sizes`` are the (height, width) the images are resized to, ``video_shapes`` each video as handed to
    the processor (frames, height, width, and the frame rate recorded in its metadata).
    ``image_tokens``: the model family's rule (``Family.image_tokens``: tokens one placeholder becomes, vision
    tokens among them), ``video_text`` its rule for videos (``Family.video_placeholder``); ``None``: the Qwen-VL
    ones. ``image_text``: what the processor writes in place of every image placeholder, when that does not depend
    on the image's size (the family's ``image_text``); the prompt is then tokenized with it, since its tokens may
    merge with their neighbours (Gemma 3's newlines). Raises RowError when the placeholders in ``chat`` do not match
    the row's images and videos.
    """
    ids = tokenizer.encode(chat, add_special_tokens=False)
    if processor is None:
        return PromptLength(len(ids), 0)
    _check_placeholders(ids, processor, len(image_sizes), len(video_shapes), where)
    if image_text is not None and image_sizes and not video_shapes:
        expanded = tokenizer.encode(chat.replace(processor.image_token, image_text), add_special_tokens=False)
        per_image = len(tokenizer.encode(image_text, add_special_tokens=False))
        return PromptLength(len(expanded), per_image * len(image_sizes))
    total, vision = len(ids), 0
    if video_shapes:
        # Video placeholders may expand to text (timestamps), so the expanded prompt is tokenized again.
        pieces = chat.split(processor.video_token)
        for index, shape in enumerate(video_shapes):
            text, tokens = (video_text or video_placeholder)(
                processor, shape.frames, shape.height, shape.width, shape.fps, where
            )
            pieces[index + 1] = text + pieces[index + 1]
            vision += tokens
        total = len(tokenizer.encode("".join(pieces), add_special_tokens=False))
    for height, width in image_sizes:
        if image_tokens is None:
            expanded = tokens = vision_token_count(height, width, bounds)
        else:
            expanded, tokens = image_tokens(processor, height, width, bounds.factor)
        total += expanded - 1
        vision += tokens
    return PromptLength(total, vision)
