"""Bytes moved between the driver and the workers per training step, with the sample cache off and on.

Two Ray workers (the real ``WorkerGroup`` and ``Worker`` base, lightweight actors without models) go through a
GRPO step's calls as ``Trainer.train_step`` makes them: ``generate`` on the prompts repeated ``n`` times, the
balancing reorder, ``compute_old_log_probs``, ``compute_ref_log_probs``, ``update_actor``. The workers answer with
outputs of the real shapes (``pack_responses`` for generation, (B, R) log-probs, a metrics dict), so what travels
is what a run with models moves; only the compute is left out. Prompts carry ``images`` synthetic images of
``--side`` pixels with Qwen2.5-VL's processed shapes (``(side/14)^2`` patches of 1176 floats, one PIL image for
vLLM), ``n`` samples each. Bytes are the driver's counts (``perf/bytes_to_workers`` / ``perf/bytes_from_workers``:
tensors by storage, objects shared by rows once per message, images by pixels) of the second of two steps.

    python bench/bench_transfer.py [--prompts 8 32] [--images 1 2] [--n 5] [--side 224] [--response 256]

Bytes grow linearly with prompts, n and image pixels, so EasyR1's scale (512 prompts x 5, 1-4 MB of pixel values
per image) is this table scaled up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
import torch
from PIL import Image

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.balance import balanced_order
from easyr1.engines.base import pack_responses
from easyr1.main import closed_local_cluster
from easyr1.protocol import ACTOR_FIELDS, Batch


PATCH_FLOATS = 3 * 2 * 14 * 14  # channels x temporal patch x 14 x 14, Qwen2.5-VL's processed patch
TEXT_TOKENS = 64


class TransferProbe(Worker):
    """Answers the step's calls with outputs of the real shapes, without a model."""

    def generate(self, prompts: Batch, sampling: dict) -> Batch:
        generator = torch.Generator().manual_seed(int(prompts["sample_seed"][0]))
        length = sampling["max_tokens"]
        lengths = torch.randint(length // 4, length + 1, (len(prompts),), generator=generator).tolist()
        ids = [torch.randint(0, 1000, (n,), generator=generator).tolist() for n in lengths]
        return pack_responses(prompts, ids, [[-1.0] * len(row) for row in ids], length, pad_token_id=0)

    def compute_old_log_probs(self, batch: Batch, temperature: float) -> Batch:
        return Batch(tensors={"old_log_probs": -batch["response_mask"].float()})

    def compute_ref_log_probs(self, batch: Batch, temperature: float) -> Batch:
        return Batch(tensors={"ref_log_probs": -batch["response_mask"].float()})

    def update_actor(self, batch: Batch, temperature: float, mini_batch_size: int) -> dict[str, float]:
        return {"actor/pg_loss": float(batch["advantages"].sum()), "actor/grad_norm": 1.0}


def prompt_batch(prompts: int, images: int, side: int) -> Batch:
    """``prompts`` left-padded prompts, each with ``images`` images of ``side`` pixels (processed and raw)."""
    patches = (side // 14) ** 2
    length = TEXT_TOKENS + images * patches // 4  # 2x2 patches merge into one token
    generator = torch.Generator().manual_seed(0)
    rows_vision, rows_images = [], []
    for _ in range(prompts):
        rows_vision.append(
            {
                "pixel_values": torch.randn(images * patches, PATCH_FLOATS, generator=generator),
                "image_grid_thw": torch.tensor([[1, side // 14, side // 14]] * images),
            }
        )
        rows_images.append({"images": [Image.new("RGB", (side, side), (i * 40, 90, 200)) for i in range(images)]})
    return Batch(
        tensors={
            "input_ids": torch.randint(0, 1000, (prompts, length), generator=generator),
            "attention_mask": torch.ones(prompts, length, dtype=torch.long),
            "position_ids": torch.arange(length).expand(prompts, 4, length).clone(),
        },
        non_tensors={
            "raw_prompt_ids": [list(range(TEXT_TOKENS + images)) for _ in range(prompts)],
            "multi_modal_data": rows_images,
            "multi_modal_inputs": rows_vision,
            "ground_truth": ["red"] * prompts,
        },
    )


def one_step(group: WorkerGroup, prompts: Batch, n: int, response: int, step: int) -> dict[str, dict[str, int]]:
    """The driver side of one GRPO step with a reference; returns per-call bytes (to, from) and the totals."""
    group.open_step()
    batch = prompts.repeat(n)
    batch["uid"] = np.array([f"{step}-{i // n}" for i in range(len(batch))], dtype=object)
    batch["sample_seed"] = torch.arange(len(batch)) + step * len(batch)
    batch["sample_id"] = torch.arange(len(batch)) + step * len(batch)
    if group.router is None:  # as before the cache: the vision tensors go to generation too
        batch = group.run_split(TransferProbe.generate, batch, {"max_tokens": response})
    else:  # as the trainer does with a vLLM engine, which reads the images instead
        vision = batch.pop("multi_modal_inputs")["multi_modal_inputs"]
        batch = group.run_split(TransferProbe.generate, batch, {"max_tokens": response})
        batch["multi_modal_inputs"] = vision
    batch = batch.index(balanced_order(batch["attention_mask"].sum(dim=-1).tolist(), group.num_workers))
    view = batch.select(*ACTOR_FIELDS)
    batch = batch.union(group.run_split(TransferProbe.compute_old_log_probs, view, 1.0))
    batch = batch.union(group.run_split(TransferProbe.compute_ref_log_probs, view, 1.0))
    batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
    update = batch.select(*ACTOR_FIELDS, "old_log_probs", "ref_log_probs", "advantages")
    group.run_split(TransferProbe.update_actor, update, 1.0, len(batch) // group.num_workers)
    calls = {t.method: {"to": t.bytes_to_workers, "from": t.bytes_from_workers} for t in group.transfers}
    totals = group.finish_step()
    calls["step"] = {"to": int(totals["perf/bytes_to_workers"]), "from": int(totals["perf/bytes_from_workers"])}
    return calls


def megabytes(count: int) -> str:
    return f"{count / 1e6:9.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--images", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--side", type=int, default=224, help="image side in pixels (a multiple of 28)")
    parser.add_argument("--response", type=int, default=256, help="response length (tokens)")
    args = parser.parse_args()

    with closed_local_cluster():  # loopback only, Ray's token required: as easyr1.main starts its cluster
        ray.init(num_cpus=2, object_store_memory=768 * 1024**2, include_dashboard=False, logging_level="ERROR")
    group = WorkerGroup(TransferProbe, 2)
    started = time.perf_counter()
    rows, breakdown = [], None
    try:
        for prompts in args.prompts:
            for images in args.images:
                batch = prompt_batch(prompts, images, args.side)
                measured = {}
                for cache in (False, True):  # interleaved, on the same batch
                    router = group.router
                    group.router = router if cache else None
                    try:
                        for step in (1, 2):
                            measured[cache] = one_step(group, batch, args.n, args.response, step)
                    finally:
                        group.router = router
                rows.append((prompts, images, measured))
                breakdown = measured
    finally:
        group.shutdown()
        ray.shutdown()

    print(f"\nbytes moved per GRPO step (with reference), 2 workers, n={args.n}, {args.side}px images, "
          f"{args.response}-token responses; MB (1e6 bytes), second of two steps")  # fmt: skip
    print(f"{'prompts x n':>12} {'images':>6} | {'to, off':>9} {'to, on':>9} {'ratio':>6} | "
          f"{'from, off':>9} {'from, on':>9} {'ratio':>6}")  # fmt: skip
    for prompts, images, measured in rows:
        off, on = measured[False]["step"], measured[True]["step"]
        print(
            f"{f'{prompts} x {args.n}':>12} {images:>6} | {megabytes(off['to'])} {megabytes(on['to'])} "
            f"{off['to'] / max(on['to'], 1):6.1f} | {megabytes(off['from'])} {megabytes(on['from'])} "
            f"{off['from'] / max(on['from'], 1):6.1f}"
        )
    print("\nper call, last row (MB to workers / from workers), cache off -> on:")
    for method in breakdown[False]:
        off, on = breakdown[False][method], breakdown[True][method]
        print(f"  {method:>22}: {megabytes(off['to'])} / {megabytes(off['from'])}  ->  "
              f"{megabytes(on['to'])} / {megabytes(on['from'])}")  # fmt: skip
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
