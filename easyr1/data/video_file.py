"""Video files read with PyAV, bounded by what is kept rather than by the file's length or resolution.

The dataset check reads a file's container metadata (size, frame count, rate, duration) and decodes its first frame
only, which proves the codec works and gives the start time. Loading decodes forward from the start, or seeks to a
keyframe when the next sampled time lies further ahead than a keyframe interval, and converts only the frame
nearest each sampled time, resized as it is picked: memory holds the kept frames at their target size, one frame at
full size and the decoder's own buffers, whatever the video's length or resolution.

Both read the same metadata, so the frame count the check measures is the count loading returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image


# qwen-vl-utils' default cap on the frames taken from one video (FPS_MAX_FRAMES)
DEFAULT_MAX_FRAMES = 768
# qwen-vl-utils' default largest frame, in vision tokens (VIDEO_MAX_TOKEN_NUM; a token is one merged patch)
DEFAULT_FRAME_TOKENS = 768
# Before the video shows its keyframe interval, a sampled time this far ahead (seconds) is reached by seeking.
_FIRST_SEEK_GAP = 1.0


@dataclass(frozen=True)
class VideoLimits:
    """How a video is sampled: ``fps`` frames a second, at most ``max_frames`` of them (a longer video is thinned to
    that many, evenly spread, as qwen-vl-utils does), and a video longer than ``max_duration`` seconds refused."""

    fps: float = 2.0
    max_frames: int = DEFAULT_MAX_FRAMES
    max_duration: float | None = None


@dataclass(frozen=True)
class VideoFileInfo:
    """What the container says about its first video stream, plus the time of the first decoded frame."""

    width: int
    height: int
    start: float  # seconds, the first frame's time
    span: float  # seconds from the first to the last frame
    duration: float  # seconds, the container's duration (the span when it records none)
    frames: int  # frame count the container records (0: unknown)


def sample_times(duration: float, fps: float, max_frames: int | None = None) -> list[float]:
    """Times (seconds) of the frames kept from a ``duration``-second video at ``fps``: an even count (Qwen-VL
    groups frames in pairs), at least two. Above ``max_frames`` the count is lowered to it (made even) and the
    times spread evenly from the first frame to the last."""
    count = max(2, int(duration * fps) + 1)
    count += count % 2
    if max_frames is None or count <= max_frames:
        return [min(index / fps, duration) for index in range(count)]
    count = max(2, max_frames - max_frames % 2)
    return [duration * index / (count - 1) for index in range(count)]


def video_sampling(span: float, limits: VideoLimits) -> tuple[list[float], float]:
    """The kept times of a video whose frames span ``span`` seconds (see :func:`sample_times`) and their rate: the
    rate goes into the video metadata, lowered when the frame cap thins the frames, so that the model places them
    at their true times."""
    times = sample_times(span, limits.fps, limits.max_frames)
    full_count = len(sample_times(span, limits.fps))
    return times, limits.fps if len(times) == full_count else (len(times) - 1) / span


def read_video_info(path: Path) -> VideoFileInfo:
    """The container's metadata of ``path`` and its first frame's time, decoding that frame only.

    The span (first to last frame) comes from the recorded frame count and rate; a container that records neither
    has its packets' timestamps read (demuxed, not decoded). Raises what PyAV raises for unreadable files, and
    ValueError for a file without a video stream or frames.
    """
    import av

    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError("the file has no video stream")
        stream = container.streams.video[0]
        first = next(container.decode(stream), None)
        if first is None:
            raise ValueError("the video has no frames")
        time_base = float(stream.time_base) if stream.time_base else None
        start = first.time if first.time is not None else 0.0
        rate = float(stream.average_rate or stream.guessed_rate or 0)
        duration = None
        if stream.duration and time_base:
            duration = stream.duration * time_base
        elif container.duration:
            duration = container.duration / av.time_base
        frames = int(stream.frames or 0)
        if frames > 0 and rate > 0:
            span = (frames - 1) / rate
        elif duration is not None and rate > 0:
            span = max(0.0, duration - 1 / rate)
        else:
            span, frames = _packet_span(container, stream, time_base)
        return VideoFileInfo(
            width=first.width,
            height=first.height,
            start=start,
            span=span,
            duration=duration if duration is not None else span,
            frames=frames,
        )


def _packet_span(container: Any, stream: Any, time_base: float | None) -> tuple[float, int]:
    """(seconds from the first to the last packet, packet count), read from the packets' timestamps."""
    container.seek(0, stream=stream)
    stamps = [packet.pts for packet in container.demux(stream) if packet.pts is not None]
    if not stamps or not time_base:
        return 0.0, len(stamps)
    return (max(stamps) - min(stamps)) * time_base, len(stamps)


class _SeekFailed(Exception):
    """The container cannot seek (or lands after the asked time): read it from the start without seeking."""


class _NearestFrames:
    """The decoded frame nearest each of a rising sequence of times, keeping only the last two decoded frames."""

    def __init__(self, container: Any, stream: Any, seek: bool) -> None:
        self.container, self.stream, self.seek = container, stream, seek
        self.frames: Iterator[Any] = container.decode(stream)
        self.previous: Any = None
        self.current: Any = None
        self.index = -1  # of ``current`` in the stream (counted only without seeking)
        self.rate = float(stream.average_rate or stream.guessed_rate or 1)
        self.ended = False
        self.seek_gap = _FIRST_SEEK_GAP
        self.last_key: float | None = None

    def time(self, frame: Any, index: int) -> float:
        if frame.time is not None:
            return frame.time
        if self.seek:
            raise _SeekFailed  # without timestamps a frame's place is its index, known only reading from the start
        return index / self.rate

    def advance(self) -> None:
        frame = next(self.frames, None)
        if frame is None:
            self.ended = True
            return
        self.index += 1
        if frame.key_frame and frame.time is not None:
            if self.last_key is not None:
                self.seek_gap = max(self.seek_gap, frame.time - self.last_key)
            self.last_key = frame.time
        self.previous, self.current = self.current, (self.time(frame, self.index), frame)

    def jump(self, target: float) -> None:
        """Seek to the keyframe at or before ``target`` (seconds) and decode its first frame."""
        time_base = self.stream.time_base
        offset = math.floor(target / time_base) if time_base else None
        if offset is None:
            raise _SeekFailed
        before = self.current[0]
        try:
            self.container.seek(offset, backward=True, any_frame=False, stream=self.stream)
        except Exception as error:  # FFmpeg's errors on seeking come in many types
            raise _SeekFailed from error
        self.frames = self.container.decode(self.stream)
        self.previous = self.current = None
        self.last_key = None
        self.advance()
        if self.current is None or self.current[0] > target:
            raise _SeekFailed
        if self.current[0] <= before:
            # landed no further than where decoding already was: keyframes are at least this far apart
            self.seek_gap = max(self.seek_gap, target - self.current[0])

    def nearest(self, start: float, offset: float) -> Any:
        """The frame whose time is nearest ``start + offset`` (the earlier one on a tie)."""
        absolute = start + offset
        if self.current is None:
            self.advance()
        elif self.seek and not self.ended and absolute - self.current[0] > self.seek_gap:
            self.jump(absolute)
        while not self.ended and self.current[0] < absolute:
            self.advance()
        candidates = [pair for pair in (self.previous, self.current) if pair is not None]
        # the same expression as a search over every frame's time, so that ties fall the same way
        return min(candidates, key=lambda pair: abs(pair[0] - start - offset))[1]


def decode_frames(path: Path, info: VideoFileInfo, times: Sequence[float], size: tuple[int, int]) -> list[Image.Image]:
    """The frames of ``path`` nearest ``times`` (seconds after its first frame, rising) as RGB images of ``size``
    (height, width), each converted and resized (bicubic) when it is picked; a frame picked twice is one image."""
    try:
        return _decode_frames(path, info, times, size, seek=True)
    except _SeekFailed:
        return _decode_frames(path, info, times, size, seek=False)


def _decode_frames(
    path: Path, info: VideoFileInfo, times: Sequence[float], size: tuple[int, int], seek: bool
) -> list[Image.Image]:
    import av

    height, width = size
    picks: list[Image.Image] = []
    last: tuple[Any, Image.Image] | None = None
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        reader = _NearestFrames(container, stream, seek)
        for offset in times:
            frame = reader.nearest(info.start, offset)
            if last is None or last[0] is not frame:
                image = frame.to_image()
                if image.mode != "RGB":
                    image = image.convert("RGB")
                if (image.height, image.width) != (height, width):
                    image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
                last = (frame, image)
            picks.append(last[1])
    return picks
