"""Dataset loading, prompt building, vision inputs, collation and the demo data builders."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoProcessor

from easyr1.data import RLDataset, collate_fn, load_rows
from easyr1.data.prompt import build_messages
from easyr1.data.vision import VisionBounds, smart_resize, target_size
from easyr1.errors import DataError
from easyr1.protocol import Batch
from easyr1.tools.demo_assets import ensure_demo_assets
from easyr1.tools.tiny_dataset import COLOURS, PROMPT, build_shape_dataset


REPO = Path(__file__).resolve().parents[1]
PAD = "<|endoftext|>"


@pytest.fixture(scope="module")
def processor(tiny_qwen2_5_vl_dir):
    return AutoProcessor.from_pretrained(tiny_qwen2_5_vl_dir)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _dataset(data_file, processor, **options) -> RLDataset:
    options = {"prompt_key": "problem", "max_prompt_length": 64, **options}
    return RLDataset(str(data_file), processor.tokenizer, processor, **options)


def _png_bytes(size=(56, 56), colour=(0, 0, 255)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------- load_rows


def test_load_rows_reads_every_format_and_folders(tmp_path):
    rows = [{"problem": f"q{i}", "answer": str(i)} for i in range(3)]
    _write_jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "b.json").write_text(json.dumps(rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    (tmp_path / "sub").mkdir()
    _write_jsonl(tmp_path / "sub" / "d.json", rows)  # JSON lines under a .json name
    (tmp_path / "notes.txt").write_text("ignored")

    for name in ("a.jsonl", "b.json", "c.parquet", "sub/d.json"):
        loaded = load_rows(str(tmp_path / name))
        assert [dict(row.data) for row in loaded] == rows, name
    everything = load_rows(str(tmp_path))
    assert len(everything) == 12
    assert [Path(row.source).name for row in everything[::3]] == ["a.jsonl", "b.json", "c.parquet", "d.json"]
    assert load_rows(str(tmp_path / "a.jsonl"))[1].where.endswith("a.jsonl line 2")
    assert load_rows(str(tmp_path / "c.parquet"))[1].where.endswith("c.parquet row 1")


def test_load_rows_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "ok", "answer": "1"}\n\n{"problem": "broken", \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl line 3: invalid JSON"):
        load_rows(str(bad))
    (tmp_path / "list.jsonl").write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"list\.jsonl line 1: expected a JSON object"):
        load_rows(str(tmp_path / "list.jsonl"))
    with pytest.raises(DataError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .jsonl"):
        load_rows(str(tmp_path / "empty"))
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type"):
        load_rows(str(tmp_path / "rows.csv"))


# ---------------------------------------------------------------------------------------------- prompts


def test_build_messages_places_images_at_markers_or_first():
    assert build_messages("plain", 0, 0, "x") == [{"role": "user", "content": "plain"}]
    parts = build_messages("See <image> and <image>.", 2, 0, "x")[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text"]
    assert parts[0]["text"] == "See " and parts[-1]["text"] == "."
    parts = build_messages("What is shown?", 2, 1, "x")[0]["content"]
    assert [p["type"] for p in parts] == ["image", "image", "video", "text"]
    with pytest.raises(DataError, match="row 7: the prompt has 1 <image> marker"):
        build_messages("<image> vs ?", 2, 0, "row 7")


# ---------------------------------------------------------------------------------------------- RLDataset items


def test_item_fields_shapes_and_padding(tiny_dataset_dir, processor):
    dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor)
    assert len(dataset) == 64
    item = dataset[0]
    row = json.loads((tiny_dataset_dir / "train.jsonl").read_text().splitlines()[0])
    tokenizer = processor.tokenizer
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    assert item["input_ids"].shape == (64,) and item["input_ids"].dtype == torch.long
    assert item["attention_mask"].shape == (64,) and item["attention_mask"].dtype == torch.long
    assert item["position_ids"].shape == (4, 64) and item["position_ids"].dtype == torch.long
    length = int(item["attention_mask"].sum())
    # left padding: zeros first, then ones; pads carry the pad id and position 0
    assert item["attention_mask"].tolist() == [0] * (64 - length) + [1] * length
    assert (item["input_ids"][: 64 - length] == pad_id).all()
    assert (item["position_ids"][:, : 64 - length] == 0).all()
    assert item["position_ids"][0, 64 - length :].tolist() == list(range(length))

    # the chat prompt, expanded to 4 image tokens for a 56x56 image; raw ids keep one pad per image
    real_ids = item["input_ids"][64 - length :].tolist()
    assert real_ids.count(image_pad) == 4
    assert item["raw_prompt_ids"].count(image_pad) == 1
    assert len(item["raw_prompt_ids"]) == length - 3
    text = tokenizer.decode(item["raw_prompt_ids"])
    assert text.endswith(
        "<|vision_start|><|image_pad|><|vision_end|>What colour is the shape?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert item["ground_truth"] == row["answer"]
    images = item["multi_modal_data"]["images"]
    assert len(images) == 1 and images[0].mode == "RGB" and images[0].size == (56, 56)
    assert np.array_equal(np.asarray(images[0]), np.asarray(Image.open(tiny_dataset_dir / row["images"][0])))
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert item["multi_modal_inputs"]["pixel_values"].shape == (16, 3 * 2 * 14 * 14)


def test_text_rows_and_text_only_models(tmp_path, processor):
    data = _write_jsonl(tmp_path / "text.jsonl", [{"problem": "What is 3 + 4?", "answer": 7}])
    item = _dataset(data, processor)[0]
    assert item["multi_modal_data"] == {} and item["multi_modal_inputs"] == {}
    assert item["ground_truth"] == "7"
    assert item["position_ids"].shape == (4, 64)
    length = int(item["attention_mask"].sum())
    assert (item["position_ids"][:, -length:] == torch.arange(length)).all()

    text_only = RLDataset(str(data), processor.tokenizer, None, prompt_key="problem", max_prompt_length=32)
    item = text_only[0]
    assert item["position_ids"].shape == (32,)
    assert item["position_ids"][-length:].tolist() == list(range(length))
    assert item["input_ids"][-length:].tolist() == item["raw_prompt_ids"]

    images = _write_jsonl(tmp_path / "img.jsonl", [{"problem": "x", "answer": "y", "images": [_png_bytes().hex()]}])
    with pytest.raises(DataError, match=r"img\.jsonl line 1: .*no image processor"):
        RLDataset(str(images), processor.tokenizer, None, prompt_key="problem")


def test_format_prompt_wraps_the_raw_prompt(tiny_dataset_dir, processor):
    for name, marker in (("math.jinja", "\\boxed{}"), ("r1v.jinja", "<answer> </answer>")):
        template = str(REPO / "format_prompt" / name)
        dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor, format_prompt=template, max_prompt_length=256)
        text = processor.tokenizer.decode(dataset[0]["raw_prompt_ids"])
        user_turn = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        assert user_turn.startswith("<|vision_start|><|image_pad|><|vision_end|>What colour is the shape? ")
        assert marker in user_turn and "<think> </think>" in user_turn
    with pytest.raises(DataError, match="format prompt file .* does not exist"):
        _dataset(tiny_dataset_dir / "train.jsonl", processor, format_prompt="no/such.jinja")


def test_image_sources_and_resizing(tmp_path, processor):
    (tmp_path / "pics").mkdir()
    Image.new("RGBA", (300, 200), (10, 200, 10, 255)).save(tmp_path / "pics" / "wide.png")
    Image.new("L", (40, 30), 128).save(tmp_path / "pics" / "small.png")
    png = _png_bytes()
    path_rows = [
        {"problem": "<image>", "answer": "a", "images": ["wide.png"]},
        {
            "problem": "Two: <image> <image>",
            "answer": "b",
            "images": ["small.png", str(tmp_path / "pics" / "wide.png")],
        },
    ]
    (tmp_path / "data").mkdir()
    _write_jsonl(tmp_path / "data" / "paths.jsonl", path_rows)
    dict_rows = [  # the layout of a Hugging Face datasets Image column saved to parquet
        {"problem": "bytes", "answer": "c", "images": [{"bytes": png, "path": None}]},
        {"problem": "path dict", "answer": "d", "images": [{"bytes": None, "path": "small.png"}]},
    ]
    pq.write_table(pa.Table.from_pylist(dict_rows), tmp_path / "data" / "dicts.parquet")
    dataset = _dataset(tmp_path / "data", processor, image_dir=str(tmp_path / "pics"), max_prompt_length=128)
    assert [Path(dataset.row(i).source).name for i in range(4)] == ["dicts.parquet"] * 2 + ["paths.jsonl"] * 2
    bounds = VisionBounds(factor=28, min_pixels=56 * 56, max_pixels=112 * 112)
    for index, expected_sizes in enumerate([[(56, 56)], [(40, 30)], [(300, 200)], [(40, 30), (300, 200)]]):
        item = dataset[index]
        images = item["multi_modal_data"]["images"]
        grids = item["multi_modal_inputs"]["image_grid_thw"]
        for image, (width, height), grid in zip(images, expected_sizes, grids, strict=True):
            assert image.mode == "RGB"
            assert (image.height, image.width) == target_size(height, width, bounds)
            assert image.width % 28 == 0 and image.height % 28 == 0
            assert 56 * 56 <= image.width * image.height <= 112 * 112
            assert grid.tolist() == [1, image.height // 14, image.width // 14]  # the processor did not resize again
        # the processor's pixel values are those of the resized images, untouched by another resize
        again = processor.image_processor(images=images, do_resize=False, return_tensors="pt")
        assert torch.equal(again["pixel_values"], item["multi_modal_inputs"]["pixel_values"])
    # 300x200 shrinks into 112*112 pixels keeping 3:2 as well as 28-pixel steps allow
    assert dataset[2]["multi_modal_data"]["images"][0].size == (112, 84)


def test_smart_resize_is_the_processor_rule():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as reference

    bounds = VisionBounds(factor=28, min_pixels=3136, max_pixels=200_000)
    rng = np.random.default_rng(0)
    for height, width in rng.integers(20, 900, size=(200, 2)).tolist():
        expected = reference(height, width, factor=28, min_pixels=3136, max_pixels=200_000)
        assert smart_resize(height, width, bounds) == tuple(expected)
        fixed = target_size(height, width, bounds)
        assert smart_resize(*fixed, bounds) == fixed


def test_pixel_bounds_must_overlap_the_processor(tiny_dataset_dir, processor):
    with pytest.raises(DataError, match="min_pixels=262144 is larger than the image processor's maximum"):
        _dataset(tiny_dataset_dir / "train.jsonl", processor, min_pixels=262144, max_pixels=4194304)
    dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor, min_pixels=3136, max_pixels=3136)
    assert dataset[0]["multi_modal_data"]["images"][0].size == (56, 56)


def test_overlong_prompts_are_filtered_or_rejected(tmp_path, processor, capsys):
    Image.new("RGB", (112, 112), "red").save(tmp_path / "big.png")  # 16 image tokens
    Image.new("RGB", (56, 56), "red").save(tmp_path / "small.png")  # 4 image tokens
    rows = [{"problem": "<image>Colour?", "answer": "red", "images": [name]} for name in ("small.png", "big.png")] * 2
    data = _write_jsonl(tmp_path / "rows.jsonl", rows)
    short_length = int(_dataset(data, processor, max_prompt_length=128)[0]["attention_mask"].sum())

    dataset = _dataset(data, processor, max_prompt_length=short_length)
    assert len(dataset) == 2
    assert [dataset.row(i).index for i in range(2)] == [1, 3]
    out = capsys.readouterr().out
    assert "filtered 2 of 4 prompts" in out and "rows.jsonl line 2" in out and "rows.jsonl line 4" in out
    assert int(dataset[1]["attention_mask"].sum()) == short_length

    # with filtering off the over-long row is an error while loading (before any model loads), naming its token
    # count (16 of them vision tokens) and the two settings that fix it
    long_length = int(_dataset(data, processor, max_prompt_length=128)[1]["attention_mask"].sum())
    with pytest.raises(DataError) as error:
        _dataset(data, processor, max_prompt_length=short_length, filter_overlong_prompts=False)
    message = str(error.value)
    assert f"rows.jsonl line 2: the prompt is {long_length} tokens (16 of them for its images/videos)" in message
    assert "data.max_prompt_length" in message and "data.max_pixels" in message
    with pytest.raises(DataError, match="no usable rows"):
        _dataset(data, processor, max_prompt_length=8)


def test_bad_rows_are_reported_with_file_line_and_reason(tmp_path, processor):
    good = {"problem": "<image>Colour?", "answer": "red", "images": ["pic.png"]}
    Image.new("RGB", (56, 56), "red").save(tmp_path / "pic.png")
    data = _write_jsonl(tmp_path / "a.jsonl", [good, {"problem": "no answer"}])
    with pytest.raises(DataError, match=r"a\.jsonl line 2: missing key 'answer' \(data\.answer_key\)"):
        _dataset(data, processor)
    data = _write_jsonl(tmp_path / "b.jsonl", [good, {"question": "?", "answer": "x"}])
    with pytest.raises(DataError, match=r"b\.jsonl line 2: missing key 'problem'"):
        _dataset(data, processor)
    data = _write_jsonl(tmp_path / "c.jsonl", [good, {"problem": "?", "answer": ["x"]}])
    with pytest.raises(DataError, match=r"c\.jsonl line 2: 'answer' must be a string or a number"):
        _dataset(data, processor)

    (tmp_path / "broken.png").write_bytes(b"not a png")
    missing = {**good, "images": ["gone.png"]}
    broken = {**good, "images": ["broken.png"]}
    data = _write_jsonl(tmp_path / "d.jsonl", [good, missing, broken])
    for filter_overlong in (True, False):  # images are checked while loading either way
        with pytest.raises(DataError, match=r"d\.jsonl line 2: cannot read image 'gone\.png'.*does not exist"):
            _dataset(data, processor, filter_overlong_prompts=filter_overlong)
    data = _write_jsonl(tmp_path / "d2.jsonl", [good, broken])
    with pytest.raises(DataError, match=r"d2\.jsonl line 2: cannot read image 'broken\.png'"):
        _dataset(data, processor)
    data = _write_jsonl(tmp_path / "e.jsonl", [{**good, "problem": "<image><image>two markers"}])
    with pytest.raises(DataError, match=r"e\.jsonl line 1: the prompt has 2 <image> marker"):
        _dataset(data, processor)


def test_from_config_reads_dataconfig_fields(tiny_dataset_dir, tiny_qwen2_5_vl_dir, processor):
    config = SimpleNamespace(
        prompt_key="problem",
        answer_key="answer",
        image_key="images",
        video_key="videos",
        image_dir=None,
        max_prompt_length=48,
        format_prompt=None,
        min_pixels=3136,
        max_pixels=3136,
        filter_overlong_prompts=True,
        video_fps=2.0,
        override_chat_template=None,
        rollout_batch_size=4,  # unrelated fields are ignored
    )
    model_config = AutoConfig.from_pretrained(tiny_qwen2_5_vl_dir)
    files = str(tiny_dataset_dir / "val.jsonl")
    dataset = RLDataset.from_config(config, files, processor.tokenizer, processor, model_config)
    assert len(dataset) == 16 and dataset[3]["input_ids"].shape == (48,)
    # without a model config the m-rope settings come from the tokenizer's model directory
    without = RLDataset.from_config(config, files, processor.tokenizer, processor)
    assert torch.equal(without[3]["position_ids"], dataset[3]["position_ids"])


def test_override_chat_template(tiny_dataset_dir, processor, tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{% for m in messages %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endfor %}"
        " Answer:"
    )
    dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor, override_chat_template=str(template))
    text = processor.tokenizer.decode(dataset[0]["raw_prompt_ids"])
    assert text == "<|vision_start|><|image_pad|><|vision_end|>What colour is the shape? Answer:"


def test_video_rows_given_as_frame_lists(tmp_path, processor, tiny_qwen2_5_vl_dir):
    from transformers import AutoModelForImageTextToText

    frames = []
    for i in range(4):
        Image.new("RGB", (56, 56), (60 * i, 0, 0)).save(tmp_path / f"frame{i}.png")
        frames.append(f"frame{i}.png")
    data = _write_jsonl(
        tmp_path / "video.jsonl", [{"problem": "<video>Does it get brighter?", "answer": "yes", "videos": [frames]}]
    )
    item = _dataset(data, processor, video_fps=2.0)[0]
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert item["raw_prompt_ids"].count(video_pad) == 1
    video = item["multi_modal_data"]["videos"][0]
    assert video.shape == (4, 56, 56, 3) and video.dtype == np.uint8
    inputs = item["multi_modal_inputs"]
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert inputs["second_per_grid_ts"].tolist() == [1.0]  # temporal patch of 2 frames at 2 frames per second
    assert int((item["input_ids"] == video_pad).sum()) == 8
    # with a 2-second temporal step the text after the video (<|vision_end|> first) starts after the last frame
    mask = item["attention_mask"].bool()
    mrope = item["position_ids"][1:, mask]
    first_video = item["input_ids"][mask].tolist().index(video_pad)
    assert mrope[0, first_video + 4].item() == mrope[0, first_video].item() + 2
    assert mrope[:, first_video + 8].tolist() == [mrope[0, first_video].item() + 3] * 3
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen2_5_vl_dir)
    with torch.no_grad():
        logits = model(
            input_ids=item["input_ids"][mask][None], position_ids=item["position_ids"][:, mask][:, None], **inputs
        ).logits
    assert torch.isfinite(logits).all()


# ---------------------------------------------------------------------------------------------- collate


def test_collate_stacks_tensors_and_keeps_objects(tiny_dataset_dir, processor):
    dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor)
    batch = collate_fn([dataset[i] for i in range(3)])
    assert isinstance(batch, Batch) and len(batch) == 3
    assert batch["input_ids"].shape == (3, 64) and batch["position_ids"].shape == (3, 4, 64)
    objects = {"raw_prompt_ids", "multi_modal_data", "multi_modal_inputs", "ground_truth", "row_columns"}
    assert set(batch.non_tensors) == objects
    assert list(batch["row_columns"]) == [{}] * 3  # problem, answer and images are the dataset's own columns
    assert batch["ground_truth"].dtype == object and list(batch["ground_truth"]) == [
        dataset[i]["ground_truth"] for i in range(3)
    ]
    assert batch["raw_prompt_ids"][1] == dataset[1]["raw_prompt_ids"]
    assert torch.equal(
        batch["multi_modal_inputs"][2]["pixel_values"], dataset[2]["multi_modal_inputs"]["pixel_values"]
    )
    repeated = batch.repeat(2)
    assert list(repeated["ground_truth"][:2]) == [batch["ground_truth"][0]] * 2
    with pytest.raises(ValueError, match="row 1 has fields"):
        collate_fn([{"a": torch.zeros(2)}, {"b": torch.zeros(2)}])
    with pytest.raises(ValueError, match="cannot stack field 'a'"):
        collate_fn([{"a": torch.zeros(2)}, {"a": torch.zeros(3)}])


def test_torch_dataloader_batches(tiny_dataset_dir, processor):
    dataset = _dataset(tiny_dataset_dir / "train.jsonl", processor)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=collate_fn)
    batches = list(loader)
    assert len(batches) == 8 and all(len(batch) == 8 for batch in batches)


# ---------------------------------------------------------------------------------------------- demo data


def test_shape_dataset_is_deterministic_and_balanced(tmp_path, tiny_dataset_dir):
    again = build_shape_dataset(tmp_path / "again", num_train=64, num_val=16, seed=0)
    for name in ("train.jsonl", "val.jsonl", "images/train_00000.png", "images/val_00015.png"):
        assert (again / name).read_bytes() == (tiny_dataset_dir / name).read_bytes(), name
    other = build_shape_dataset(tmp_path / "other", num_train=64, num_val=16, seed=1)
    assert (other / "train.jsonl").read_bytes() != (again / "train.jsonl").read_bytes()

    rows = [json.loads(line) for line in (tiny_dataset_dir / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 64
    assert {row["problem"] for row in rows} == {PROMPT}
    counts = {colour: sum(row["answer"] == colour for row in rows) for colour in COLOURS}
    assert counts == {colour: 16 for colour in COLOURS}


def test_shape_images_show_the_answer_colour(tiny_dataset_dir):
    rows = [json.loads(line) for line in (tiny_dataset_dir / "train.jsonl").read_text().splitlines()]
    dominant = {"red": 0, "green": 1, "blue": 2}
    for row in rows:
        pixels = np.asarray(Image.open(tiny_dataset_dir / row["images"][0]).convert("RGB")).reshape(-1, 3).astype(int)
        assert Image.open(tiny_dataset_dir / row["images"][0]).size == (56, 56)
        coloured = pixels[(pixels.max(axis=1) - pixels.min(axis=1)) > 60]
        greys = pixels[(pixels.max(axis=1) - pixels.min(axis=1)) < 10]
        # a shape with side >= 0.5 of the image covers >= 1/8 of it (a triangle fills half its box); the rest
        # is a white or light grey background
        assert len(coloured) >= 0.1 * len(pixels), row
        assert len(greys) > 0 and greys.min() >= 210, row
        mean = coloured.mean(axis=0)
        if row["answer"] == "yellow":
            assert mean[0] > 150 and mean[1] > 150 and mean[2] < 100
        else:
            assert mean.argmax() == dominant[row["answer"]], (row, mean)


def test_ensure_demo_assets_builds_once_and_repairs_half_built_dirs(tmp_path):
    root = tmp_path / "demo"
    model_dir, data_dir = ensure_demo_assets(root, family="qwen2_5_vl")
    assert model_dir == root / "model" / "qwen2_5_vl" and data_dir == root / "data"
    assert (model_dir / "model.safetensors").is_file() and (data_dir / "train.jsonl").is_file()
    assert len((data_dir / "train.jsonl").read_text().splitlines()) == 2048
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_assets(root, family="qwen2_5_vl") == (model_dir, data_dir)
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt

    # an interrupted build (no completion marker) is rebuilt from scratch
    (data_dir / ".complete").unlink()
    (data_dir / "train.jsonl").write_text("partial")
    shutil.rmtree(data_dir / "images")
    ensure_demo_assets(root, family="qwen2_5_vl")
    assert len((data_dir / "train.jsonl").read_text().splitlines()) == 2048
    assert (data_dir / "images" / "train_02047.png").is_file()


def _write_video(path: Path, frames: int, fps: int) -> None:
    """An mp4 of a green square moving right on red, one step per frame."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for index in range(frames):
            image = np.zeros((64, 64, 3), np.uint8)
            image[:, :, 0] = 200
            image[20:36, 4 + 6 * index : 20 + 6 * index] = (0, 230, 0)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_sample_times_are_even_in_count_and_inside_the_video():
    from easyr1.data.video_file import sample_times

    assert sample_times(1.75, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert sample_times(1.0, 2.0) == [0.0, 0.5, 1.0, 1.0]  # 3 frames, padded to an even count
    assert sample_times(0.0, 2.0) == [0.0, 0.0]


def test_video_files_are_decoded_at_video_fps(tmp_path, processor):
    _write_video(tmp_path / "clip.mp4", frames=8, fps=4)  # frame times 0, 0.25, ..., 1.75 s
    data = _write_jsonl(tmp_path / "v.jsonl", [{"problem": "<video>Where does it go?", "answer": "right",
                                                 "videos": ["clip.mp4"]}])  # fmt: skip
    item = _dataset(data, processor, video_fps=2.0)[0]
    video = item["multi_modal_data"]["videos"][0]
    assert video.shape[0] == 4  # times 0, 0.5, 1.0, 1.5 s: source frames 0, 2, 4, 6
    # the square's column (green channel) moves 12 px per kept frame, resized with the frame
    columns = [int(np.argmax(frame[:, :, 1].astype(int).sum(axis=0))) for frame in video]
    steps = [b - a for a, b in zip(columns, columns[1:])]
    assert all(step > 0 for step in steps), columns
    assert item["multi_modal_inputs"]["video_grid_thw"][0, 0].item() == 2  # 4 frames in temporal pairs

    (tmp_path / "broken.mp4").write_bytes(b"not a video at all")
    broken = _write_jsonl(tmp_path / "b.jsonl", [{"problem": "<video>?", "answer": "x", "videos": ["broken.mp4"]}])
    with pytest.raises(DataError, match=r"b\.jsonl line 1: cannot decode video"):
        _dataset(broken, processor)
