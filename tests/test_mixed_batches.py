"""Batches that mix text-only, one-image, three-image and video rows, for every Qwen-VL family.

The dataset's m-rope positions are checked against each family's own transformers implementation, and vLLM
(in-process, as in the hybrid worker) generates for a whole mixed batch while the actor scores the same tokens:
both engines must agree on every row kind, which holds only if they place every vision and text token at the
same m-rope position and see the same pixels and prompt ids.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import single_rank_vllm_world
from PIL import Image
from transformers import AutoModelForImageTextToText

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import SamplingSettings
from easyr1.models.loading import load_model, load_model_config, load_tokenizer_and_processor
from easyr1.models.rope import extend_position_ids
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import COLOURS, MIXED_KINDS, build_mixed_dataset
from easyr1.tools.tiny_model import VISION_FAMILIES as FAMILIES
from easyr1.workers.actor import forward_inputs, response_log_probs


NUM_ROWS = 8  # every kind twice
MAX_PROMPT_LENGTH = 96  # the longest prompt is Qwen3-VL's video row (71 tokens with its frame timestamps)
RESPONSE_LENGTH = 8
GAP_LIMIT = 1e-4  # fp32 engines that agree land near 1e-6; one misplaced position costs about 1e-3 here


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mixed_dataset(tmp_path_factory.mktemp("mixed"), num_rows=NUM_ROWS, seed=0)


def _rows(data_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]


def _kind(row: dict) -> str:
    if "videos" in row:
        return "video"
    return {0: "text", 1: "image", 3: "three_images"}[len(row.get("images", []))]


def _shape_pixels(image: Image.Image) -> np.ndarray:
    """(N, 3) colours of the shape: the saturated pixels (the backgrounds are grey levels)."""
    array = np.asarray(image.convert("RGB"), dtype=np.int64).reshape(-1, 3)
    return array[array.max(axis=1) - array.min(axis=1) > 60]


# pure hues: the drawn colours are jittered shades, each nearest to its own word's hue
_HUES = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


def _colour_of(image: Image.Image) -> str:
    mean = _shape_pixels(image).mean(axis=0)
    return min(COLOURS, key=lambda colour: float(np.sum((mean - np.array(_HUES[colour])) ** 2)))


def _shape_centre_x(image: Image.Image) -> float:
    array = np.asarray(image.convert("RGB"), dtype=np.int64)
    saturated = array.max(axis=2) - array.min(axis=2) > 60
    return float(np.nonzero(saturated)[1].mean())


# ------------------------------------------------------------------------------------------- the dataset builder


def test_mixed_rows_cycle_the_kinds_and_show_the_answer(mixed_dir):
    rows = _rows(mixed_dir)
    assert [_kind(row) for row in rows] == [MIXED_KINDS[i % 4] for i in range(NUM_ROWS)]
    for row in rows:
        assert row["answer"] in COLOURS
        if _kind(row) == "text":
            assert "<image>" not in row["problem"] and "<video>" not in row["problem"]
            continue
        if _kind(row) in ("image", "three_images"):
            images = [Image.open(mixed_dir / path) for path in row["images"]]
            assert row["problem"].count("<image>") == len(images)
            assert all(image.size == (56, 56) for image in images)
            assert _colour_of(images[0]) == row["answer"]  # the first shape is the one asked about
            continue
        assert row["problem"].startswith("<video>")
        (frame_paths,) = row["videos"]
        frames = [Image.open(mixed_dir / path) for path in frame_paths]
        assert len(frames) == 4 and all(frame.size == (56, 56) for frame in frames)
        assert all(_colour_of(frame) == row["answer"] for frame in frames)
        # one shape moving right by the same step each frame, never cut off by the border
        centres = [_shape_centre_x(frame) for frame in frames]
        steps = np.diff(centres)
        assert steps.min() > 0 and np.allclose(steps, steps[0])
        assert len({len(_shape_pixels(frame)) for frame in frames}) == 1


def test_mixed_dataset_is_reproducible(tmp_path, mixed_dir):
    again = build_mixed_dataset(tmp_path / "again", num_rows=NUM_ROWS, seed=0)
    other = build_mixed_dataset(tmp_path / "other", num_rows=NUM_ROWS, seed=1)
    assert (again / "train.jsonl").read_bytes() == (mixed_dir / "train.jsonl").read_bytes()
    names = sorted(path.name for path in (mixed_dir / "images").iterdir())
    assert names == sorted(path.name for path in (again / "images").iterdir())
    assert all((again / "images" / n).read_bytes() == (mixed_dir / "images" / n).read_bytes() for n in names)
    assert any((other / "images" / n).read_bytes() != (mixed_dir / "images" / n).read_bytes() for n in names)
    with pytest.raises(ValueError, match="num_rows"):
        build_mixed_dataset(tmp_path / "bad", num_rows=-1)


# ------------------------------------------------------------------------------- dataset positions per family


def _mixed_dataset(model_dir: Path, data_dir: Path) -> RLDataset:
    """The mixed rows for ``model_dir``, images sized by the family's own processor bounds."""
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    return RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=MAX_PROMPT_LENGTH,
        model_config=load_model_config(str(model_dir)),
    )


def _transformers_positions(model, item: dict) -> torch.Tensor:
    """(3, L) m-rope positions the family's transformers model computes for a dataset item's real tokens."""
    ids = item["input_ids"][item["attention_mask"].bool()][None]
    token_types = torch.zeros_like(ids)  # transformers 5.x: 1 marks image tokens, 2 video tokens
    token_types[ids == model.config.image_token_id] = 1
    token_types[ids == model.config.video_token_id] = 2
    grids = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
    kwargs = {key: value for key, value in item["multi_modal_inputs"].items() if key in grids}
    positions, _ = model.model.get_rope_index(ids, mm_token_type_ids=token_types, **kwargs)
    return positions[:, 0]


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch_collates_and_positions_match_transformers(family, tiny_model_dir, mixed_dir):
    model_dir = tiny_model_dir(family)
    dataset = _mixed_dataset(model_dir, mixed_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    config = model.config
    items = [dataset[i] for i in range(len(dataset))]
    kinds = [_kind(row) for row in _rows(mixed_dir)]
    assert len(items) == NUM_ROWS

    batch = collate_fn(items)
    assert batch["input_ids"].shape == (NUM_ROWS, MAX_PROMPT_LENGTH)
    assert batch["position_ids"].shape == (NUM_ROWS, 4, MAX_PROMPT_LENGTH)
    # the actor's forward gets every row's vision inputs, concatenated in row order
    vision = forward_inputs(batch)
    assert vision["image_grid_thw"].shape[0] == kinds.count("image") + 3 * kinds.count("three_images")
    assert vision["video_grid_thw"].shape[0] == kinds.count("video")

    for kind, item in zip(kinds, items):
        raw = item["raw_prompt_ids"]
        inputs = item["multi_modal_inputs"]
        if kind == "text":
            assert inputs == {} and item["multi_modal_data"] == {}
        elif kind == "video":
            assert raw.count(config.video_token_id) == 1 and config.image_token_id not in raw
            assert inputs["video_grid_thw"].tolist()[0][0] == 2  # 4 frames in temporal pairs
            assert item["multi_modal_data"]["videos"][0].shape[0] == 4
            assert item["multi_modal_data"]["video_metadata"][0]["fps"] == 2.0
        else:
            count = 1 if kind == "image" else 3
            assert raw.count(config.image_token_id) == count and inputs["image_grid_thw"].shape == (count, 3)

        ours = item["position_ids"][1:, item["attention_mask"].bool()]
        theirs = _transformers_positions(model, item)
        if kind != "video" or family != "qwen2_5_vl":
            assert torch.equal(ours, theirs), (family, kind)
            continue
        # The known difference: transformers 5.19 continues the text after a Qwen2.5-VL video at the video's
        # spatial extent, vLLM (and the original Qwen code) at the largest position so far + 1. The temporal
        # positions step by tokens_per_second * second_per_grid_ts = 2 here, so the two differ; the dataset follows
        # vLLM, which samples the responses (the vLLM test below shows that this is the rule that agrees).
        ids = item["input_ids"][item["attention_mask"].bool()]
        after = int(torch.nonzero(ids == config.video_token_id).max()) + 1
        assert torch.equal(ours[:, :after], theirs[:, :after])
        assert ours[:, after].tolist() == [int(ours[:, :after].max()) + 1] * 3
        shift = ours[:, after:] - theirs[:, after:]
        assert torch.all(shift == shift[0, 0]) and shift[0, 0] > 0

    video_text = dataset.tokenizer.decode(items[kinds.index("video")]["input_ids"])
    if family == "qwen3_vl":  # each temporal pair of frames is announced by its time in the prompt (fps 2)
        assert "<0.2 seconds>" in video_text and "<1.2 seconds>" in video_text
    if family == "qwen2_5_vl":
        assert items[kinds.index("video")]["multi_modal_inputs"]["second_per_grid_ts"].tolist() == [1.0]


# --------------------------------------------------------------------------------- vLLM against the actor


@pytest.fixture(scope="module")
def engine_world():
    """A one-rank gloo world plus the environment vLLM's external launcher and CPU backend read.

    Module-scoped: vLLM keeps its parallel state per process, so the engines of all families share one world,
    which vLLM's own teardown removes again at the end (the environment is restored too).
    """
    with single_rank_vllm_world(VLLM_CPU_KVCACHE_SPACE="1"):
        yield


def _generate_with_vllm(model_dir: Path, prompts: Batch, banned_token_ids: list[int]) -> Batch:
    """Sample RESPONSE_LENGTH tokens per row with a fresh in-process engine, then shut the engine down.

    ``VLLMEngine.generate`` itself raises unless the prompt ids vLLM expanded equal the dataset's ``input_ids``.
    """
    from easyr1.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        str(model_dir),
        str(model_dir),
        dtype=torch.float32,
        max_model_len=MAX_PROMPT_LENGTH + RESPONSE_LENGTH,
        tensor_parallel_size=1,
        seed=0,
        pad_token_id=0,
        banned_token_ids=banned_token_ids,
    )
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    output = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
    # the engine must be gone before the next family's engine sets up vLLM's parallel groups again
    del engine
    gc.collect()
    return output


def _gaps(log_probs: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per row, the largest |actor - vLLM| log-prob over the response tokens."""
    mask = batch["response_mask"].bool()
    return ((log_probs - batch["rollout_log_probs"]).abs() * mask).amax(dim=-1)


# vLLM-CPU's GatedDeltaNet kernel asserts bf16 inputs; this test compares fp32 engines (docs: model support)
VLLM_FP32_FAMILIES = [
    pytest.param(family, marks=pytest.mark.skip(reason="vLLM-CPU runs Qwen3.5's GatedDeltaNet in bf16 only"))
    if family == "qwen3_5"
    else family
    for family in FAMILIES
]


@pytest.mark.vllm
@pytest.mark.parametrize("family", VLLM_FP32_FAMILIES)
def test_vllm_and_actor_log_probs_agree_on_every_row_kind(family, tiny_model_dir, mixed_dir, engine_world):
    model_dir = tiny_model_dir(family)
    dataset = _mixed_dataset(model_dir, mixed_dir)
    prompts = collate_fn([dataset[i] for i in range(len(dataset))])
    kinds = [_kind(row) for row in _rows(mixed_dir)]
    config = load_model_config(str(model_dir))
    banned = [config.image_token_id, config.video_token_id]

    batch = _generate_with_vllm(model_dir, prompts, banned)
    assert bool(batch["response_mask"].all())  # ignore_eos: every row scores RESPONSE_LENGTH tokens
    model = load_model(str(model_dir), torch.float32).eval()
    with torch.no_grad():
        whole, _ = response_log_probs(model, batch, 1.0, banned_token_ids=banned)
        packed, _ = response_log_probs(model, batch, 1.0, banned_token_ids=banned, padding_free=True)
        single = torch.cat(
            [response_log_probs(model, batch.index([row]), 1.0, banned_token_ids=banned)[0] for row in range(NUM_ROWS)]
        )
    gaps = {name: _gaps(values, batch) for name, values in (("whole", whole), ("single", single), ("packed", packed))}
    report = {
        name: {kind: max(float(gap[row]) for row in range(NUM_ROWS) if kinds[row] == kind) for kind in MIXED_KINDS}
        for name, gap in gaps.items()
    }
    print(f"{family} max |actor - vLLM| log-prob per micro-batching and row kind: {report}")
    assert all(value < GAP_LIMIT for per_kind in report.values() for value in per_kind.values()), report

    if family == "qwen2_5_vl":
        # Scoring the video rows with transformers' own positions (the known difference above) is clearly off:
        # the check above really tells the two placements of the text after a video apart.
        video_rows = [row for row in range(NUM_ROWS) if kinds[row] == "video"]
        video = batch.index(video_rows)
        positions = prompts["position_ids"][video_rows].clone()
        for index, row in enumerate(video_rows):
            mask = prompts["attention_mask"][row].bool()
            item = {"input_ids": prompts["input_ids"][row], "attention_mask": mask.long()}
            item["multi_modal_inputs"] = prompts["multi_modal_inputs"][row]
            positions[index, 1:, mask] = _transformers_positions(model, item)
        video["position_ids"] = extend_position_ids(positions, RESPONSE_LENGTH)
        with torch.no_grad():
            shifted, _ = response_log_probs(model, video, 1.0, banned_token_ids=banned)
        misplaced = float(_gaps(shifted, video).max())
        print(f"{family} video rows scored with transformers' own positions: max gap {misplaced:.2e}")
        assert misplaced > GAP_LIMIT
