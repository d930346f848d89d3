"""Every kind of bad row is caught while loading the data: a clear error naming the row, or a counted skip."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from easyr1.data import RLDataset, collate_fn
from easyr1.errors import DataError
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor


def png_bytes(size=(56, 56)) -> bytes:
    """A noisy image, so its compressed data is large enough to cut in half."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, bytes((i * 7919) % 251 for i in range(size[0] * size[1] * 3))).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bad_rows(tmp_path_factory):
    """(data dir, rows, {name: (line, expected message)}) with good rows first and one of each bad kind after."""
    root = tmp_path_factory.mktemp("bad_rows")
    (root / "good.png").write_bytes(png_bytes())
    (root / "truncated.png").write_bytes(png_bytes()[: len(png_bytes()) // 2])
    (root / "text.png").write_text("this is not an image")
    (root / "empty.png").write_bytes(b"")
    (root / "empty_frames").mkdir()
    for k in range(2):
        (root / f"frame{k}.png").write_bytes(png_bytes())
    good_image = {"problem": "<image>What colour?", "answer": "red", "images": ["good.png"]}
    cases = {
        "missing prompt column": ({"answer": "red"}, "missing key 'problem'"),
        "missing answer column": ({"problem": "What colour?"}, "missing key 'answer'"),
        "prompt not a string": ({"problem": ["What?"], "answer": "red"}, "'problem' must be a string"),
        "empty prompt": ({"problem": "   ", "answer": "red"}, "'problem' is empty"),
        "answer not a string": ({"problem": "What colour?", "answer": None}, "'answer' must be a string or a number"),
        "answer a list": ({"problem": "What colour?", "answer": ["red"]}, "'answer' must be a string or a number"),
        "image path missing": ({**good_image, "images": ["gone.png"]}, "cannot read image 'gone.png'"),
        "truncated image": ({**good_image, "images": ["truncated.png"]}, "cannot read image 'truncated.png'"),
        "not an image": ({**good_image, "images": ["text.png"]}, "cannot read image 'text.png'"),
        "zero-size image": ({**good_image, "images": ["empty.png"]}, "cannot read image 'empty.png'"),
        "image of the wrong type": ({**good_image, "images": [3.5]}, "an image must be a path"),
        "video with no frames": (
            {"problem": "<video>What colour?", "answer": "red", "videos": [[]]},
            "has no frames",
        ),
        "video folder without frames": (
            {"problem": "<video>What colour?", "answer": "red", "videos": ["empty_frames"]},
            "has no frames",
        ),
        "more image markers than images": (
            {**good_image, "problem": "<image><image>What colour?"},
            "2 <image> marker(s) but the row has 1 image(s)",
        ),
        "fewer image markers than images": (
            {**good_image, "problem": "<image>Which is red?", "images": ["good.png", "good.png"]},
            "1 <image> marker(s) but the row has 2 image(s)",
        ),
    }
    good = [good_image, {"problem": "What colour is grass?", "answer": "green"}]
    good.append({"problem": "<video>What colour?", "answer": 7, "videos": [["frame0.png", "frame1.png"]]})
    rows = good + [row for row, _ in cases.values()]
    expected = {name: (len(good) + 1 + i, message) for i, (name, (_, message)) in enumerate(cases.items())}
    return root, rows, expected


@pytest.fixture(scope="module")
def model(tiny_qwen2_5_vl_dir):
    tokenizer, processor = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    return tokenizer, processor, load_model_config(str(tiny_qwen2_5_vl_dir))


def load(path, model, **kwargs) -> RLDataset:
    tokenizer, processor, config = model
    return RLDataset(str(path), tokenizer, processor, prompt_key="problem", max_prompt_length=96,
                     model_config=config, **kwargs)  # fmt: skip


def write(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_bad_rows_are_skipped_and_counted_and_good_rows_train(bad_rows, model, capsys):
    root, rows, expected = bad_rows
    write(root / "all.jsonl", rows)
    dataset = load(root / "all.jsonl", model, skip_bad_rows=True)
    assert len(dataset) == 3 and len(dataset.skipped) == len(expected)
    for (row, reason), (name, (line, message)) in zip(dataset.skipped, expected.items()):
        assert row.index == line and message in reason, name
        assert f"all.jsonl line {line}" in reason, name
    batch = collate_fn([dataset[i] for i in range(len(dataset))])  # good rows: text, image and video together
    assert batch["input_ids"].shape == (3, 96)
    out = capsys.readouterr().out
    assert f"skipped {len(expected)} of {len(rows)} bad rows" in out


@pytest.mark.parametrize("name", [
    "missing prompt column", "missing answer column", "prompt not a string", "empty prompt", "answer not a string",
    "answer a list", "image path missing", "truncated image", "not an image", "zero-size image",
    "image of the wrong type", "video with no frames", "video folder without frames",
    "more image markers than images", "fewer image markers than images",
])  # fmt: skip
def test_each_bad_row_alone_is_a_clear_error(bad_rows, model, name, tmp_path):
    root, rows, expected = bad_rows
    line, message = expected[name]
    write(root / f"{name}.jsonl", [rows[0], rows[line - 1]])
    with pytest.raises(DataError) as error:
        load(root / f"{name}.jsonl", model)
    assert f"{name}.jsonl line 2: " in str(error.value) and message in str(error.value)


def test_every_row_bad_is_an_error_even_when_skipping(bad_rows, model):
    root, rows, expected = bad_rows
    write(root / "only_bad.jsonl", rows[3:])
    with pytest.raises(DataError, match=f"no usable rows \\({len(expected)} bad"):
        load(root / "only_bad.jsonl", model, skip_bad_rows=True)


def test_overlong_vision_prompt_is_caught_before_any_model_loads(bad_rows, model, tmp_path):
    root, rows, _ = bad_rows
    big = tmp_path / "big.png"
    Image.new("RGB", (112, 112), (0, 0, 200)).save(big)
    write(
        tmp_path / "long.jsonl", [rows[1], {"problem": "<image>What colour?", "answer": "blue", "images": [str(big)]}]
    )
    tokenizer, processor, config = model
    with pytest.raises(DataError) as error:
        RLDataset(str(tmp_path / "long.jsonl"), tokenizer, processor, prompt_key="problem", max_prompt_length=32,
                  filter_overlong_prompts=False, model_config=config)  # fmt: skip
    message = str(error.value)
    assert "long.jsonl line 2: the prompt is" in message and "(16 of them for its images/videos)" in message
    assert "data.max_prompt_length" in message and "data.max_pixels" in message


@pytest.mark.slow
def test_training_runs_on_the_good_rows_of_a_dataset_with_every_bad_row(
    bad_rows, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path
):
    from test_cli import base_args, run_cli

    root, rows, expected = bad_rows
    shape_rows = [json.loads(line) for line in (tiny_dataset_dir / "train.jsonl").read_text().splitlines()]
    for row in shape_rows:  # absolute paths: the mixed file lives in another folder
        row["images"] = [str(tiny_dataset_dir / image) for image in row["images"]]
    bad = [row for index, row in enumerate(rows) if index >= 3]
    write(root / "train_with_bad.jsonl", shape_rows[:32] + bad)
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            f"data.train_files={root / 'train_with_bad.jsonl'}",
            "data.skip_bad_rows=true",
            "trainer.max_steps=2",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"skipped {len(expected)} of {32 + len(bad)} bad rows" in result.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
