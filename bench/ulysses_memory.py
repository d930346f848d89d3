"""Host memory of one update per rank under Ulysses sequence parallelism, against the memory plan.

N gloo ranks (N = 1, 2, 4, each size its own set of processes forked from this one) each build the actor as a worker
does: a Qwen2.5-VL of tiny widths whose activations dwarf its weights (language model 256 wide, 4 layers; vision
tower 128 wide, 4 blocks, so that its activations per image token are of the order of the decoder's, as in the real
7B), FSDP2-sharded over the N ranks, fp32, AdamW, with ``sequence_parallel.install`` on a group of all N ranks.
The batch: ONE prompt of ``--images`` random images at 224 x 224 (64 image tokens each) and a line of text, with 4
random responses of ``--response-length`` tokens (GRPO's n = 4, so that 1, 2 and 4 ranks each get whole rows; every
group pools the same 4 rows), one micro-batch, padding-free, prompts not shared (the plan counts every sample's
prompt).

Each rank runs one update to allocate the optimizer states and gradients, hands freed heap back (``malloc_trim``),
resets its ``VmHWM`` (``/proc/self/clear_refs``), notes its ``VmRSS``, runs a second update and reads ``VmHWM``
again: the difference is the update's own peak (activations, mask, logits, the pooled rows, the gathered FSDP units,
the gradients' buffers), per rank. The plan's figure beside it is ``plan.activations.update_activations`` for the
same micro-batch and ulysses size (what the plan adds on top of the model states).

``--vision both`` (default) measures the vision tower run on every image by every rank (``redundant``) and split
across the group (``split``, each rank encoding a share of the images), interleaved; ``--mask`` chooses the packed
row's attention mask (``dense``: T x T booleans; ``virtual``, the default: a zero-stride view, see
``workers/block_attention.py``).

    PYTHONPATH=$PWD .venv/bin/python bench/ulysses_memory.py [--sizes 1 2 4] [--images 24] [--response-length 64]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "ulysses_bench"
RESULTS = REPO / "bench" / "results"
MB = 2**20
SAMPLES = 4  # responses of the one prompt: the pooled micro-batch of every group size
IMAGE_SIDE = 224
TEXT = {"hidden_size": 256, "num_layers": 4, "intermediate_size": 768}
VISION = {"depth": 4, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "fullatt_block_indexes": [1, 3]}


def build_model(directory: Path) -> Path:
    """The tiny Qwen2.5-VL with the wider language model of ``TEXT`` and the deeper, wider tower of ``VISION``."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from easyr1.models.families import family_of
    from easyr1.tools.tiny_model import build_tiny_model

    if (directory / "done").exists():
        return directory
    build_tiny_model(directory, family="qwen2_5_vl", seed=0, **TEXT)
    config = AutoConfig.from_pretrained(directory)
    for key, value in VISION.items():
        setattr(config.vision_config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    family_of(config).save_pretrained(model, directory)
    processor_file = directory / "processor_config.json"  # the tiny processor's bounds stop at 112 x 112
    settings = json.loads(processor_file.read_text())
    settings["image_processor"]["size"]["longest_edge"] = IMAGE_SIDE * IMAGE_SIDE
    processor_file.write_text(json.dumps(settings, indent=2))
    (directory / "done").write_text("")
    return directory


def build_data(directory: Path, images: int) -> Path:
    """One jsonl row: ``images`` random 224 x 224 images, then a question."""
    import numpy as np
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    names = []
    for index in range(images):
        name = f"image_{index:03d}.png"
        if not (directory / name).exists():
            pixels = generator.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(directory / name)
        names.append(name)
    row = {"problem": "<image>" * images + "Which of these images is brightest?", "answer": "1", "images": names}
    path = directory / f"long_{images}.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def update_batch(model_dir: Path, data_file: Path, response_length: int):
    """The prompt with ``SAMPLES`` random responses, advantages and old log-probs."""
    from easyr1.data import RLDataset, collate_fn
    from easyr1.engines.base import pack_responses
    from easyr1.models.loading import load_model_config, load_tokenizer_and_processor

    tokenizer, processor = load_tokenizer_and_processor(str(model_dir))
    dataset = RLDataset(
        str(data_file),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=8192,
        min_pixels=IMAGE_SIDE * IMAGE_SIDE,
        max_pixels=IMAGE_SIDE * IMAGE_SIDE,
        model_config=load_model_config(str(model_dir)),
    )
    batch = collate_fn([dataset[0]]).repeat(SAMPLES)
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 300, (SAMPLES, response_length), generator=generator).tolist()
    batch = pack_responses(batch, responses, [[0.0] * response_length] * SAMPLES, response_length, 0)
    batch["advantages"] = torch.randn(SAMPLES, response_length, generator=generator)
    batch["old_log_probs"] = -torch.rand(SAMPLES, response_length, generator=generator) * 5
    fields = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "multi_modal_inputs")
    return batch.select(*fields, "advantages", "old_log_probs")


def actor_config():
    from easyr1.config import load_config

    config = load_config([f"config={REPO / 'examples' / 'config_cpu.yaml'}"], validate=False).worker.actor
    config.padding_free, config.share_prompt, config.dynamic_batching = True, False, True
    config.micro_batch_size_per_device_for_update = SAMPLES
    config.entropy_coeff, config.ppo_epochs, config.use_torch_compile = 0.0, 1, False
    return config


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _rank(rank: int, size: int, port: int, args: dict, out_dir: str) -> None:
    from easyr1.distributed import sequence_parallel
    from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
    from easyr1.models.loading import load_model
    from easyr1.workers import block_attention
    from easyr1.workers.actor import Actor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    try:
        block_attention.VIRTUAL_CAUSAL_MASK = args["mask"] == "virtual"
        batch = torch.load(args["batch"], weights_only=False)
        own = batch.index(list(range(rank * SAMPLES // size, (rank + 1) * SAMPLES // size)))
        del batch
        torch.manual_seed(0)
        model = load_model(args["model"], torch.float32)
        shard_model(model, data_parallel_mesh("cpu"))
        group = sequence_parallel.SequenceParallelGroup(size)
        group.split_vision = args["vision"] == "split"
        sequence_parallel.install(model, group)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        actor = Actor(model, actor_config(), optimizer, banned_token_ids=[model.config.image_token_id])
        actor.update_policy(own, 1.0, len(own))  # optimizer states and gradients allocated
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        dist.barrier()
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        actor.update_policy(own, 1.0, len(own))
        seconds = time.perf_counter() - start
        peak = _status_kib("VmHWM")
        result = {"rank": rank, "before_mb": before / 1024, "update_mb": (peak - before) / 1024, "seconds": seconds}
        # the log-prob pass (no graph) the same way: its peak over the RSS before it
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        dist.barrier()
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kib("VmRSS")
        actor.compute_log_probs(own, 1.0, SAMPLES)
        result["log_probs_mb"] = (_status_kib("VmHWM") - before) / 1024
        (Path(out_dir) / f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure(size: int, args: dict) -> list[dict]:
    """Every rank's result with ``size`` ranks forked from this process."""
    from easyr1.distributed.local_group import loopback_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_rank, args=(size, loopback_port(), args, out_dir), nprocs=size, start_method="fork")
        return [json.loads((Path(out_dir) / f"{rank}.json").read_text()) for rank in range(size)]


def planned(model_dir: Path, batch, size: int, mask: str) -> tuple[float, float]:
    """The plan's activations per rank (MB) of the update and of the log-prob pass for the bench's micro-batch (the
    vision tower split, as the code runs it; a dense mask planned as a shared-prompt row's, which is dense)."""
    from easyr1.models.loading import load_model_config
    from easyr1.plan.activations import MicroBatch, experience_activations, update_activations
    from easyr1.plan.model_size import measure_model

    config = load_model_config(str(model_dir))
    prompt = int(batch["attention_mask"][0].sum()) - int(batch["response_mask"][0].sum())
    images = len(batch["multi_modal_inputs"][0]["image_grid_thw"])
    micro = MicroBatch(SAMPLES, prompt, batch["responses"].shape[-1], images)
    common = {
        "padding_free": True,
        "flash": False,
        "max_pixels": IMAGE_SIDE * IMAGE_SIDE,
        "share_prompt": mask == "dense",
        "ulysses_size": size,
    }
    size_ = measure_model(config)
    update = update_activations(
        size_, micro, 4, checkpointing=False, vision_trainable=True, entropy_bonus=False, **common
    )
    log_probs = experience_activations(size_, micro, 4, **common)
    return update.total / MB, log_probs.total / MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--vision", choices=("redundant", "split", "both"), default="both")
    parser.add_argument("--mask", choices=("dense", "virtual"), default="virtual")
    options = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model_dir = build_model(CACHE / "model")
    data_file = build_data(CACHE / "data", options.images)
    batch = update_batch(model_dir, data_file, options.response_length)
    tokens = int(batch["attention_mask"].sum())
    shape = f"{options.images} images x {SAMPLES} responses of {options.response_length} tokens"
    print(f"one prompt of {shape}: {tokens} tokens in the pooled micro-batch")
    variants = ["redundant", "split"] if options.vision == "both" else [options.vision]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        batch_path = Path(work) / "batch.pt"
        torch.save(batch, batch_path)
        for size in options.sizes:
            for vision in variants if size > 1 else variants[:1]:
                args = {"model": str(model_dir), "batch": str(batch_path), "vision": vision, "mask": options.mask}
                ranks = measure(size, args)
                worst = max(ranks, key=lambda rank: rank["update_mb"])
                plan = planned(model_dir, batch, size, options.mask) if vision == "split" or size == 1 else None
                rows.append(
                    {
                        "N": size,
                        "vision": vision if size > 1 else "-",
                        "update_mb": worst["update_mb"],
                        "ranks_mb": [round(rank["update_mb"], 1) for rank in ranks],
                        "seconds": max(rank["seconds"] for rank in ranks),
                        "plan_mb": plan[0] if plan else None,
                        "log_probs_mb": max(rank["log_probs_mb"] for rank in ranks),
                        "plan_log_probs_mb": plan[1] if plan else None,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    base = next(row for row in rows if row["N"] == 1)
    print(f"\nmask={options.mask}; update = peak RSS of the update minus RSS before it, the largest rank")
    header = ("N", "vision", "update MB", "/ N=1", "plan MB", "/ N=1", "plan/meas", "s")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (2, 9, 10, 6, 8, 6, 9, 6))))
    for row in rows:
        plan = row["plan_mb"]
        planned_columns = (
            f"{plan:>8.1f} {plan / base['plan_mb']:>6.2f} {plan / row['update_mb']:>9.2f}"
            if plan is not None
            else f"{'-':>8} {'-':>6} {'-':>9}"
        )
        print(
            f"{row['N']:>2} {row['vision']:>9} {row['update_mb']:>10.1f} {row['update_mb'] / base['update_mb']:>6.2f} "
            f"{planned_columns} {row['seconds']:>6.1f}"
        )
    print("\nthe log-prob pass (no graph): peak RSS minus RSS before it, the largest rank")
    print(
        " ".join(
            f"{name:>{width}}" for name, width in zip(("N", "vision", "MB", "plan MB", "plan/meas"), (2, 9, 8, 8, 9))
        )
    )
    for row in rows:
        plan = row["plan_log_probs_mb"]
        ratio = f"{plan:>8.1f} {plan / row['log_probs_mb']:>9.2f}" if plan is not None else f"{'-':>8} {'-':>9}"
        print(f"{row['N']:>2} {row['vision']:>9} {row['log_probs_mb']:>8.1f} {ratio}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"ulysses-memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"options": vars(options), "tokens": tokens, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
