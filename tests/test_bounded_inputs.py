"""Bounded inputs: video files measured from their metadata and decoded only at the sampled times, at the target
size, with caps on frames, frame area and duration; image files opened only as the formats the processors are sent.

The old way of reading a video (every frame decoded at full size, then the nearest one to each sampled time kept)
is written out here as the reference the sampled frames must equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import EpsImagePlugin, Image
from transformers import AutoProcessor

from easyr1.data import RLDataset, video_file
from easyr1.data.checks import RowError
from easyr1.data.video_file import VideoLimits, read_video_info, sample_times
from easyr1.data.vision import (
    VisionBounds,
    image_size,
    load_image,
    load_video,
    resize_image,
    target_size,
    video_bounds,
    video_shape,
)
from easyr1.errors import DataError
from easyr1.models.loading import load_tokenizer_and_processor


REPO = Path(__file__).resolve().parents[1]
TEN_MINUTES = 600
FULL_HD = (1080, 1920)  # height, width


@pytest.fixture(scope="module")
def processor(tiny_qwen2_5_vl_dir):
    return AutoProcessor.from_pretrained(tiny_qwen2_5_vl_dir)


def whole_decode(path: Path, fps: float) -> list[Image.Image]:
    """The reference: every frame decoded at full size, then the one nearest each sampled time kept."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded = [(frame.time, frame.to_image()) for frame in container.decode(stream)]
    rate = float(stream.average_rate or fps)
    times = [time if time is not None else index / rate for index, (time, _) in enumerate(decoded)]
    start = times[0]
    picks = [
        min(range(len(times)), key=lambda i: abs(times[i] - start - target))
        for target in sample_times(times[-1] - start, fps)
    ]
    return [decoded[index][1].convert("RGB") for index in picks]


def write_noise_clip(path: Path, codec: str, seconds: int = 3, rate: int = 10, gop: int = 5) -> None:
    """A clip of random frames (every frame differs, so a wrong pick shows), with a keyframe every ``gop``."""
    import av

    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        # two B-frames between references for H.264, so that decode order differs from presentation order
        stream = container.add_stream(codec, rate=rate, options={"bf": "2"} if codec == "libx264" else {})
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.gop_size = gop
        for _ in range(seconds * rate):
            image = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_long_video(path: Path, seconds: int, size: tuple[int, int], seconds_per_frame: int = 5) -> None:
    """A solid-colour video of ``seconds`` at ``size`` (height, width), one frame every ``seconds_per_frame``
    seconds and one keyframe for all, cheap to encode: its length and size are what count."""
    import av

    height, width = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(1, seconds_per_frame))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = seconds // seconds_per_frame
        image = np.zeros((height, width, 3), np.uint8)
        image[..., 0] = 200
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        for index in range(seconds // seconds_per_frame):
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


@pytest.fixture(scope="module")
def ten_minute_video(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("long") / "ten_minutes.mp4"
    write_long_video(path, TEN_MINUTES, FULL_HD)
    return path


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- video files

BOUNDS = VisionBounds(factor=28, min_pixels=28 * 28, max_pixels=84 * 56)  # 96x64 frames become 84x56


@pytest.mark.parametrize("codec", ["mpeg4", "libx264"])
@pytest.mark.parametrize("fps", [2.0, 0.7])  # 0.7: sampled times 1.4 s apart, reached by seeking
@pytest.mark.parametrize("seek", [True, False])
def test_sampled_frames_equal_the_whole_decode_resized(tmp_path, codec, fps, seek):
    path = tmp_path / "clip.mp4"
    write_noise_clip(path, codec)
    expected = [np.asarray(resize_image(frame, BOUNDS)) for frame in whole_decode(path, fps)]
    limits = VideoLimits(fps=fps)

    shape = video_shape(str(path), None, "clip", limits, BOUNDS)
    assert (shape.frames, shape.height, shape.width, shape.fps) == (len(expected), 56, 84, fps)
    if seek:
        video = load_video(str(path), None, "clip", limits, BOUNDS)
        assert video.fps == fps
        frames = video.frames
    else:  # the path taken by containers that cannot seek
        info = read_video_info(path)
        frames = video_file._decode_frames(path, info, sample_times(info.span, fps), (56, 84), seek=False)
    assert len(frames) == len(expected)
    for index, (frame, reference) in enumerate(zip(frames, expected)):
        assert np.array_equal(np.asarray(frame), reference), f"frame {index} differs"


def test_the_span_from_packet_timestamps_equals_the_metadata_span(tmp_path):
    """Containers that record neither frame count nor duration (live-recorded WebM) are measured from packets."""
    import av

    path = tmp_path / "clip.mkv"
    write_noise_clip(path, "libx264")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        span, count = video_file._packet_span(container, stream, float(stream.time_base))
    assert count == 30 and span == pytest.approx(read_video_info(path).span) and span == pytest.approx(2.9)


def test_frames_over_the_cap_are_thinned_evenly_and_their_rate_recorded():
    times, fps = video_file.video_sampling(595.0, VideoLimits(fps=2.0, max_frames=9))
    assert len(times) == 8 and times[0] == 0.0 and times[-1] == 595.0  # made even, first to last frame
    assert np.allclose(np.diff(times), 85.0) and fps == pytest.approx(7 / 595)
    assert video_file.video_sampling(1.75, VideoLimits(fps=2.0, max_frames=4)) == ([0.0, 0.5, 1.0, 1.5], 2.0)


# Run in a process of its own, which imports video_file.py alone (no torch), so that its peak resident memory is
# this work's: the check (metadata and first frame) and the load of 16 frames at no more than 448x448 pixels.
MEASURE = """
import importlib.util, json, sys, time
import av, numpy, PIL.Image

def status_mib(field):  # VmRSS: resident now; VmHWM: the process's peak (getrusage's keeps the parent's over exec)
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024

def resident_mib():
    return status_mib("VmRSS")

def peak_mib():
    return status_mib("VmHWM")

spec = importlib.util.spec_from_file_location("video_file", sys.argv[1])
video_file = importlib.util.module_from_spec(spec)
sys.modules["video_file"] = video_file
spec.loader.exec_module(video_file)
path, height, width = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
before = resident_mib()
start = time.process_time()  # CPU time: the work done, whatever else the machine runs
info = video_file.read_video_info(path)
times, fps = video_file.video_sampling(info.span, video_file.VideoLimits(fps=2.0))
check_s, check_mib = time.process_time() - start, peak_mib() - before
start = time.process_time()
kept, _ = video_file.video_sampling(info.span, video_file.VideoLimits(fps=2.0, max_frames=16))
frames = video_file.decode_frames(path, info, kept, (height, width))
print(json.dumps({
    "frames": len(times), "fps": fps, "check_s": check_s, "check_mib": check_mib, "loaded": len(frames),
    "size": [frames[0].height, frames[0].width], "load_s": time.process_time() - start,
    "load_mib": peak_mib() - before,
}))
"""


def test_a_ten_minute_1080p_video_is_measured_and_loaded_in_seconds_with_bounded_memory(ten_minute_video):
    """The check reads metadata; loading 16 frames of it holds those frames at their size, not the video. The
    bounds on seconds are on the process's CPU time, the work done (decoding the whole video takes minutes of it),
    not on wall time, which depends on what else the machine runs."""
    height, width = target_size(*FULL_HD, VisionBounds(factor=28, min_pixels=3136, max_pixels=448 * 448))
    command = [sys.executable, "-c", MEASURE, str(video_file.__file__), str(ten_minute_video), str(height), str(width)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    print(measured)  # the numbers behind the bounds below
    # 595 s from the first frame to the last at 2 fps is 1191 frames, thinned to qwen-vl-utils' cap of 768
    assert measured["frames"] == 768 and measured["fps"] == pytest.approx(767 / 595)
    assert measured["check_s"] < 5 and measured["check_mib"] < 50
    assert measured["loaded"] == 16 and measured["size"] == [height, width]
    # decoding every frame at full size, as before, holds 120 frames of 1920x1080 RGB: 746 MiB
    whole_video_mib = TEN_MINUTES // 5 * FULL_HD[0] * FULL_HD[1] * 3 / 2**20
    assert measured["load_s"] < 30 and measured["load_mib"] < 100 < whole_video_mib


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_long_videos_are_accepted_thinned_or_refused_by_duration_in_the_dataset_check(
    tmp_path, tiny_model_dir, ten_minute_video, family
):
    tokenizer, processor = load_tokenizer_and_processor(str(tiny_model_dir(family)))
    rows = write_rows(
        tmp_path / "v.jsonl", [{"problem": "<video>What colour?", "answer": "red", "videos": [str(ten_minute_video)]}]
    )
    options = {"prompt_key": "problem", "max_prompt_length": 192, "min_pixels": 3136, "max_pixels": 12544}
    start = time.process_time()  # CPU time, as above: the work of refusing it, not the machine's load
    with pytest.raises(DataError, match=r"v\.jsonl line 1: video .*ten_minutes\.mp4 lasts 600\.0 s, longer than "
                       r"data\.video_max_duration=300 s; cut it") as caught:  # fmt: skip
        RLDataset(str(rows), tokenizer, processor, video_max_duration=300, **options)
    assert caught.value.reason == "video too long" and time.process_time() - start < 10

    dataset = RLDataset(str(rows), tokenizer, processor, video_max_frames=8, **options)
    item = dataset[0]
    video = item["multi_modal_data"]["videos"][0]
    # 8 frames thinned from 1191, each 1920x1080 resized within 12544 pixels
    assert video.shape == (8, *target_size(*FULL_HD, dataset.video_bounds), 3)
    metadata = item["multi_modal_data"]["video_metadata"][0]
    assert metadata["fps"] == pytest.approx(7 / 595) and metadata["total_num_frames"] == 8
    # the length measured from metadata is the length of the prompt the processor built (Qwen3-VL's timestamps
    # follow the lowered fps)
    assert dataset.prompt_lengths[0] == int(item["attention_mask"].sum())


def test_a_frame_list_over_the_frame_cap_is_a_row_error(tmp_path):
    for index in range(3):
        Image.new("RGB", (56, 56), (index * 80, 0, 0)).save(tmp_path / f"f{index}.png")
    frames = [str(tmp_path / f"f{index}.png") for index in range(3)]
    with pytest.raises(RowError, match="has 3 frames, more than data.video_max_frames=2") as caught:
        video_shape(frames, None, "rows.jsonl line 4", VideoLimits(max_frames=2), BOUNDS)
    assert caught.value.reason == "too many video frames" and str(caught.value).startswith("rows.jsonl line 4:")


def test_video_frames_are_bounded_by_video_max_pixels():
    bounds = VisionBounds(factor=28, min_pixels=3136, max_pixels=4194304)
    assert video_bounds(bounds, None).max_pixels == 768 * 28 * 28  # qwen-vl-utils' default
    assert video_bounds(bounds, 100000).max_pixels == 100000
    assert video_bounds(VisionBounds(28, 3136, 50000), None).max_pixels == 50000  # max_pixels still applies
    with pytest.raises(DataError, match="data.video_max_pixels=1000 is smaller than"):
        video_bounds(bounds, 1000)


# ---------------------------------------------------------------------------------------------- image formats

EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 8 8
newpath 0 0 moveto 8 8 lineto stroke
showpage
%%EOF
"""


def test_an_eps_image_is_a_row_error_and_ghostscript_never_runs(tmp_path, processor, monkeypatch):
    ran = tmp_path / "ghostscript_ran"
    fake_ghostscript = tmp_path / "gs"
    fake_ghostscript.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    fake_ghostscript.chmod(0o755)
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", str(fake_ghostscript))
    (tmp_path / "figure.eps").write_bytes(EPS)
    rows = write_rows(tmp_path / "rows.jsonl", [{"problem": "<image>What is it?", "answer": "a line",
                                                 "images": ["figure.eps"]}])  # fmt: skip
    with pytest.raises(DataError, match=r"rows\.jsonl line 1: image 'figure\.eps' is in EPS format; images are read "
                       r"only as PNG, JPEG, WEBP, GIF, BMP, TIFF; convert it to PNG or JPEG") as caught:  # fmt: skip
        RLDataset(str(rows), processor.tokenizer, processor, prompt_key="problem")
    assert caught.value.reason == "unsupported image format"
    with pytest.raises(RowError, match="is in EPS format"):
        load_image({"bytes": EPS}, None, "rows.jsonl line 2")
    assert not ran.exists()


@pytest.mark.parametrize("format", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_the_supported_formats_open(tmp_path, format):
    path = tmp_path / f"image.{format.lower()}"
    Image.new("RGB", (40, 30), (0, 128, 255)).save(path, format)
    assert image_size(str(path), None, "here", verify=True) == (30, 40)
    assert load_image(path.read_bytes(), None, "here").size == (40, 30)
