"""The ``data`` section: where the prompts come from and how they become model inputs, with its value checks."""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.config.fields import option
from easyr1.config.rules import (
    AT_LEAST_ONE,
    AT_LEAST_ONE_OR_NULL,
    MINUS_ONE_OR_AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_OR_NULL,
)


@dataclass
class DataConfig:
    """Where the prompts come from and how they are turned into model inputs."""

    train_files: str = option(
        "hiyouga/geometry3k@train",
        "training data: a local .jsonl/.json/.parquet file or directory, or 'hub_name@split'",
    )
    val_files: str = option("hiyouga/geometry3k@test", "validation data, in the same forms as train_files")
    prompt_key: str = option("problem", "row key of the prompt text; '<image>' / '<video>' mark the vision inputs")
    answer_key: str = option("answer", "row key of the ground truth given to the reward function")
    image_key: str = option("images", "row key of the images (paths, bytes or PIL images)")
    video_key: str = option("videos", "row key of the videos (paths or lists of frames)")
    image_dir: str | None = option(None, "directory of relative image/video paths (null: the data file's directory)")
    video_fps: float = option(2.0, "frames per second sampled from videos")
    video_max_frames: int = option(
        768,
        "most frames taken from one video: a longer video file's frames are thinned to this many, evenly spread "
        "(its recorded fps lowered to match); a list or folder of more frames is a bad row (qwen-vl-utils' "
        "FPS_MAX_FRAMES)",
    )
    video_max_pixels: int | None = option(
        None,
        "largest video frame area in pixels after resizing, below max_pixels (null: 768 vision tokens' worth, "
        "qwen-vl-utils' default: 602112 for Qwen2/2.5-VL, 786432 for Qwen3-VL)",
    )
    video_max_duration: float | None = option(
        None, "longest video file in seconds; a longer one is a bad row (null: no limit, as in qwen-vl-utils)"
    )
    max_prompt_length: int = option(512, "longest prompt in tokens, vision tokens included")
    max_response_length: int = option(512, "most tokens generated per response")
    rollout_batch_size: int = option(512, "prompts per training step; each is sampled worker.rollout.n times")
    mini_rollout_batch_size: int | None = option(
        None, "prompts per generation round when online filtering refills a step (null: rollout_batch_size)"
    )
    val_batch_size: int = option(-1, "prompts per validation generation round (-1: the whole validation set)")
    format_prompt: str | None = option(None, "Jinja template (.jinja file) around each prompt: '{{ content }}'")
    override_chat_template: str | None = option(None, "chat template used instead of the tokenizer's (file path)")
    shuffle: bool = option(True, "shuffle the training data every epoch")
    seed: int = option(1, "seed of the training data order")
    min_pixels: int | None = option(262144, "smallest image area in pixels after resizing (null: processor default)")
    max_pixels: int | None = option(4194304, "largest image area in pixels after resizing (null: processor default)")
    filter_overlong_prompts: bool = option(True, "drop prompts longer than max_prompt_length when loading the data")
    skip_bad_rows: bool = option(
        False, "drop rows that cannot be used (counted and reported) instead of stopping with an error"
    )
    filter_overlong_prompts_workers: int = option(
        16,
        "EasyR1's process count for its overlong-prompt filter; here lengths are measured in the driver from the "
        "tokenizer and image headers (about 0.3 ms a row), with no process pool",
        compatibility_only=True,
    )
    dataloader_num_workers: int = option(0, "worker processes of the training dataloader (0: load in the driver)")


# Value rules of single keys, relative to ``data``.
DATA_RANGES = {
    "max_prompt_length": AT_LEAST_ONE,
    "max_response_length": AT_LEAST_ONE,
    "rollout_batch_size": AT_LEAST_ONE,
    "mini_rollout_batch_size": AT_LEAST_ONE_OR_NULL,
    "val_batch_size": MINUS_ONE_OR_AT_LEAST_ONE,
    "video_fps": POSITIVE,
    "video_max_frames": (lambda v: v >= 2, "at least 2 (Qwen-VL takes frames in pairs)"),
    "video_max_pixels": AT_LEAST_ONE_OR_NULL,
    "video_max_duration": POSITIVE_OR_NULL,
    "min_pixels": AT_LEAST_ONE_OR_NULL,
    "max_pixels": AT_LEAST_ONE_OR_NULL,
    "filter_overlong_prompts_workers": AT_LEAST_ONE,
    "dataloader_num_workers": NON_NEGATIVE,
}


def check_data_pairs(data: DataConfig, problems: list[str]) -> None:
    """Pairs of ``data`` values in the wrong order."""
    if data.min_pixels is not None and data.max_pixels is not None and data.min_pixels > data.max_pixels:
        problems.append(f"data.min_pixels={data.min_pixels} is larger than data.max_pixels={data.max_pixels}")
    if data.min_pixels is not None and data.video_max_pixels is not None and data.min_pixels > data.video_max_pixels:
        problems.append(
            f"data.min_pixels={data.min_pixels} is larger than data.video_max_pixels={data.video_max_pixels}"
        )
