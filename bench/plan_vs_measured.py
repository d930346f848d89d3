"""Planned against measured peak host memory per worker process, for CPU runs of several shapes.

Each config is ``examples/config_cpu.yaml`` with overrides (model size via the tiny model's shapes, batch size,
1 or 2 workers, padding-free on or off, LoRA, a critic). For each the plan is made in this process
(``easyr1.plan``, this machine's CPU), then the CLI runs it for a few steps and the largest
``perf/max_host_memory_gb`` of its steps is the measurement (``VmHWM`` of each worker, reset at every report, so
the first step's value includes loading; the metric is the workers' mean). Prints one row per config with the ratio
planned / measured (target: within 25%) and writes the rows to ``bench/results/plan-vs-measured-<time>.json``.

    PYTHONPATH=$PWD .venv/bin/python bench/plan_vs_measured.py [--steps 3] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "plan_bench"
RESULTS = REPO / "bench" / "results"
GIB = 2**30

# name -> (tiny model shape, overrides)
SIZES = {
    "0.6M": {},
    "15M": {"hidden_size": 512, "num_layers": 6, "intermediate_size": 1024},
    "60M": {"hidden_size": 1024, "num_layers": 8, "intermediate_size": 2816},
}
CONFIGS = {
    "0.6M-2w-padded": ("0.6M", ["trainer.n_gpus_per_node=2", "worker.actor.padding_free=false"]),
    "0.6M-1w-packed": ("0.6M", ["trainer.n_gpus_per_node=1", "worker.actor.padding_free=true"]),
    "0.6M-1w-hf-engine": ("0.6M", ["trainer.n_gpus_per_node=1", "worker.rollout.name=hf"]),
    "15M-2w-batch32": (
        "15M",
        ["trainer.n_gpus_per_node=2", "data.rollout_batch_size=32", "worker.actor.global_batch_size=32"],
    ),
    "15M-1w-lora": (
        "15M",
        ["trainer.n_gpus_per_node=1", "worker.actor.model.lora.rank=8", "worker.actor.optim.lr=1e-3"],
    ),
    "15M-2w-gae-critic": ("15M", ["trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae"]),
    "60M-1w": ("60M", ["trainer.n_gpus_per_node=1", "data.rollout_batch_size=8", "worker.actor.global_batch_size=8"]),
}


def assets(size: str) -> tuple[Path, Path]:
    """The tiny model of ``size`` and the shape dataset, built once into .cache/plan_bench."""
    from easyr1.tools.tiny_dataset import build_shape_dataset
    from easyr1.tools.tiny_model import build_tiny_model

    model = CACHE / f"model-{size}"
    if not (model / "config.json").exists():
        build_tiny_model(model, family="qwen2_5_vl", seed=0, **SIZES[size])
    data = CACHE / "data"
    if not (data / "train.jsonl").exists():
        build_shape_dataset(data, num_train=256, num_val=16, seed=0)
    return model, data


def arguments(name: str, steps: int, work: Path) -> list[str]:
    """The CLI arguments of config ``name``."""
    size, overrides = CONFIGS[name]
    model, data = assets(size)
    return [
        "config=examples/config_cpu.yaml",
        f"worker.actor.model.model_path={model}",
        f"data.train_files={data / 'train.jsonl'}",
        f"data.val_files={data / 'val.jsonl'}",
        f"trainer.max_steps={steps}",
        "trainer.logger=[file]",
        f"trainer.save_checkpoint_path={work}",
        "trainer.save_model_only=true",
        *overrides,
    ]


def planned(args: list[str]) -> dict[str, float]:
    """The plan's host numbers for ``args`` on this machine (GiB)."""
    from easyr1.config import load_config
    from easyr1.plan.check import plan_run
    from easyr1.plan.hardware import cpu_device

    plan, _ = plan_run(load_config(args), cpu_device())
    return {
        "planned_worker_gb": plan.host_worker["rank 0"] / GIB,
        "planned_device_peak_gb": plan.device_peak / GIB,
        "planned_node_gb": plan.host_node_total / GIB,
    }


def measured(args: list[str], work: Path) -> dict[str, float]:
    """Run the CLI; the largest per-step worker and driver peaks (GiB) and the wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "easyr1.main", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines() if line.strip()]
    workers = [r["perf/max_host_memory_gb"] for r in records if "perf/max_host_memory_gb" in r]
    drivers = [r["perf/driver_max_host_memory_gb"] for r in records if "perf/driver_max_host_memory_gb" in r]
    return {
        "measured_worker_gb": max(workers),
        "measured_worker_by_step": workers,
        "measured_driver_gb": max(drivers),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    """Plan and run each config, print planned vs measured."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), help="run only these configs")
    args = parser.parse_args()
    rows = []
    print(f"{'config':20s} {'planned GiB':>12s} {'measured GiB':>13s} {'ratio':>6s} {'driver GiB':>11s} {'s':>5s}")
    for name in args.only or CONFIGS:
        with tempfile.TemporaryDirectory(prefix="planbench_") as tmp:
            work = Path(tmp)
            cli = arguments(name, args.steps, work)
            row = {"config": name, "overrides": CONFIGS[name][1], **planned(cli), **measured(cli, work)}
        row["ratio"] = row["planned_worker_gb"] / row["measured_worker_gb"]
        rows.append(row)
        print(
            f"{name:20s} {row['planned_worker_gb']:12.2f} {row['measured_worker_gb']:13.2f} {row['ratio']:6.2f} "
            f"{row['measured_driver_gb']:11.2f} {row['seconds']:5.0f}",
            flush=True,
        )
    worst = max(abs(row["ratio"] - 1) for row in rows)
    print(f"worst |planned / measured - 1| = {worst:.1%} (target: within 25%)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"plan-vs-measured-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"rows: {out}")


if __name__ == "__main__":
    main()
