"""The RL prompt dataset: rows from jsonl / json / parquet files, a folder of them, or a hub dataset.

Each item is one left-padded prompt ready for both engines: the expanded token ids, mask and position ids the
actor trains on, and the unexpanded ids (one ``<|image_pad|>`` per image) plus the resized images that the
rollout engine gets. See :class:`RLDataset` for the exact fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from easyr1.data.checks import RowError, check_answer, check_columns, check_prompt, vision_values
from easyr1.data.lengths import PromptLength, expanded_length
from easyr1.data.prompt import build_messages, load_chat_template, load_format_prompt, render_prompt
from easyr1.data.video_file import DEFAULT_MAX_FRAMES, VideoLimits
from easyr1.data.vision import (
    VisionBounds,
    frames_to_array,
    image_size,
    load_image,
    load_video,
    processed_size,
    resize_image,
    video_bounds,
    video_shape,
    vision_bounds,
)
from easyr1.errors import DataError
from easyr1.models.families import family_of
from easyr1.models.loading import load_model_config, pad_token_id
from easyr1.models.rope import MRopeSettings, is_mrope_config, prompt_position_ids


SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")
_FILTER_REPORT_ROWS = 5  # how many filtered row positions the one-line report names


@dataclass(frozen=True)
class Row:
    """One dataset row and where it came from (for error messages)."""

    source: str
    index: int  # 1-based line number in a .jsonl file, 0-based position otherwise
    data: Mapping[str, Any]
    line_based: bool = False

    @property
    def where(self) -> str:
        """``file line N`` or ``file row N``: the place to look when the row is wrong."""
        return f"{self.source} {'line' if self.line_based else 'row'} {self.index}"

    @property
    def base_dir(self) -> Path | None:
        """The directory relative image paths of this row are resolved against when no image_dir is set."""
        path = Path(self.source)
        return path.parent if path.is_file() else None


class _HubRow(Mapping):
    """A row of a ``datasets.Dataset`` that is decoded only when a value is read."""

    def __init__(self, dataset: Any, index: int) -> None:
        self._dataset = dataset
        self._index = index

    def __getitem__(self, key: str) -> Any:
        if key not in self._dataset.column_names:
            raise KeyError(key)
        return self._dataset[self._index][key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dataset.column_names)

    def __len__(self) -> int:
        return len(self._dataset.column_names)

    def decoded(self) -> dict[str, Any]:
        """All columns of the row, decoded in one read."""
        return dict(self._dataset[self._index])


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{path} line {line_number}: invalid JSON: {error.msg} (column {error.colno})"
                ) from error
            if not isinstance(data, dict):
                raise DataError(f"{path} line {line_number}: expected a JSON object, got {type(data).__name__}")
            rows.append(Row(str(path), line_number, data, line_based=True))
    return rows


def _read_json(path: Path) -> list[Row]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # several objects, one per line: a JSON-lines file named .json
            return _read_jsonl(path)
        raise DataError(f"{path} line {error.lineno}: invalid JSON: {error.msg} (column {error.colno})") from error
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of row objects, got {type(data).__name__}")
    rows = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            raise DataError(f"{path} row {index}: expected a JSON object, got {type(item).__name__}")
        rows.append(Row(str(path), index, item))
    return rows


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises its own exception types for corrupt files
        raise DataError(f"{path}: cannot read parquet file: {error}") from error
    return [Row(str(path), index, record) for index, record in enumerate(records)]


def _read_file(path: Path) -> list[Row]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"{path}: unsupported data file type {suffix!r}; use one of {', '.join(SUPPORTED_SUFFIXES)}")


def _read_hub(spec: str) -> list[Row]:
    name, _, split = spec.partition("@")
    try:
        import datasets
    except ImportError as error:
        raise DataError(f"{spec!r} is not a local file; loading hub datasets needs the `datasets` package") from error
    try:
        dataset = datasets.load_dataset(name, split=split or "train")
    except Exception as error:  # network, auth and missing-split errors all end up here
        raise DataError(f"cannot load hub dataset {name!r} split {split or 'train'!r}: {error}") from error
    return [Row(spec, index, _HubRow(dataset, index)) for index in range(len(dataset))]


def load_rows(spec: str | Path) -> list[Row]:
    """All rows of a data spec: a .jsonl / .json / .parquet file, a folder of them, or a hub ``name@split``.

    Raises DataError naming the file (and line) when something cannot be read.
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES)
        if not files:
            raise DataError(f"{path}: no {', '.join(SUPPORTED_SUFFIXES)} files in this folder")
        return [row for file in files for row in _read_file(file)]
    if "@" in str(spec):
        return _read_hub(str(spec))
    raise DataError(f"data file {path} does not exist (for a hub dataset write name@split, e.g. org/data@train)")


def _values(row: Row) -> Mapping[str, Any]:
    """The row's columns; a hub row is decoded once here rather than once per column read."""
    return row.data.decoded() if isinstance(row.data, _HubRow) else row.data


class RLDataset(torch.utils.data.Dataset):
    """Prompts for RL training, tokenized and padded for the actor and unexpanded for the rollout engine.

    ``dataset[i]`` is a dict:

    - ``input_ids``: LongTensor (max_prompt_length,), left-padded with the pad id; images expanded to their
      vision tokens.
    - ``attention_mask``: LongTensor (max_prompt_length,), 1 on real tokens.
    - ``position_ids``: LongTensor (4, max_prompt_length) for Qwen-VL models (row 0 text positions, rows 1-3
      m-rope t, h, w), (max_prompt_length,) for text-only models; 0 on padding.
    - ``raw_prompt_ids``: list[int], the prompt with one ``<|image_pad|>`` per image, unpadded (for vLLM).
    - ``multi_modal_data``: ``{"images": [PIL.Image, ...], "videos": [uint8 array (T, H, W, 3)],
      "video_metadata": [{"fps", "total_num_frames", "frames_indices"}]}`` (only the keys present) with images
      already at the processor's size; ``{}`` for text rows.
    - ``multi_modal_inputs``: the processor's tensors (``pixel_values``, ``image_grid_thw``, video ones);
      ``{}`` for text rows.
    - ``ground_truth``: the answer as a string.
    - ``row_columns``: ``{column: value}`` of the row's other columns (``data_source``...), for the reward function.

    Every row is checked while the dataset is built, before any model loads: columns and their types, empty
    prompts, marker counts, each image and video frame (size from the file header, and the file read through so
    that a truncated one fails: PNG checksums, JPEG decoded at 1/8 scale; video files from their metadata), and the
    expanded prompt length computed from those sizes (:mod:`easyr1.data.lengths`). The first bad row raises
    :class:`~easyr1.data.checks.RowError` naming ``file line N``; with ``skip_bad_rows`` bad rows are dropped
    instead, one line reports them, and after construction

    - ``skipped``: ``{reason: count}`` of the dropped rows (reasons as in ``RowError.reason``, e.g.
      ``"unreadable image"``, ``"missing column"``);
    - ``bad_rows``: ``[(Row, RowError), ...]``, each dropped row with its full message;
    - ``prompt_lengths``: the expanded prompt length of each item, in item order.
    """

    def __init__(
        self,
        data_files: str,
        tokenizer: Any,
        processor: Any = None,
        *,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        image_key: str = "images",
        video_key: str = "videos",
        image_dir: str | None = None,
        max_prompt_length: int = 512,
        format_prompt: str | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        filter_overlong_prompts: bool = True,
        video_fps: float = 2.0,
        video_max_frames: int = DEFAULT_MAX_FRAMES,
        video_max_pixels: int | None = None,
        video_max_duration: float | None = None,
        override_chat_template: str | None = None,
        model_config: Any = None,
        skip_bad_rows: bool = False,
    ) -> None:
        if max_prompt_length <= 0:
            raise DataError(f"max_prompt_length must be positive, got {max_prompt_length}")
        self.data_files = str(data_files)
        self.tokenizer = tokenizer
        self.processor = processor
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self.image_key = image_key
        self.video_key = video_key
        self.image_dir = Path(image_dir).expanduser() if image_dir else None
        self.max_prompt_length = int(max_prompt_length)
        self.video_fps = float(video_fps)
        self.video_limits = VideoLimits(
            fps=self.video_fps,
            max_frames=int(video_max_frames),
            max_duration=None if video_max_duration is None else float(video_max_duration),
        )
        self.template = load_format_prompt(format_prompt)
        self.chat_template = load_chat_template(override_chat_template)
        self.pad_token_id = pad_token_id(tokenizer)
        has_template = any(getattr(owner, "chat_template", None) for owner in (tokenizer, processor))
        if self.chat_template is None and not has_template:
            raise DataError(
                f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'the model')} has no chat template; "
                "use a chat/instruct model or add a chat_template to its tokenizer_config.json"
            )
        self.bounds: VisionBounds | None = None
        self.processor_bounds: VisionBounds | None = None  # the processor's own, used when it resizes again
        self.video_bounds: VisionBounds | None = None  # the frames' bounds: max_pixels lowered by video_max_pixels
        self.mrope: MRopeSettings | None = None
        self.model_config = model_config
        if processor is not None and getattr(processor, "image_processor", None) is not None:
            if model_config is None:  # the tokenizer's directory is the model's (tests build datasets this way)
                self.model_config = load_model_config(tokenizer.name_or_path)
            frames = family_of(self.model_config).pixel_bounds_frames
            self.bounds = vision_bounds(processor, min_pixels, max_pixels, frames=frames)
            self.processor_bounds = vision_bounds(processor, frames=frames)
            self.video_bounds = video_bounds(self.bounds, video_max_pixels)
            if is_mrope_config(self.model_config):
                self.mrope = MRopeSettings.from_model_config(self.model_config)

        self.rows = load_rows(self.data_files)
        if not self.rows:
            raise DataError(f"{self.data_files}: the dataset has no rows")
        # rows dropped by skip_bad_rows: how many per reason, and each row with its error
        self.skipped: dict[str, int] = {}
        self.bad_rows: list[tuple[Row, RowError]] = []
        self.prompt_lengths: list[int] = []  # expanded prompt length of each item, computed without pixels
        self.indices = self._usable_rows(filter_overlong_prompts, skip_bad_rows)

    @classmethod
    def from_config(
        cls, config: Any, data_files: str, tokenizer: Any, processor: Any = None, model_config: Any = None
    ) -> RLDataset:
        """Build from a ``DataConfig``-like object (attributes named like this class's keyword arguments)."""
        defaults = {
            "prompt_key": "prompt",
            "answer_key": "answer",
            "image_key": "images",
            "video_key": "videos",
            "image_dir": None,
            "max_prompt_length": 512,
            "format_prompt": None,
            "min_pixels": None,
            "max_pixels": None,
            "filter_overlong_prompts": True,
            "video_fps": 2.0,
            "video_max_frames": DEFAULT_MAX_FRAMES,
            "video_max_pixels": None,
            "video_max_duration": None,
            "override_chat_template": None,
            "skip_bad_rows": False,
        }
        options = {name: getattr(config, name, default) for name, default in defaults.items()}
        return cls(data_files, tokenizer, processor, model_config=model_config, **options)

    # ------------------------------------------------------------------ checks done once, up front

    def _usable_rows(self, filter_overlong: bool, skip_bad_rows: bool) -> list[int]:
        """Check every row and measure its prompt (vision tokens included) before any model loads.

        A bad row is an error naming it, or with ``skip_bad_rows`` a counted skip; an over-long prompt is dropped
        (``filter_overlong``, counted) or an error naming its token count and the two settings that fix it.
        """
        kept, overlong = [], []
        for index, row in enumerate(self.rows):
            try:
                length = self._measure(row)
            except RowError as error:
                if not skip_bad_rows:
                    raise
                self.bad_rows.append((row, error))
                self.skipped[error.reason] = self.skipped.get(error.reason, 0) + 1
                continue
            if length.total <= self.max_prompt_length:
                kept.append(index)
                self.prompt_lengths.append(length.total)
            elif filter_overlong:
                overlong.append(index)
            else:
                raise DataError(
                    f"{row.where}: the prompt is {length.total} tokens ({length.vision} of them for its "
                    f"images/videos), longer than data.max_prompt_length={self.max_prompt_length}; raise "
                    "data.max_prompt_length or lower data.max_pixels (or set data.filter_overlong_prompts=true to "
                    "drop such rows)"
                )
        if self.bad_rows:
            print(self._skip_report())
        if overlong:
            shown = ", ".join(self.rows[i].where for i in overlong[:_FILTER_REPORT_ROWS])
            more = ", ..." if len(overlong) > _FILTER_REPORT_ROWS else ""
            print(
                f"[data] filtered {len(overlong)} of {len(self.rows)} prompts longer than "
                f"max_prompt_length={self.max_prompt_length} tokens in {self.data_files} ({shown}{more})"
            )
        if not kept:
            first = f"; the first bad row: {self.bad_rows[0][1]}" if self.bad_rows else ""
            raise DataError(
                f"{self.data_files}: no usable rows ({len(self.bad_rows)} bad, {len(overlong)} longer than "
                f"max_prompt_length={self.max_prompt_length} tokens); fix the data, raise data.max_prompt_length or "
                f"lower data.max_pixels{first}"
            )
        return kept

    def _skip_report(self) -> str:
        """One line: how many rows were skipped, the first few with their reason and place, counts per reason."""
        single_file = Path(self.data_files).expanduser().is_file()

        def place(row: Row) -> str:
            # within one file "line 7" is enough; in a folder of files the file name matters too
            return f"{'line' if row.line_based else 'row'} {row.index}" if single_file else row.where

        shown = ", ".join(f"{error.reason} ({place(row)})" for row, error in self.bad_rows[:_FILTER_REPORT_ROWS])
        more = ", ..." if len(self.bad_rows) > _FILTER_REPORT_ROWS else ""
        counts = ", ".join(f"{reason} {count}" for reason, count in self.skipped.items())
        return (
            f"[data] skipped {len(self.bad_rows)} of {len(self.rows)} rows in {self.data_files}: {shown}{more} "
            f"(by reason: {counts})"
        )

    def _measure(self, row: Row) -> PromptLength:
        """Check one row (columns, types, markers, every image / frame file) and compute its expanded length."""
        data = _values(row)
        where = row.where
        check_columns(data, where, {"prompt_key": self.prompt_key, "answer_key": self.answer_key})
        prompt = check_prompt(data, self.prompt_key, where)
        check_answer(data, self.answer_key, where)
        images = vision_values(data, self.image_key, "image", where)
        videos = vision_values(data, self.video_key, "video", where)
        chat = self._chat_text(prompt, len(images), len(videos), where)
        base_dir = self._base_dir(row)
        image_sizes = [
            processed_size(*image_size(value, base_dir, where, verify=True), self.bounds, self.processor_bounds)
            for value in images
        ]
        video_shapes = [video_shape(value, base_dir, where, self.video_limits, self.video_bounds) for value in videos]
        family = family_of(self.model_config)
        image_text = family.image_text(self.processor) if family.image_text is not None and images else None
        return expanded_length(
            self.tokenizer,
            self.processor,
            chat,
            image_sizes,
            video_shapes,
            self.bounds,
            where,
            image_text=image_text,
            image_tokens=family.image_tokens,
            video_text=family.video_placeholder,
        )

    # ------------------------------------------------------------------ building one item

    def _base_dir(self, row: Row) -> Path | None:
        return self.image_dir if self.image_dir is not None else row.base_dir

    def _chat_text(self, prompt: str, num_images: int, num_videos: int, where: str) -> str:
        """The chat-formatted prompt text with one placeholder per image and per video."""
        if (num_images or num_videos) and self.bounds is None:
            raise RowError(
                where,
                "vision input for a text model",
                "the row has images or videos but the model has no image processor (a text-only model)",
                "use a vision-language model or drop the images",
            )
        messages = build_messages(render_prompt(self.template, prompt), num_images, num_videos, where)
        owner = self.processor if self.processor is not None else self.tokenizer
        return owner.apply_chat_template(
            messages, chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
        )

    def _encode(
        self, row: Row, chat: str, image_values: list[Any], video_values: list[Any]
    ) -> tuple[torch.Tensor, dict[str, Any], dict[str, torch.Tensor]]:
        """Expanded ids (L,), the multi-modal data for the rollout engine and the processor tensors."""
        base_dir = self._base_dir(row)
        images = [resize_image(load_image(value, base_dir, row.where), self.bounds) for value in image_values]
        sampled = [load_video(v, base_dir, row.where, self.video_limits, self.video_bounds) for v in video_values]
        videos = [frames_to_array(video.frames) for video in sampled]
        kwargs: dict[str, Any] = {}
        if videos:
            kwargs["do_sample_frames"] = False  # frames are already sampled (at video_fps, or thinned to the cap)
            kwargs["video_metadata"] = [
                {
                    "fps": video.fps,
                    "total_num_frames": len(video.frames),
                    "frames_indices": list(range(len(video.frames))),
                }
                for video in sampled
            ]
        outputs = self.processor(
            text=[chat],
            images=images or None,
            videos=videos or None,
            add_special_tokens=False,
            return_tensors="pt",
            **kwargs,
        )
        input_ids = outputs["input_ids"][0]
        # per-token outputs, not vision inputs: token types (Gemma 3's token_type_ids) are computed from the ids by
        # the forward that needs them (Family.token_types), whatever layout (padded, packed) the ids then have
        dropped = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
        inputs = {key: value for key, value in outputs.items() if key not in dropped}
        data: dict[str, Any] = {}
        if images:
            data["images"] = images
        if videos:
            data["videos"] = videos
            data["video_metadata"] = kwargs["video_metadata"]  # the rollout engine needs the frames' timing too
        return input_ids, data, inputs

    def __len__(self) -> int:
        return len(self.indices)

    def row(self, index: int) -> Row:
        """The source row behind item ``index`` (after filtering)."""
        return self.rows[self.indices[index]]

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.row(index)
        data = _values(row)
        image_values = vision_values(data, self.image_key, "image", row.where)
        video_values = vision_values(data, self.video_key, "video", row.where)
        prompt = check_prompt(data, self.prompt_key, row.where)
        chat = self._chat_text(prompt, len(image_values), len(video_values), row.where)
        raw_prompt_ids = self.tokenizer.encode(chat, add_special_tokens=False)
        multi_modal_data: dict[str, Any] = {}
        multi_modal_inputs: dict[str, torch.Tensor] = {}
        if image_values or video_values:
            input_ids, multi_modal_data, multi_modal_inputs = self._encode(row, chat, image_values, video_values)
            if not video_values:
                self._check_expansion(row, input_ids, raw_prompt_ids)
        else:
            input_ids = torch.tensor(raw_prompt_ids, dtype=torch.long)

        length = int(input_ids.shape[0])
        if length > self.max_prompt_length:
            raise DataError(
                f"{row.where}: the prompt is {length} tokens, longer than max_prompt_length={self.max_prompt_length}; "
                "raise data.max_prompt_length, lower data.max_pixels, or set data.filter_overlong_prompts=true"
            )
        padding = self.max_prompt_length - length
        padded_ids = torch.cat([torch.full((padding,), self.pad_token_id, dtype=torch.long), input_ids.long()])
        attention_mask = torch.cat([torch.zeros(padding, dtype=torch.long), torch.ones(length, dtype=torch.long)])
        try:
            position_ids = prompt_position_ids(
                padded_ids,
                attention_mask,
                self.mrope,
                image_grid_thw=multi_modal_inputs.get("image_grid_thw"),
                video_grid_thw=multi_modal_inputs.get("video_grid_thw"),
                second_per_grid_ts=multi_modal_inputs.get("second_per_grid_ts"),
            )
        except ValueError as error:
            raise DataError(f"{row.where}: {error}") from error
        adapt = family_of(self.model_config).forward_vision_inputs if multi_modal_inputs else None
        if adapt is not None:  # positions above read the processor's own grids; the model's forward gets these
            multi_modal_inputs = adapt(input_ids, multi_modal_inputs, self.mrope)
        return {
            "input_ids": padded_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "raw_prompt_ids": raw_prompt_ids,
            "multi_modal_data": multi_modal_data,
            "multi_modal_inputs": multi_modal_inputs,
            "ground_truth": check_answer(data, self.answer_key, row.where),
            # the item's position, so a prompt still generating when a checkpoint is written can be read again
            "dataset_index": torch.tensor(index, dtype=torch.long),
            # for the reward function, which receives them by name (workers/reward.py)
            "row_columns": {
                name: value
                for name, value in data.items()
                if name not in (self.prompt_key, self.answer_key, self.image_key, self.video_key)
            },
        }

    def _check_expansion(self, row: Row, input_ids: torch.Tensor, raw_prompt_ids: list[int]) -> None:
        """The processor's expanded ids must correspond to the unexpanded ids the engine gets, by the family's rule
        (Qwen-VL: each run of image pads collapsed to one pad gives them back)."""
        family = family_of(self.model_config)
        if not family.expansion_matches(input_ids.tolist(), raw_prompt_ids, self.processor, self.model_config):
            raise DataError(
                f"{row.where}: the processor's prompt ids do not match the tokenizer's; the chat template or the "
                f"image placeholder tokens of this model are not the ones its family ({family.name}) uses"
            )
