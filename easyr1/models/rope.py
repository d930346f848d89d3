"""Position ids for Qwen-VL-style models: multimodal rotary ("m-rope") indices and their text-position companion.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (Qwen3-VL's rule) and GLM-4.1V (Qwen3-VL's rule, its video frames written
with image tokens) rotate queries and keys with three position streams
(temporal, height, width). Text tokens advance all three together; the tokens of an image or video frame get a grid of
(t, h, w) positions that starts where the text left off, and the text after it continues from the largest
position used so far plus one. This is the rule the checkpoints were trained with and the one vLLM uses
when it serves the rollout, so the trainer's positions and the rollout engine's agree token for token.

The trainer stores four rows per token: row 0 is the plain text position (0, 1, 2, ... over the real tokens,
used by transformers to build attention masks for packed sequences), rows 1-3 are the m-rope (t, h, w)
positions. Transformers' Qwen-VL models accept that (4, batch, length) layout as ``position_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MRopeSettings:
    """The model config values the m-rope index needs."""

    image_token_id: int
    video_token_id: int
    spatial_merge_size: int = 2
    # Qwen2.5-VL: a video's temporal positions step by tokens_per_second * seconds_per_grid; None means 1 per grid.
    tokens_per_second: float | None = None
    # Qwen3-VL, GLM-4.1V: every video frame is its own (1, h, w) grid, separated from the next by timestamp text.
    frames_as_separate_grids: bool = False
    # GLM-4.1V: video frames are image tokens; those between these two tokens (begin / end of video) are video frames.
    video_start_token_id: int | None = None
    video_end_token_id: int | None = None

    @classmethod
    def from_model_config(cls, config: Any) -> MRopeSettings:
        """Read the settings from a transformers config of an m-rope family (or a look-alike); how videos are
        placed is the family's (``Family.video_timed_grids``, ``video_frames_as_grids``, ``video_frame_markers``)."""
        from easyr1.models.families import family_of

        family = family_of(config)
        vision = config.vision_config
        tokens_per_second = getattr(vision, "tokens_per_second", None) if family.video_timed_grids else None
        start, end = (None, None)
        if family.video_frame_markers is not None:
            start, end = (int(getattr(config, attribute)) for attribute in family.video_frame_markers)
        return cls(
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
            spatial_merge_size=int(vision.spatial_merge_size),
            tokens_per_second=tokens_per_second,
            frames_as_separate_grids=family.video_frames_as_grids,
            video_start_token_id=start,
            video_end_token_id=end,
        )

    def token_kinds(self, tokens: Sequence[int]) -> list[str | None]:
        """Per token: ``"image"``, ``"video"`` or ``None`` (text). By token id, except where video frames are image
        tokens (``video_start_token_id``): then an image token inside a begin/end-of-video span is a video frame."""
        kinds: list[str | None] = []
        in_video = False
        for token in tokens:
            if self.video_start_token_id is not None and token == self.video_start_token_id:
                in_video = True
            elif self.video_end_token_id is not None and token == self.video_end_token_id:
                in_video = False
            if token == self.image_token_id:
                kinds.append("video" if in_video else "image")
            elif token == self.video_token_id:
                kinds.append("video")
            else:
                kinds.append(None)
        return kinds


def is_mrope_config(config: Any) -> bool:
    """Whether a transformers model config describes a Qwen-VL model that uses m-rope position ids.

    Decided by the model's family (``Family.mrope``, by ``model_type``): other vision-language families (InternVL,
    Gemma 3) also have a vision config and an image token id, but rotate with plain 1-D positions. A config without
    a ``model_type`` (a look-alike) is judged by those two attributes; an unsupported type is not m-rope.
    """
    from easyr1.models.families import FAMILIES, family_of

    model_type = getattr(config, "model_type", None)
    if model_type and model_type not in FAMILIES:
        return False
    return family_of(config).mrope


def _as_grid_list(grid_thw: torch.Tensor | Sequence[Sequence[int]] | None) -> list[tuple[int, int, int]]:
    if grid_thw is None:
        return []
    return [tuple(int(x) for x in row) for row in torch.as_tensor(grid_thw).reshape(-1, 3).tolist()]


def get_rope_index(
    input_ids: torch.Tensor,
    settings: MRopeSettings,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """M-rope (t, h, w) positions of one sequence: a LongTensor of shape (3, L).

    ``input_ids`` is (L,) with the vision placeholders already expanded (one id per vision token). Where
    ``attention_mask`` is 0 (padding) the positions are 0 and the tokens are skipped. The grids are the
    processor's ``image_grid_thw`` / ``video_grid_thw`` for this sequence, in order of appearance;
    ``second_per_grid_ts`` (Qwen2.5-VL videos) gives each video's seconds per temporal grid step.
    Raises ValueError if the number of vision tokens does not match the grids.
    """
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim != 1:
        raise ValueError(f"get_rope_index takes one sequence of shape (L,), got {tuple(input_ids.shape)}")
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    tokens = input_ids[keep].tolist()

    merge = settings.spatial_merge_size
    # (t, h, w) in merged units and the temporal step, per vision segment, in order of appearance
    image_grids = [(t, h // merge, w // merge, 1.0) for t, h, w in _as_grid_list(image_grid_thw)]
    video_grids = []
    seconds = [1.0] * len(_as_grid_list(video_grid_thw))
    if second_per_grid_ts is not None:
        seconds = [float(s) for s in torch.as_tensor(second_per_grid_ts).reshape(-1).tolist()]
    for (t, h, w), second in zip(_as_grid_list(video_grid_thw), seconds, strict=True):
        if settings.frames_as_separate_grids:
            video_grids.extend([(1, h // merge, w // merge, 1.0)] * t)
        else:
            step = settings.tokens_per_second * second if settings.tokens_per_second is not None else 1.0
            video_grids.append((t, h // merge, w // merge, step))
    pending = {"image": iter(image_grids), "video": iter(video_grids)}
    kinds = settings.token_kinds(tokens)

    pieces: list[torch.Tensor] = []
    next_position = 0
    position = 0
    while position < len(tokens):
        kind = kinds[position]
        if kind is None:
            run_end = position
            while run_end < len(tokens) and kinds[run_end] is None:
                run_end += 1
            pieces.append(torch.arange(next_position, next_position + run_end - position).expand(3, -1))
            next_position += run_end - position
            position = run_end
            continue
        grid = next(pending[kind], None)
        if grid is None:
            raise ValueError(f"the sequence has more {kind} tokens than the {kind} grids describe")
        t, h, w, step = grid
        size = t * h * w
        if kinds[position : position + size] != [kind] * size or len(set(tokens[position : position + size])) != 1:
            raise ValueError(
                f"{kind} tokens do not match the grid {t}x{h}x{w} (merged): expected {size} consecutive "
                f"tokens at position {position}"
            )
        temporal = (torch.arange(t, dtype=torch.float64) * step).long()
        grid_positions = torch.stack(
            [
                temporal.view(t, 1, 1).expand(t, h, w),
                torch.arange(h).view(1, h, 1).expand(t, h, w),
                torch.arange(w).view(1, 1, w).expand(t, h, w),
            ]
        ).reshape(3, size)
        pieces.append(grid_positions + next_position)
        next_position = int(pieces[-1].max()) + 1
        position += size
    for kind, remaining in pending.items():
        if next(remaining, None) is not None:
            raise ValueError(f"the sequence has fewer {kind} tokens than the {kind} grids describe")

    positions = torch.zeros(3, input_ids.shape[0], dtype=torch.long)
    if pieces:
        positions[:, keep] = torch.cat(pieces, dim=1)
    return positions


def text_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, 2, ... over the real tokens of each row and 0 on padding; same shape as the mask."""
    mask = attention_mask.long()
    return ((mask.cumsum(-1) - 1) * mask).clamp(min=0)


def prompt_position_ids(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    settings: MRopeSettings | None = None,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
) -> torch.Tensor:
    """Position ids of one padded sequence: (4, L) for m-rope models (text row + t, h, w), (L,) without settings."""
    text = text_position_ids(attention_mask)
    if settings is None:
        return text
    mrope = get_rope_index(input_ids, settings, image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask)
    return torch.cat([text.unsqueeze(0), mrope], dim=0)


def extend_position_ids(prompt_position_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Append positions for ``response_length`` generated tokens to a batch of prompt position ids.

    Takes (B, P), (B, 4, P) or (B, 3, P) and returns the same layout with P + R positions. Response token k gets
    the prompt's largest position + 1 + k: in the text row its own maximum, in the three m-rope rows their
    common maximum, which is how vLLM continues m-rope positions while decoding.
    """
    if response_length < 0:
        raise ValueError(f"response_length must be >= 0, got {response_length}")
    steps = torch.arange(1, response_length + 1, device=prompt_position_ids.device)
    if prompt_position_ids.ndim == 2:
        start = prompt_position_ids.max(dim=-1, keepdim=True).values
        return torch.cat([prompt_position_ids, start + steps], dim=-1)
    if prompt_position_ids.ndim != 3:
        raise ValueError(f"expected position ids of shape (B, P) or (B, 4, P), got {tuple(prompt_position_ids.shape)}")
    rows = prompt_position_ids.shape[1]
    if rows not in (3, 4):
        raise ValueError(f"expected 4 (text + t, h, w) or 3 (t, h, w) position rows, got {rows}")
    mrope = prompt_position_ids[:, rows - 3 :]
    start = mrope.amax(dim=(1, 2), keepdim=True).expand(-1, 3, -1)  # (B, 3, 1)
    if rows == 4:
        text_start = prompt_position_ids[:, :1].amax(dim=-1, keepdim=True)  # (B, 1, 1)
        start = torch.cat([text_start, start], dim=1)
    return torch.cat([prompt_position_ids, start + steps], dim=-1)
