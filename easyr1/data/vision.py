"""Vision inputs of a dataset row: decode images and video frames, convert to RGB, resize to the model's grid.

Image files are opened only as PNG, JPEG, WebP, GIF, BMP or TIFF. Video files are read through
:mod:`easyr1.data.video_file`: measured from their metadata, and only the sampled frames decoded, at their target
size.

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
from easyr1.data.video_file import (
    DEFAULT_FRAME_TOKENS,
    VideoFileInfo,
    VideoLimits,
    decode_frames,
    read_video_info,
    video_sampling,
)
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


def vision_bounds(
    processor: Any, min_pixels: int | None = None, max_pixels: int | None = None, frames: int = 1
) -> VisionBounds:
    """The image size bounds for ``processor``, narrowed to the dataset's ``min_pixels`` / ``max_pixels``; sides a
    multiple of patch size x merge size (1 for a tiling processor, which has no patch grid).

    Using the overlap of both ranges keeps the processor's resize a no-op. ``frames``: how many frames the
    processor's own bounds count (``Family.pixel_bounds_frames``; GLM-4.1V's bound a temporal patch of two copies
    of the image), so its bounds are divided by it to bound one image. Raises DataError when the ranges do not
    overlap, naming the value to change.
    """
    image_processor = getattr(processor, "image_processor", processor)
    patch, merge = getattr(image_processor, "patch_size", None), getattr(image_processor, "merge_size", None)
    # A processor without patch merging resizes every image to one fixed size (Gemma 3), or cuts tiles from whatever
    # size it gets (InternVL's GotOcr2 processor): the sides need no rounding, only the pixel count is bounded.
    factor = int(patch) * int(merge) if patch is not None and merge is not None else 1
    size = getattr(image_processor, "size", None) or {}
    proc_min = int(size.get("shortest_edge") or getattr(image_processor, "min_pixels", None) or factor * factor)
    proc_max = int(size.get("longest_edge") or getattr(image_processor, "max_pixels", None) or 1 << 62)
    proc_min, proc_max = -(-proc_min // frames), proc_max // frames
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


# The formats image files are opened as: those the processors' users send. Pillow would otherwise try every format
# it knows, some through outside programs (EPS / PostScript runs Ghostscript) or rarely used parsers.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def _open_as_allowed_format(source: Path | io.BytesIO, value: Any, where: str) -> Image.Image:
    """``Image.open`` limited to :data:`IMAGE_FORMATS`; a file of another format Pillow knows is a RowError that
    names that format (found from the file's first bytes, nothing parsed)."""
    try:
        return Image.open(source, formats=IMAGE_FORMATS)
    except UnidentifiedImageError:
        found = _format_of(source)
        if found is None:
            raise
        raise RowError(
            where,
            "unsupported image format",
            f"image {_describe(value)} is in {found} format; images are read only as {', '.join(IMAGE_FORMATS)}",
            "convert it to PNG or JPEG",
        ) from None


def _format_of(source: Path | io.BytesIO) -> str | None:
    """The name of the Pillow format whose signature the file starts with (its plugin's check of the first 16
    bytes, as ``Image.open`` does), or None."""
    if isinstance(source, io.BytesIO):
        prefix = source.getvalue()[:16]
    else:
        with open(source, "rb") as file:
            prefix = file.read(16)
    Image.init()
    for name in Image.ID:
        accept = Image.OPEN[name][1]
        if name in IMAGE_FORMATS or accept is None:
            continue
        try:
            if accept(prefix):
                return name
        except Exception:  # some signature checks fail on short files instead of answering no
            continue
    return None


def _open_image(value: Any, base_dir: Path | None, where: str) -> Image.Image:
    """Open one image value lazily (header only) as one of :data:`IMAGE_FORMATS`; RowError for a wrong type, a
    missing file or another format. PIL images are taken as they are."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _open_as_allowed_format(io.BytesIO(bytes(value)), value, where)
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
        return _open_as_allowed_format(path, value, where)
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


def video_bounds(bounds: VisionBounds, max_pixels: int | None) -> VisionBounds:
    """The size bounds of video frames: the image bounds with the largest area lowered to ``max_pixels``
    (data.video_max_pixels; null: qwen-vl-utils' default of 768 vision tokens a frame, never below min_pixels)."""
    if max_pixels is None:
        cap = max(DEFAULT_FRAME_TOKENS * bounds.factor * bounds.factor, bounds.min_pixels)
    elif max_pixels < bounds.min_pixels:
        raise DataError(
            f"data.video_max_pixels={max_pixels} is smaller than the smallest frame area of {bounds.min_pixels} "
            "pixels (data.min_pixels, or the image processor's minimum); raise video_max_pixels or lower min_pixels"
        )
    else:
        cap = max_pixels
    return VisionBounds(factor=bounds.factor, min_pixels=bounds.min_pixels, max_pixels=min(bounds.max_pixels, cap))


@dataclass(frozen=True)
class VideoShape:
    """A video as the processor gets it: ``frames`` frames of ``height`` x ``width``, ``fps`` frames a second (the
    rate recorded in its metadata)."""

    frames: int
    height: int
    width: int
    fps: float


@dataclass(frozen=True)
class SampledVideo:
    """A video's kept frames, RGB at their target size, and the rate they were kept at."""

    frames: list[Image.Image]
    fps: float


def video_shape(
    value: Any, base_dir: Path | None, where: str, limits: VideoLimits, bounds: VisionBounds
) -> VideoShape:
    """The :class:`VideoShape` of a video as the dataset hands it to the processor: frames resized to
    :func:`target_size` within ``bounds`` (see :func:`video_bounds`), sampled as ``limits`` say.

    Frame lists and folders are measured from image headers (each frame's file integrity checked like an
    image's); video files from their container's metadata and first frame (:func:`read_video_info`), in about a
    millisecond whatever their length. RowError when the frames cannot be read, differ in size, or break a cap of
    ``limits``: a file longer than ``max_duration``, a list of more than ``max_frames`` frames (a file's frames are
    thinned to ``max_frames`` instead, as its frame rate allows).
    """
    source = _video_source(value, base_dir, where)
    if isinstance(source, Path):
        info = _video_info(source, where)
        check_aspect_ratio(info.height, info.width, f"video {_describe(value)}", where)
        if limits.max_duration is not None and info.duration > limits.max_duration:
            raise RowError(
                where,
                "video too long",
                f"video {source} lasts {info.duration:.1f} s, longer than data.video_max_duration="
                f"{limits.max_duration:g} s",
                "cut it into shorter clips or raise data.video_max_duration",
            )
        times, fps = video_sampling(info.span, limits)
        return VideoShape(len(times), *target_size(info.height, info.width, bounds), fps)
    _check_frame_count(len(source), value, where, limits)
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
    return VideoShape(len(source), *targets.pop(), limits.fps)


def load_video(
    value: Any, base_dir: Path | None, where: str, limits: VideoLimits, bounds: VisionBounds
) -> SampledVideo:
    """The frames of a video (a list of frame images, a folder of frames, or a video file) as RGB images at their
    :func:`target_size` within ``bounds``: as many and as large as :func:`video_shape` measured.

    A video file's frames are the decoded frames nearest the sampled times, each converted and resized as it is
    decoded (:func:`~easyr1.data.video_file.decode_frames`); frame images are resized one by one as they load.
    """
    source = _video_source(value, base_dir, where)
    if isinstance(source, Path):
        info = _video_info(source, where)
        times, fps = video_sampling(info.span, limits)
        try:
            frames = decode_frames(source, info, times, target_size(info.height, info.width, bounds))
        except Exception as error:  # container and codec errors come in many library-specific types
            raise _unreadable_video(source, where, error) from error
        return SampledVideo(frames, fps)
    return SampledVideo([resize_image(load_image(frame, base_dir, where), bounds) for frame in source], limits.fps)


def _check_frame_count(count: int, value: Any, where: str, limits: VideoLimits) -> None:
    if count > limits.max_frames:
        raise RowError(
            where,
            "too many video frames",
            f"video {_describe(value)} has {count} frames, more than data.video_max_frames={limits.max_frames}",
            "give fewer frames (a list or folder of frames is used as it is) or raise data.video_max_frames",
        )


def _video_info(path: Path, where: str) -> VideoFileInfo:
    try:
        return read_video_info(path)
    except ImportError as error:
        raise RowError(
            where,
            "unreadable video",
            f"cannot decode video {path}: PyAV is not installed",
            "install PyAV (pip install av) or give the video as a folder or list of frame images",
        ) from error
    except Exception as error:  # container and codec errors come in many library-specific types
        raise _unreadable_video(path, where, error) from error


def _unreadable_video(path: Path, where: str, error: BaseException) -> RowError:
    return RowError(where, "unreadable video", f"cannot decode video {path}: {error}", "replace it with a valid video")


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
