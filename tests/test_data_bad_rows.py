"""Every kind of bad row is caught while loading the data (a clear error naming the row, or a counted skip), and
the prompt length computed then, from image headers, equals the processor's real expanded length."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zlib
from collections import Counter

import pytest
import torch
from PIL import Image

from easyr1.data import RLDataset, collate_fn
from easyr1.data.checks import RowError
from easyr1.data.vision import image_size
from easyr1.errors import DataError
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor


def noisy_image(size: tuple[int, int] = (56, 56), seed: int = 1) -> Image.Image:
    """An image of noise, so that its compressed file is large enough to cut in half."""
    width, height = size
    return Image.frombytes("RGB", size, bytes((i * 7919 + seed) % 251 for i in range(width * height * 3)))


def encoded(image: Image.Image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format)
    return buffer.getvalue()


def zero_width_png(height: int = 8) -> bytes:
    """A PNG whose header says 0 x ``height`` pixels (Pillow refuses to write one)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 0, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def write(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


IMAGE_ROW = {"problem": "<image>What colour?", "answer": "red", "images": ["good.png"]}
VIDEO_ROW = {"problem": "<video>What colour?", "answer": "red", "videos": [["frame0.png", "frame1.png"]]}
GOOD_ROWS = [
    IMAGE_ROW,
    {"problem": "What colour is grass?", "answer": "green"},
    {**VIDEO_ROW, "answer": 7},
    {"problem": "Which is larger, <image> or <image>?", "answer": 2.5, "images": ["good.jpg", "good.png"]},
]

# name: (row, the reason counted when it is skipped, a piece of its message)
CASES = {
    "missing prompt column": ({"answer": "red"}, "missing column", "missing key 'problem' (data.prompt_key)"),
    "missing answer column": ({"problem": "Why?"}, "missing column", "missing key 'answer' (data.answer_key)"),
    "prompt a list": ({"problem": ["Why?"], "answer": "red"}, "prompt not a string", "'problem' must be a string"),
    "prompt a number": ({"problem": 12, "answer": "red"}, "prompt not a string", "got int 12"),
    "empty prompt": ({"problem": "", "answer": "red"}, "empty prompt", "'problem' is empty"),
    "whitespace prompt": ({"problem": " \n\t", "answer": "red"}, "empty prompt", "'problem' is empty"),
    "answer None": ({"problem": "Why?", "answer": None}, "answer not a string or number", "is NoneType None"),
    "answer a list": ({"problem": "Why?", "answer": ["red"]}, "answer not a string or number", "is list"),
    "answer a dict": ({"problem": "Why?", "answer": {"a": 1}}, "answer not a string or number", "is dict"),
    "answer a bool": ({"problem": "Why?", "answer": True}, "answer not a string or number", "is bool True"),
    "answer NaN": ({"problem": "Why?", "answer": float("nan")}, "answer not a string or number", "is NaN"),
    "images a number": ({**IMAGE_ROW, "images": 3.5}, "bad image value", "'images' must be a list of paths"),
    "image a number": ({**IMAGE_ROW, "images": [3.5]}, "bad image value", "an image must be a path"),
    "image dict without bytes or path": (
        {**IMAGE_ROW, "images": [{"url": "x"}]},
        "bad image value",
        "needs a 'bytes' or 'path' entry",
    ),
    "image path missing": ({**IMAGE_ROW, "images": ["gone.png"]}, "image not found", "gone.png does not exist"),
    "image path a folder": ({**IMAGE_ROW, "images": ["empty_frames"]}, "image not found", "is a folder"),
    "truncated png": ({**IMAGE_ROW, "images": ["truncated.png"]}, "unreadable image", "'truncated.png'"),
    "truncated jpeg": ({**IMAGE_ROW, "images": ["truncated.jpg"]}, "unreadable image", "'truncated.jpg'"),
    "text file as image": ({**IMAGE_ROW, "images": ["text.png"]}, "unreadable image", "not an image file"),
    "empty image file": ({**IMAGE_ROW, "images": ["empty.png"]}, "unreadable image", "not an image file"),
    "zero-size image file": ({**IMAGE_ROW, "images": ["zero.png"]}, "unreadable image", "zero-size"),
    "extreme aspect ratio": ({**IMAGE_ROW, "images": ["thin.png"]}, "extreme aspect ratio", "aspect ratio of 300"),
    "videos a number": ({**VIDEO_ROW, "videos": 7}, "bad video value", "'videos' must be a list"),
    "video a number": ({**VIDEO_ROW, "videos": [7]}, "bad video value", "a video must be a list of frames"),
    "video with no frames": ({**VIDEO_ROW, "videos": [[]]}, "video without frames", "has no frames"),
    "video folder without frames": (
        {**VIDEO_ROW, "videos": ["empty_frames"]},
        "video without frames",
        "'empty_frames' has no frames",
    ),
    "video folder missing": ({**VIDEO_ROW, "videos": ["no_such_dir"]}, "video not found", "does not exist"),
    "video file missing": ({**VIDEO_ROW, "videos": ["gone.mp4"]}, "video not found", "gone.mp4 does not exist"),
    "broken video file": ({**VIDEO_ROW, "videos": ["broken.mp4"]}, "unreadable video", "cannot decode video"),
    "text file as video": (
        {**VIDEO_ROW, "videos": ["text.png"]},
        "bad video value",
        "is neither a video file",
    ),
    "video frames of two sizes": (
        {**VIDEO_ROW, "videos": [["frame0.png", "wide_frame.png"]]},
        "video frames differ in size",
        "have different sizes (56x56, 112x56)",
    ),
    "video frame truncated": (
        {**VIDEO_ROW, "videos": [["frame0.png", "truncated.png"]]},
        "unreadable image",
        "'truncated.png'",
    ),
    "more image markers than images": (
        {**IMAGE_ROW, "problem": "<image><image>What colour?"},
        "image marker count",
        "2 <image> marker(s) but the row has 1 image(s)",
    ),
    "fewer image markers than images": (
        {**IMAGE_ROW, "images": ["good.png", "good.png"]},
        "image marker count",
        "1 <image> marker(s) but the row has 2 image(s)",
    ),
    "image marker without images": (
        {"problem": "<image>What colour?", "answer": "red"},
        "image marker count",
        "1 <image> marker(s) but the row has 0 image(s)",
    ),
    "more video markers than videos": (
        {**VIDEO_ROW, "problem": "<video>then<video>?"},
        "video marker count",
        "2 <video> marker(s) but the row has 1 video(s)",
    ),
    "fewer video markers than videos": (
        {**VIDEO_ROW, "videos": VIDEO_ROW["videos"] * 2},
        "video marker count",
        "1 <video> marker(s) but the row has 2 video(s)",
    ),
    "model's image token in the prompt text": (
        {"problem": "<|vision_start|><|image_pad|><|vision_end|>What colour?", "answer": "red"},
        "vision tokens in prompt text",
        "holds 1 <|image_pad|> token(s) for the row's 0 image(s)",
    ),
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A folder with good and broken images and video frames, referred to by the rows above."""
    root = tmp_path_factory.mktemp("bad_rows")
    png, jpeg = encoded(noisy_image(), "PNG"), encoded(noisy_image((448, 448)), "JPEG")
    (root / "good.png").write_bytes(png)
    (root / "good.jpg").write_bytes(jpeg)
    (root / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "truncated.jpg").write_bytes(jpeg[: len(jpeg) * 9 // 10])
    (root / "text.png").write_text("this is not an image")
    (root / "empty.png").write_bytes(b"")
    (root / "zero.png").write_bytes(zero_width_png())
    noisy_image((300, 1)).save(root / "thin.png")
    (root / "empty_frames").mkdir()
    for index in range(2):
        noisy_image(seed=index).save(root / f"frame{index}.png")
    noisy_image((112, 56)).save(root / "wide_frame.png")  # a frame that resizes to another size than 56x56
    (root / "broken.mp4").write_bytes(b"not a video at all")
    return root


@pytest.fixture(scope="module")
def model(tiny_qwen2_5_vl_dir):
    tokenizer, processor = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    return tokenizer, processor, load_model_config(str(tiny_qwen2_5_vl_dir))


def load(path, model, **options) -> RLDataset:
    tokenizer, processor, config = model
    options = {"prompt_key": "problem", "max_prompt_length": 96, "model_config": config, **options}
    return RLDataset(str(path), tokenizer, processor, **options)


def test_bad_rows_are_skipped_and_counted_and_good_rows_train(data_dir, model, capsys):
    rows = GOOD_ROWS[:2] + [row for row, _, _ in CASES.values()] + GOOD_ROWS[2:]
    write(data_dir / "all.jsonl", rows)
    dataset = load(data_dir / "all.jsonl", model, skip_bad_rows=True)

    assert len(dataset) == len(GOOD_ROWS)
    assert [dataset.row(i).index for i in range(len(dataset))] == [1, 2, len(rows) - 1, len(rows)]
    assert dataset.skipped == dict(Counter(reason for _, reason, _ in CASES.values()))
    assert len(dataset.bad_rows) == len(CASES)
    for line, (name, (row, error)) in enumerate(zip(CASES, dataset.bad_rows), start=3):
        _, reason, message = CASES[name]
        assert row.index == line and error.reason == reason, name
        assert str(error).startswith(f"{data_dir / 'all.jsonl'} line {line}: ") and message in str(error), name

    # one line: the count, the first few with reason and line, then the counts per reason
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[data] skipped")]
    assert len(lines) == 1
    assert lines[0].startswith(
        f"[data] skipped {len(CASES)} of {len(rows)} rows in {data_dir / 'all.jsonl'}: "
        "missing column (line 3), missing column (line 4), prompt not a string (line 5), "
    )
    assert "(by reason: missing column 2, prompt not a string 2, empty prompt 2," in lines[0]

    batch = collate_fn([dataset[i] for i in range(len(dataset))])  # text, image, video and two-image rows
    assert batch["input_ids"].shape == (len(GOOD_ROWS), 96)
    assert [int(mask.sum()) for mask in batch["attention_mask"]] == dataset.prompt_lengths
    assert list(batch["ground_truth"]) == ["red", "green", "7", "2.5"]


@pytest.mark.parametrize("name", list(CASES))
def test_each_bad_row_alone_is_a_clear_error(data_dir, model, name):
    row, reason, message = CASES[name]
    path = data_dir / f"{name}.jsonl"
    write(path, [IMAGE_ROW, row])
    with pytest.raises(RowError) as caught:
        load(path, model)
    error = caught.value
    assert isinstance(error, DataError) and error.reason == reason
    assert str(error).startswith(f"{path} line 2: ") and message in str(error)
    assert str(error).endswith("or set data.skip_bad_rows=true to drop bad rows")


def test_every_row_bad_is_an_error_even_when_skipping(data_dir, model):
    write(data_dir / "only_bad.jsonl", [row for row, _, _ in CASES.values()])
    with pytest.raises(DataError, match=f"no usable rows \\({len(CASES)} bad") as caught:
        load(data_dir / "only_bad.jsonl", model, skip_bad_rows=True)
    assert "the first bad row: " in str(caught.value) and "only_bad.jsonl line 1: missing key" in str(caught.value)


def test_row_errors_cross_process_boundaries_intact(data_dir, model):
    """A row error raised in a DataLoader worker or a Ray task is pickled, or rebuilt from its message."""
    path = data_dir / "gone_later.jsonl"
    write(path, [{**IMAGE_ROW, "images": ["vanishing.png"]}])
    (data_dir / "vanishing.png").write_bytes((data_dir / "good.png").read_bytes())
    dataset = load(path, model)
    (data_dir / "vanishing.png").unlink()  # the file goes away after loading: the item names the row all the same
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=collate_fn, num_workers=1)
    with pytest.raises(DataError, match="gone_later.jsonl line 1: cannot read image 'vanishing.png'"):
        next(iter(loader))
    error = RowError("f.jsonl line 3", "image not found", "cannot read image 'a.png'", "fix the path")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.reason, copy.where) == (str(error), "image not found", "f.jsonl line 3")


def test_zero_size_and_truncated_jpeg_are_caught_by_the_image_check(data_dir):
    """Zero-size images only exist in memory (Pillow refuses such files); a truncated JPEG passes a header read
    and ``Image.verify`` alike, and is caught by the cheap decode."""
    with pytest.raises(RowError, match="has zero size \\(0x8 pixels\\)") as caught:
        image_size(Image.new("RGB", (0, 8)), None, "x row 0")
    assert caught.value.reason == "zero-size image"
    assert image_size("truncated.jpg", data_dir, "x row 0") == (448, 448)
    with pytest.raises(RowError, match="image file is truncated"):
        image_size("truncated.jpg", data_dir, "x row 0", verify=True)
    assert image_size("good.jpg", data_dir, "x row 0", verify=True) == (448, 448)


# ---------------------------------------------------------------------------------------------- pre-flight lengths


def write_sized_images(root, sizes) -> list[str]:
    names = []
    for width, height in sizes:
        names.append(f"img_{width}x{height}.png")
        noisy_image((width, height)).save(root / names[-1])
    return names


def write_mp4(path, frames: int, fps: int, size: tuple[int, int] = (64, 48)) -> str:
    """A small mp4 of noise frames; returns its file name."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
        for index in range(frames):
            frame = av.VideoFrame.from_image(noisy_image(size, seed=index))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.name


def write_frames(root, count: int, size: tuple[int, int]) -> list[str]:
    names = []
    for index in range(count):
        names.append(f"frame_{size[0]}x{size[1]}_{index}.png")
        noisy_image(size, seed=index).save(root / names[-1])
    return names


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("max_pixels", [None, 56 * 56 * 2])
def test_computed_prompt_length_is_the_processors_expanded_length(tiny_model_dir, tmp_path, family, max_pixels):
    model_dir = tiny_model_dir(family)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    single = write_sized_images(tmp_path, [(56, 56), (300, 200), (40, 30), (500, 90), (1000, 1000), (33, 97)])
    rows = [{"problem": "<image>Describe it.", "answer": "x", "images": [name]} for name in single]
    rows.append({"problem": "Compare <image>, <image> and <image>.", "answer": "y", "images": single[1:4]})
    rows.append({"problem": "No markers: the images go first.", "answer": "y", "images": single[:2]})
    rows.append({"problem": "Only text here.", "answer": "z"})
    for count, size in ((4, (56, 56)), (5, (100, 80)), (8, (128, 128)), (2, (64, 96))):
        rows.append(
            {"problem": "<video>What happens?", "answer": "v", "videos": [write_frames(tmp_path, count, size)]}
        )
    rows.append({"problem": "<video>What happens?", "answer": "v", "videos": [write_mp4(tmp_path / "a.mp4", 10, 4)]})
    rows.append(  # two videos and an image in one prompt
        {
            "problem": "<video> then <image> then <video>",
            "answer": "w",
            "images": [single[1]],
            "videos": [write_frames(tmp_path, 4, (56, 56)), write_frames(tmp_path, 3, (100, 80))],
        }
    )
    write(tmp_path / "rows.jsonl", rows)
    dataset = RLDataset(str(tmp_path / "rows.jsonl"), tokenizer, processor, prompt_key="problem",
                        max_prompt_length=1024, max_pixels=max_pixels,
                        model_config=load_model_config(str(model_dir)))  # fmt: skip
    assert len(dataset) == len(rows)
    image_pad, video_pad = processor.image_token_id, processor.video_token_id
    for index in range(len(dataset)):
        item = dataset[index]
        ids = item["input_ids"][item["attention_mask"].bool()]
        assert dataset.prompt_lengths[index] == len(ids), (family, rows[index])
        has_vision = bool(rows[index].get("images") or rows[index].get("videos"))
        assert bool((ids == image_pad).sum() + (ids == video_pad).sum()) == has_vision


def test_qwen3_vl_refuses_a_one_frame_video_while_loading(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("qwen3_vl")
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    rows = [{"problem": "Hi?", "answer": "x"}]
    rows.append({"problem": "<video>What?", "answer": "x", "videos": [write_frames(tmp_path, 1, (64, 64))]})
    write(tmp_path / "one_frame.jsonl", rows)
    with pytest.raises(RowError, match="one_frame.jsonl line 2: the processor cannot take a video of 1 frame") as e:
        RLDataset(str(tmp_path / "one_frame.jsonl"), tokenizer, processor, prompt_key="problem",
                  model_config=load_model_config(str(model_dir)))  # fmt: skip
    assert e.value.reason == "unusable video"


def test_overlong_vision_prompt_is_caught_before_any_model_loads(data_dir, model, tmp_path, capsys):
    Image.new("RGB", (112, 112), (0, 0, 200)).save(tmp_path / "big.png")  # 16 image tokens
    frames = write_frames(tmp_path, 4, (112, 112))  # 2 temporal patches of 16 tokens
    rows = [
        {"problem": "What colour?", "answer": "blue"},
        {"problem": "<image>What colour?", "answer": "blue", "images": ["big.png"]},
        {"problem": "<video>What colour?", "answer": "blue", "videos": [frames]},
    ]
    write(tmp_path / "long.jsonl", rows)
    with pytest.raises(DataError) as caught:
        load(tmp_path / "long.jsonl", model, max_prompt_length=32, filter_overlong_prompts=False)
    message = str(caught.value)
    assert "long.jsonl line 2: the prompt is" in message and "(16 of them for its images/videos)" in message
    assert "data.max_prompt_length" in message and "data.max_pixels" in message

    write(tmp_path / "long_video.jsonl", [rows[0], rows[2]])
    with pytest.raises(DataError, match="long_video.jsonl line 2: the prompt is .* \\(32 of them"):
        load(tmp_path / "long_video.jsonl", model, max_prompt_length=32, filter_overlong_prompts=False)

    dataset = load(tmp_path / "long.jsonl", model, max_prompt_length=32)  # filtering on: dropped and counted
    assert len(dataset) == 1 and dataset.prompt_lengths == [int(dataset[0]["attention_mask"].sum())]
    assert "filtered 2 of 3 prompts longer than max_prompt_length=32" in capsys.readouterr().out


@pytest.mark.vllm
@pytest.mark.e2e
def test_training_runs_on_the_good_rows_of_a_dataset_with_every_bad_row(
    data_dir, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment
):
    from helpers import ONE_PROCESS, train
    from test_cli import base_args

    shape_rows = [json.loads(line) for line in (tiny_dataset_dir / "train.jsonl").read_text().splitlines()]
    for row in shape_rows:  # absolute paths: the mixed file lives in another folder
        row["images"] = [str(tiny_dataset_dir / image) for image in row["images"]]
    bad = [row for row, _, _ in CASES.values()]
    write(data_dir / "train_with_bad.jsonl", shape_rows[:32] + bad)
    run_dir = tmp_path / "run"
    result = train(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            *ONE_PROCESS,
            f"data.train_files={data_dir / 'train_with_bad.jsonl'}",
            "data.skip_bad_rows=true",
            "trainer.max_steps=2",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"skipped {len(bad)} of {32 + len(bad)} rows" in result.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
