"""Metrics parity across a change: 3-step GRPO, DAPO, ReMax and PPO-GAE runs whose metrics two commits must share.

A refactor that claims "no behaviour change" proves it here: run this script at the commit before the change and
at the commit after it (same machine), then compare the two files. Every logged metric except timings, throughput
and memory must be equal (``--compare`` prints the largest relative difference per run and exits 1 above the
tolerance).

    python bench/metrics_parity.py --out before.json            # at the old commit (e.g. in a git worktree)
    python bench/metrics_parity.py --out after.json             # at the new commit
    python bench/metrics_parity.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
STEPS = 3
RUNS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "dapo": [
        "algorithm.online_filtering=true",
        "worker.actor.clip_ratio_high=0.28",
        "data.mini_rollout_batch_size=4",
        "trainer.max_try_make_batch=60",
    ],
    "remax": ["algorithm.adv_estimator=remax"],
    "ppo_gae": ["algorithm.adv_estimator=gae", "worker.critic.global_batch_size=16", "worker.critic.optim.lr=1e-3"],
}
# machine-dependent series: not behaviour
VOLATILE_PREFIXES = ("timing/", "perf/", "memory/", "throughput/")


def run_all(out: Path) -> None:
    """Build the tiny model and data, run each algorithm for ``STEPS`` steps, write {run: [metrics per step]}."""
    from easyr1.main import main
    from easyr1.tools.tiny_dataset import build_shape_dataset
    from easyr1.tools.tiny_model import build_tiny_model

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model_dir = build_tiny_model(root / "model", seed=0)
        data_dir = build_shape_dataset(root / "data", seed=0)
        for name, extra in RUNS.items():
            run_dir = root / name
            code = main(
                [
                    f"config={REPO / 'examples' / 'config_cpu.yaml'}",
                    f"worker.actor.model.model_path={model_dir}",
                    f"data.train_files={data_dir / 'train.jsonl'}",
                    f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
                    f"trainer.max_steps={STEPS}",
                    "worker.rollout.n=4",
                    f"trainer.save_checkpoint_path={run_dir}",
                    *extra,
                ]
            )
            if code != 0:
                sys.exit(f"run {name} failed with exit code {code}")
            lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            results[name] = [
                {key: value for key, value in json.loads(line).items() if not key.startswith(VOLATILE_PREFIXES)}
                for line in lines
            ]
    out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"wrote {out}")


def compare(before: Path, after: Path, tolerance: float) -> int:
    """Print the largest relative difference per run; 1 if any metric differs by more than ``tolerance`` or is
    missing on one side."""
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    failed = False
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new or len(old[name]) != len(new[name]):
            print(f"{name}: runs differ in presence or step count")
            failed = True
            continue
        worst, where = 0.0, ""
        for step, (a, b) in enumerate(zip(old[name], new[name])):
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b:
                    print(f"{name} step {step}: metric {key} only {'after' if key in b else 'before'}")
                    continue
                if not isinstance(a[key], (int, float)) or not isinstance(b[key], (int, float)):
                    continue
                diff = abs(a[key] - b[key]) / max(abs(a[key]), abs(b[key]), 1e-12)
                if diff > worst:
                    worst, where = diff, f"step {step} {key}: {a[key]} vs {b[key]}"
        status = "ok" if worst <= tolerance else "DIFFERS"
        failed |= worst > tolerance
        print(f"{name}: {status}, largest relative difference {worst:.3g} {where}")
    return 1 if failed else 0


def main() -> int:
    """Run the algorithms (``--out``) or compare two result files (``--compare``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write this run's metrics here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--tolerance", type=float, default=1e-6, help="largest relative difference accepted")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare, args.tolerance)
    if not args.out:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    run_all(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
