"""AdamW's step on FSDP2's DTensors, by kernel (``worker.actor.optim.implementation``): time and agreement.

The peer benchmark's two models (``bench/peer_bench.py``: 0.64 M and 14.9 M parameters, vision tower included) are
loaded and sharded as a worker shards them (one gloo rank, fp32), once per implementation: ``for-loop`` (torch's
choice for host tensors), ``foreach`` and ``fused``. Every repetition gives every copy the same random gradients
and times its ``optimizer.step()`` (the copies take turns, so machine drift touches all alike); medians and the
ratio to the for-loop are printed. After the last step each copy's weights are compared with the for-loop's:
foreach should agree bit for bit, fused to rounding.

    python bench/bench_optimizer.py [--sizes 0.6M,15M] [--steps 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from peer_bench import SIZES, ensure_assets

from easyr1.config import OptimConfig
from easyr1.config.actor import ADAMW_IMPLEMENTATIONS, FSDPConfig
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.distributed.precision import resolve_precision
from easyr1.models.loading import load_model
from easyr1.workers.optim import build_optimizer


def sharded(model_dir: str) -> torch.nn.Module:
    """The model in fp32, sharded over the one-rank mesh as a CPU worker shards its actor."""
    precision = resolve_precision(FSDPConfig(), "cpu", "actor")
    return shard_model(load_model(model_dir, precision.storage), data_parallel_mesh("cpu"))


def time_size(model_dir: str, steps: int) -> dict[str, dict]:
    """Per implementation: step times (the first two dropped) and its weights' largest gap to the for-loop's."""
    runs = {}
    for name in ADAMW_IMPLEMENTATIONS:
        model = sharded(model_dir)
        optimizer = build_optimizer(model.parameters(), OptimConfig(implementation=name, lr=1e-5, weight_decay=0.0))
        runs[name] = {"model": model, "optimizer": optimizer, "times": []}
    parameters = {name: list(run["model"].parameters()) for name, run in runs.items()}
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        gradients = [torch.randn(param.shape, generator=generator) for param in parameters["for-loop"]]
        order = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in order:
            for param, gradient in zip(parameters[name], gradients):
                param.grad = torch.distributed.tensor.distribute_tensor(gradient, param.device_mesh, param.placements)
            start = time.perf_counter()
            runs[name]["optimizer"].step()
            runs[name]["times"].append(time.perf_counter() - start)
            runs[name]["optimizer"].zero_grad(set_to_none=True)
    reference = [full_tensor(param.detach()) for param in parameters["for-loop"]]
    result = {}
    for name, run in runs.items():
        weights = [full_tensor(param.detach()) for param in parameters[name]]
        result[name] = {
            "median_ms": 1e3 * statistics.median(run["times"][2:]),
            "max_abs_gap": max((a - b).abs().max().item() for a, b in zip(weights, reference)),
            "bitwise": all(torch.equal(a, b) for a, b in zip(weights, reference)),
            "tensors": len(parameters[name]),
            "parameters": sum(param.numel() for param in parameters[name]),
        }
    return result


def main() -> None:
    """Time each size's three AdamW kernels and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    sizes = args.sizes.split(",")
    models, _ = ensure_assets(sizes)
    print(f"| size | implementation | step ms (median of {args.steps - 2}) | vs for-loop | weights vs for-loop |")
    print("|---|---|---|---|---|")
    for size in sizes:
        result = time_size(str(models[size]), args.steps)
        loop = result["for-loop"]["median_ms"]
        for name, row in result.items():
            gap = "bit for bit" if row["bitwise"] else f"max gap {row['max_abs_gap']:.1e}"
            label = f"{size} ({row['parameters'] / 1e6:.2f} M, {row['tensors']} tensors)"
            print(f"| {label} | {name} | {row['median_ms']:.1f} | {row['median_ms'] / loop:.2f} | {gap} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
