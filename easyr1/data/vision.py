"""Vision inputs of a dataset row: decode images and video frames, convert to RGB, resize to the model's grid.

Images are resized once, here, to exactly the size the Qwen-VL image processor would choose: both sides a
multiple of patch_size * merge_size, the pixel count inside [min_pixels, max_pixels], the aspect ratio kept.
The processor's own resize is then a no-op, so the images handed to the rollout engine and the pixel values
the actor trains on come from the same pixels.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from easyr1.data.checks import RowError
from easyr1.errors import DataError


_MAX_ASPECT_RATIO = 200  # the Qwen-VL processors refuse more extreme images
_VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".gif")
_FRAME_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class VisionBounds:
    """How images are sized: sides a multiple of ``factor``, pixel count in [min_pixels, max_pixels]."""

    factor: int
    min_pixels: int
    max_pixels: int

    def __post_init__(self) -> None:
        if self.min_pixels > self.max_pixels:
            raise DataError(f"min_pixels ({self.min_pixels}) is larger than max_pixels ({self.max_pixels})")
        if self.max_pixels < self.factor * self.factor:
            raise DataError(
                f"max_pixels ({self.max_pixels}) is smaller than one {self.factor}x{self.factor} vision patch; "
                f"raise it to at least {self.factor * self.factor}"
            )


def vision_bounds(processor: Any, min_pixels: int | None = None, max_pixels: int | None = None) -> VisionBounds:
    """The image size bounds for ``processor``, narrowed to the dataset's ``min_pixels`` / ``max_pixels``.

    Using the overlap of both ranges keeps the processor's resize a no-op. Raises DataError when they do not
    overlap, naming the value to change.
    """
    image_processor = getattr(processor, "image_processor", processor)
    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    size = getattr(image_processor, "size", None) or {}
    proc_min = int(size.get("shortest_edge") or getattr(image_processor, "min_pixels", None) or factor * factor)
    proc_max = int(size.get("longest_edge") or getattr(image_processor, "max_pixels", None) or 1 << 62)
    low = proc_min if min_pixels is None else max(int(min_pixels), proc_min)
    high = proc_max if max_pixels is None else min(int(max_pixels), proc_max)
    if low > high:
        if min_pixels is not None and int(min_pixels) > proc_max:
            raise DataError(
                f"data min_pixels={min_pixels} is larger than the image processor's maximum of {proc_max} pixels "
                f"(preprocessor size.longest_edge); set min_pixels to at most {proc_max}"
            )
        raise DataError(
            f"data max_pixels={max_pixels} is smaller than the image processor's minimum of {proc_min} pixels "
            f"(preprocessor size.shortest_edge); set max_pixels to at least {proc_min}"
        )
    return VisionBounds(factor=factor, min_pixels=low, max_pixels=high)


def smart_resize(height: int, width: int, bounds: VisionBounds) -> tuple[int, int]:
    """The Qwen-VL resize rule: round both sides to the factor, then scale into the pixel range."""
    factor = bounds.factor
    if max(height, width) / min(height, width) > _MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is above {_MAX_ASPECT_RATIO}")
    new_height = max(factor, round(height / factor) * factor)
    new_width = max(factor, round(width / factor) * factor)
    if new_height * new_width > bounds.max_pixels:
        scale = math.sqrt(height * width / bounds.max_pixels)
        new_height = max(factor, math.floor(height / scale / factor) * factor)
        new_width = max(factor, math.floor(width / scale / factor) * factor)
    elif new_height * new_width < bounds.min_pixels:
        scale = math.sqrt(bounds.min_pixels / (height * width))
        new_height = math.ceil(height * scale / factor) * factor
        new_width = math.ceil(width * scale / factor) * factor
    return new_height, new_width


def target_size(height: int, width: int, bounds: VisionBounds) -> tuple[int, int]:
    """A (height, width) that :func:`smart_resize` maps to itself, reached from the image's own size.

    One application usually suffices; near-equal bounds and odd aspect ratios can need a second one (scaling up
    to reach min_pixels can overshoot max_pixels), and the processor would apply it again.
    """
    size = (height, width)
    for _ in range(8):
        new_size = smart_resize(*size, bounds)
        if new_size == size:
            return size
        size = new_size
    return size


def processed_size(height: int, width: int, bounds: VisionBounds, processor_bounds: VisionBounds) -> tuple[int, int]:
    """The (height, width) the image processor works at for an image of this size: the dataset resizes it to
    :func:`target_size` within ``bounds``, then the processor applies its own rule once with its own bounds.

    The second step is a no-op unless ``bounds`` are so narrow that no size is a fixed point (e.g. max_pixels
    below twice min_pixels with an odd aspect ratio); the token count must follow it all the same.
    """
    return smart_resize(*target_size(height, width, bounds), processor_bounds)


def resize_image(image: Image.Image, bounds: VisionBounds) -> Image.Image:
    """``image`` as RGB at its :func:`target_size` (bicubic, like the processors); unchanged if already there."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    height, width = target_size(image.height, image.width, bounds)
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
    return image


def vision_token_count(height: int, width: int, bounds: VisionBounds) -> int:
    """Number of LLM tokens an image of this (already resized) size becomes."""
    return (height // bounds.factor) * (width // bounds.factor)


def _resolve(path: str, base_dir: Path | None) -> Path:
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or base_dir is None:
        return candidate
    return base_dir / candidate


# What PIL raises for files it cannot read: unknown format (UnidentifiedImageError is an OSError), truncated
# data, bad headers (SyntaxError, ValueError) and decompression bombs.
_UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_PATH_FIX = "fix the path (relative paths start at data.image_dir, or at the data file's folder when it is unset)"


def _open_image(value: Any, base_dir: Path | None, where: str) -> Image.Image:
    """Open one image value lazily (header only); RowError for a wrong type or a missing file."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(value)))
    if isinstance(value, Mapping):
        if value.get("bytes") is not None:
            return _open_image(value["bytes"], base_dir, where)
        if value.get("path"):
            return _open_image(str(value["path"]), base_dir, where)
        raise RowError(
            where,
            "bad image value",
            f"an image given as a dict needs a 'bytes' or 'path' entry, got keys {sorted(value)}",
            "fix the image column",
        )
    if isinstance(value, (str, Path)):
        path = _resolve(str(value), base_dir)
        if not path.is_file():
            problem = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise RowError(where, "image not found", f"cannot read image {value!r}: {path} {problem}", _PATH_FIX)
        return Image.open(path)
    raise RowError(
        where,
        "bad image value",
        f"an image must be a path, bytes, a {{'bytes', 'path'}} dict or a PIL image, not {type(value).__name__}",
        "fix the image column",
    )


def _unreadable(value: Any, where: str, error: BaseException) -> RowError:
    if isinstance(error, UnidentifiedImageError):
        # Pillow's own message only repeats the file name
        error = "not an image file Pillow can read (empty, zero-size, or of an unknown format)"
    return RowError(
        where, "unreadable image", f"cannot read image {_describe(value)}: {error}", "replace it with a valid image"
    )


def load_image(value: Any, base_dir: Path | None, where: str) -> Image.Image:
    """Decode an image (path relative to ``base_dir``, bytes, {"bytes", "path"} dict or PIL) as an RGB image.

    ``where`` names the row in error messages (:class:`~easyr1.data.checks.RowError`).
    """
    try:
        image = _open_image(value, base_dir, where)
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")
    except RowError:
        raise
    except _UNREADABLE as error:
        raise _unreadable(value, where, error) from error


def _check_integrity(image: Image.Image) -> None:
    """Read all of an opened image file so that a truncated or corrupt one fails now, as cheaply as its format
    allows: a PNG's chunk checksums without inflating them, a JPEG decoded at 1/8 scale (libjpeg skips most of
    the inverse DCT), any other format decoded fully."""
    if image.format == "PNG":
        image.verify()
    elif image.format == "JPEG":
        image.draft(None, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
    else:
        image.load()


def image_size(value: Any, base_dir: Path | None, where: str, verify: bool = False) -> tuple[int, int]:
    """(height, width) of an image from its file header, without decoding its pixels.

    ``verify`` also reads the whole file (see :func:`_check_integrity`) so that a truncated file fails here, while
    loading the data, and not in the middle of training. In-memory PIL images are taken as they are. Raises
    RowError for a missing, unreadable, empty or zero-size image and for aspect ratios the processors refuse.
    """
    try:
        image = _open_image(value, base_dir, where)
        height, width = image.height, image.width
        if height == 0 or width == 0:
            raise RowError(
                where,
                "zero-size image",
                f"image {_describe(value)} has zero size ({width}x{height} pixels)",
                "replace it with a real image",
            )
        check_aspect_ratio(height, width, f"image {_describe(value)}", where)
        if verify and not isinstance(value, Image.Image):
            _check_integrity(image)
    except RowError:
        raise
    except _UNREADABLE as error:
        raise _unreadable(value, where, error) from error
    return height, width


def check_aspect_ratio(height: int, width: int, what: str, where: str) -> None:
    """RowError when ``what`` (an image or video) is more elongated than the Qwen-VL processors accept."""
    ratio = max(height, width) / min(height, width)
    if ratio > _MAX_ASPECT_RATIO:
        raise RowError(
            where,
            "extreme aspect ratio",
            f"{what} is {width}x{height} pixels, an aspect ratio of {ratio:.0f} (the processors accept at most "
            f"{_MAX_ASPECT_RATIO})",
            "crop or pad it",
        )


def _video_source(value: Any, base_dir: Path | None, where: str) -> list[Any] | Path:
    """A video's frame values (list or folder of images), or the path of a video file; RowError otherwise."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = list(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        frames: list[Any] = list(value)
    elif isinstance(value, (str, Path)):
        path = _resolve(str(value), base_dir)
        if path.is_dir():
            frames = sorted(p for p in path.iterdir() if p.suffix.lower() in _FRAME_SUFFIXES)
        elif path.is_file() and path.suffix.lower() in _VIDEO_SUFFIXES:
            return path
        elif not path.exists():
            raise RowError(where, "video not found", f"video {path} does not exist", _PATH_FIX)
        else:
            raise RowError(
                where,
                "bad video value",
                f"video {path} is neither a video file ({', '.join(_VIDEO_SUFFIXES)}) nor a folder of frames",
                "give a video file, a folder of frame images or a list of frame images",
            )
    else:
        raise RowError(
            where,
            "bad video value",
            f"a video must be a list of frames, a folder of frames or a video file, not {type(value).__name__}",
            "fix the video column",
        )
    if not frames:
        raise RowError(
            where,
            "video without frames",
            f"video {_describe(value)} has no frames",
            f"give it at least one frame ({', '.join(_FRAME_SUFFIXES)} files in a folder, or a list of images)",
        )
    return frames


def load_video(value: Any, base_dir: Path | None, where: str, fps: float) -> list[Image.Image]:
    """Frames of a video as RGB images: a list of frame images, a directory of frames, or a video file.

    Video files are decoded at ``fps`` frames per second with PyAV (a dependency of qwen-vl-utils), or with
    qwen-vl-utils' own readers when PyAV is missing.
    """
    source = _video_source(value, base_dir, where)
    if isinstance(source, Path):
        return _decode_video_file(source, where, fps)
    return [load_image(frame, base_dir, where) for frame in source]


def video_shape(
    value: Any, base_dir: Path | None, where: str, fps: float, bounds: VisionBounds
) -> tuple[int, int, int]:
    """(frames, height, width) of a video as the dataset hands it to the processor: frames resized to
    :func:`target_size`. Frame lists and folders are measured from image headers (each frame's file integrity
    checked like an image's); video files are decoded, which is the only way to count their sampled frames.
    RowError when the frames cannot be read or do not share one size.
    """
    source = _video_source(value, base_dir, where)
    if isinstance(source, Path):
        frames = _decode_video_file(source, where, fps)
        check_aspect_ratio(frames[0].height, frames[0].width, f"video {_describe(value)}", where)
        return (len(frames), *target_size(frames[0].height, frames[0].width, bounds))
    sizes = [image_size(frame, base_dir, where, verify=True) for frame in source]
    targets = {target_size(height, width, bounds) for height, width in sizes}
    if len(targets) > 1:
        shown = ", ".join(f"{width}x{height}" for height, width in sorted(set(sizes))[:4])
        raise RowError(
            where,
            "video frames differ in size",
            f"the frames of video {_describe(value)} have different sizes ({shown})",
            "give all frames of a video the same size",
        )
    return (len(source), *targets.pop())


def _decode_video_file(path: Path, where: str, fps: float) -> list[Image.Image]:
    try:
        frames = _decode_with_pyav(path, fps)
    except ImportError:
        frames = _decode_with_qwen_vl_utils(path, where, fps)
    except Exception as error:  # container and codec errors come in many library-specific types
        raise RowError(
            where, "unreadable video", f"cannot decode video {path}: {error}", "replace it with a valid video"
        ) from error
    if not frames:
        raise RowError(where, "video without frames", f"video {path} has no frames", "replace or remove it")
    return frames


def sample_times(duration: float, fps: float) -> list[float]:
    """Times (seconds) of the frames kept from a ``duration``-second video at ``fps``: an even count (Qwen-VL
    groups frames in pairs), at least two."""
    count = max(2, int(duration * fps) + 1)
    count += count % 2
    return [min(index / fps, duration) for index in range(count)]


def _decode_with_pyav(path: Path, fps: float) -> list[Image.Image]:
    """Frames at ``fps`` via PyAV (each kept time takes the nearest decoded frame)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded = [(frame.time, frame.to_image()) for frame in container.decode(stream)]
    if not decoded:
        return []
    rate = float(stream.average_rate or fps)
    times = [time if time is not None else index / rate for index, (time, _) in enumerate(decoded)]
    start = times[0]
    picks = [
        min(range(len(times)), key=lambda i: abs(times[i] - start - target))
        for target in sample_times(times[-1] - start, fps)
    ]
    return [decoded[index][1].convert("RGB") for index in picks]


def _decode_with_qwen_vl_utils(path: Path, where: str, fps: float) -> list[Image.Image]:
    """Frames via qwen-vl-utils (needs torchvision's video reader, decord or torchcodec)."""
    try:
        from qwen_vl_utils import fetch_video

        frames = fetch_video({"video": str(path), "fps": fps})
    except Exception as error:  # decoders fail in many library-specific ways; report them all the same way
        raise RowError(
            where,
            "unreadable video",
            f"cannot decode video {path}: {error}",
            "install PyAV (pip install av) or give the video as a folder or list of frame images",
        ) from error
    # qwen-vl-utils returns a (T, C, H, W) tensor of 0-255 values
    array = np.asarray(frames.permute(0, 2, 3, 1).float().clamp(0, 255).round().byte())
    return [Image.fromarray(frame) for frame in array]


def frames_to_array(frames: Sequence[Image.Image]) -> np.ndarray:
    """Stack equally sized RGB frames into a (T, H, W, 3) uint8 array, the video format processors take."""
    return np.stack([np.asarray(frame, dtype=np.uint8) for frame in frames])


def _describe(value: Any) -> str:
    if isinstance(value, (str, Path)):
        return repr(str(value))
    if isinstance(value, Mapping) and value.get("path"):
        return repr(str(value["path"]))
    if isinstance(value, (list, tuple)):
        return f"(a list of {len(value)})"
    return f"({type(value).__name__})"
