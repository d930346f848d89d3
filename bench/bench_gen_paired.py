"""easyr1's generation phase against bare vLLM, paired step by step in one run.

The peer benchmark compares easyr1's ``timing/gen`` with a bare ``vllm.LLM.generate`` run minutes apart, and this
machine's speed drifts by more than the 10% the comparison is about. Here both run side by side, one call apart:
the easyr1 trainer (peer-benchmark settings, one worker, built and stepped in this process as ``easyr1.main``
builds it) trains step by step, and a bare engine (``peer_vllm.py --serve``: vLLM's own block size, one request per
sample, as a user calling ``vllm.LLM`` builds it) generates the same step's prompts right before the step on odd
steps and right after it on even ones. Each step gives a ratio ``timing/gen / bare`` (``gen`` includes the weight
sync of the update before it); the script prints them and their median over steps 2 to the last.

Each side runs with the other stopped (SIGSTOP): idle processes still wake up (Ray's and gloo's polling loops; easyr1's
took 4-8% of a core at 0.64 M), and each side should have the machine to itself, as in a run of its own. The bare
engine also runs alone before the trainer starts and after it stops, and beside the idle trainer with it running and
stopped by turns (prompts no step uses), which measures what the stopping changes.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_gen_paired.py [--size 0.6M] [--steps 24] [--alone 6]

Writes every call to ``bench/results/gen-paired-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import (  # noqa: E402
    EASYR1_SETTINGS,
    MAX_PIXELS,
    MIN_PIXELS,
    NEW_TOKENS,
    PROMPTS,
    REPO,
    RESULTS,
    SAMPLES_PER_PROMPT,
    THREADS,
    ensure_assets,
    run_env,
)


ROWS = 256  # the peer dataset's training rows: steps take them from the front, the lone calls from the back


class BareEngine:
    """``peer_vllm.py --serve`` in a process of its own: call ``k`` generates the prompts of rows 4k..4k+3."""

    def __init__(self, model: Path, data: Path, env: dict[str, str]) -> None:
        command = [sys.executable, str(REPO / "bench" / "peer_vllm.py"), "--model", str(model), "--data", str(data)]
        command += ["--serve", str(ROWS), "--prompts", str(PROMPTS), "--n", str(SAMPLES_PER_PROMPT)]
        command += ["--max-tokens", str(NEW_TOKENS), "--min-pixels", str(MIN_PIXELS), "--max-pixels", str(MAX_PIXELS)]
        # its own process group's port, not the default run_env gives every bench process
        env = {**env, "MASTER_PORT": "29571"}
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read("READY")

    def _read(self, prefix: str) -> str:
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"bare engine exited ({self.process.wait()}) before {prefix!r}")

    def call(self, index: int) -> dict:
        """Generate call ``index``'s requests; its seconds and generated tokens."""
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        return json.loads(self._read("RESULT "))

    def close(self) -> None:
        """End the engine's process."""
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


def build_trainer(model: Path, data: Path, work: Path):
    """easyr1's trainer as ``python -m easyr1.main`` builds it with the peer benchmark's settings, one worker."""
    from easyr1.build import build_trainer as build
    from easyr1.config import load_config
    from easyr1.main import init_ray
    from easyr1.seeding import seed_everything

    settings = {
        **EASYR1_SETTINGS,
        "data.train_files": str(data / "train.jsonl"),
        "data.val_files": str(data / "val.jsonl"),
        "worker.actor.model.model_path": str(model),
        "trainer.n_gpus_per_node": 1,
        "trainer.save_checkpoint_path": str(work),
        "trainer.log_dir": str(work),
    }
    config = load_config(["config=examples/config_cpu.yaml"] + [f"{key}={value}" for key, value in settings.items()])
    seed_everything(config.trainer.seed)
    init_ray(1)
    return build(config)


def descendants_besides(pid: int) -> list:
    """This process's descendants (easyr1's Ray processes: GCS, raylet, workers, agents), except process ``pid``."""
    import psutil

    return [process for process in psutil.Process().children(recursive=True) if process.pid != pid]


@contextmanager
def paused(processes: list) -> Iterator[None]:
    """``processes`` stopped (SIGSTOP) for the duration: idle, they still wake up (Ray's and gloo's polling loops,
    ~4% of a core for easyr1's at 0.64 M), and the side being timed should have the machine to itself."""
    import psutil

    stopped = []
    try:
        for process in processes:
            try:
                process.suspend()
                stopped.append(process)
            except psutil.NoSuchProcess:
                pass
        yield
    finally:
        for process in stopped:
            try:
                process.resume()
            except psutil.NoSuchProcess:
                pass


def cpu_seconds(processes: list) -> float:
    """CPU seconds ``processes`` have used so far (those still running)."""
    import psutil

    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def lone_calls(bare: BareEngine, first: int, count: int) -> list[float]:
    """``count`` bare calls on the rows' last calls, from ``first`` counted from the back."""
    last_call = ROWS // PROMPTS - 1
    return [bare.call(last_call - first - k)["seconds"] for k in range(count)]


def drive(args: argparse.Namespace) -> None:
    """Run both sides (in the benchmark's environment), print and save the comparison."""
    import psutil

    models, data = ensure_assets([args.size])
    model = models[args.size]
    if (args.steps + 4 * args.alone + 2) * PROMPTS > ROWS:
        raise SystemExit(f"--steps and --alone need more than the dataset's {ROWS} rows")
    bare = BareEngine(model, data, dict(os.environ))
    lone_calls(bare, 0, 2)  # warm-up: vLLM compiles for its first shapes
    alone_before = lone_calls(bare, 2, args.alone)
    steps: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gen-paired-") as work:
        trainer = build_trainer(model, data, Path(work))
        easyr1 = descendants_besides(bare.process.pid)
        bare_process = psutil.Process(bare.process.pid)
        try:
            for step in range(1, args.steps + 1):
                bare_first = step % 2 == 1
                if bare_first:
                    with paused(easyr1):
                        beside = bare.call(step - 1)
                with paused([bare_process]):
                    metrics = trainer.train_step(trainer.step_prompts(), step)  # as fit() takes them
                trainer.global_step = step
                if not bare_first:
                    with paused(easyr1):
                        beside = bare.call(step - 1)
                steps.append(
                    {
                        "step": step,
                        "gen": metrics["timing/gen"],
                        "sync": metrics["timing/sync"],
                        "engine": metrics.get("timing/engine", float("nan")),
                        "tokens": metrics["response_length/mean"] * metrics["batch/samples"],
                        "bare": beside["seconds"],
                        "bare_tokens": beside["tokens"],
                        "bare_first": bare_first,
                    }
                )
            # what easyr1's idle processes cost a program beside them: bare calls with them running or stopped
            interference: dict[str, list[float]] = {"running": [], "stopped": [], "cpu": []}
            for k in range(2 * args.alone):
                call = ROWS // PROMPTS - 1 - (2 + args.alone + k)
                if k % 2:
                    with paused(easyr1):
                        interference["stopped"].append(bare.call(call)["seconds"])
                else:
                    before = cpu_seconds(easyr1)
                    seconds = bare.call(call)["seconds"]
                    interference["running"].append(seconds)
                    interference["cpu"].append((cpu_seconds(easyr1) - before) / seconds)
        finally:
            trainer.shutdown()
    import ray

    ray.shutdown()
    alone_after = lone_calls(bare, 2 + 3 * args.alone, args.alone)
    bare.close()
    report(args, steps, alone_before, alone_after, interference)


def report(
    args: argparse.Namespace,
    steps: list[dict],
    alone_before: list[float],
    alone_after: list[float],
    interference: dict[str, list[float]],
) -> None:
    """Print the per-step table and the medians; write the raw numbers."""
    print(f"\n{args.size}: easyr1 1 worker, generation (weight sync included) against bare vLLM, step by step")
    print("step | bare s (when) | easyr1 gen s | sync s | engine s | gen / bare | tokens easyr1 / bare")
    for row in steps:
        when = "before" if row["bare_first"] else "after"
        print(
            f"{row['step']:4d} | {row['bare']:.3f} ({when:6s}) | {row['gen']:.3f} | {row['sync']:.3f} | "
            f"{row['engine']:.3f} | {row['gen'] / row['bare']:.3f} | {row['tokens']:.0f} / {row['bare_tokens']}"
        )
    timed = steps[1:]  # step 1 compiles easyr1's engine for its shapes
    ratios = [row["gen"] / row["bare"] for row in timed]

    def median(key: str) -> float:
        return statistics.median(row[key] for row in timed)

    print(
        f"steps 2-{steps[-1]['step']}: median gen / bare {statistics.median(ratios):.3f} "
        f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f}); "
        f"medians: bare {median('bare'):.3f} s, gen {median('gen'):.3f}, sync {median('sync'):.3f}, "
        f"engine {median('engine'):.3f}"
    )
    print(
        f"bare engine alone: {statistics.median(alone_before):.3f} s a call before the trainer, "
        f"{statistics.median(alone_after):.3f} after it; beside the idle trainer, alternately: "
        f"{statistics.median(interference['stopped']):.3f} with easyr1's processes stopped (as in the pairs), "
        f"{statistics.median(interference['running']):.3f} with them running (they used "
        f"{100 * statistics.median(interference['cpu']):.1f}% of a core meanwhile)"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"gen-paired-{args.size}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    raw = {"size": args.size, "steps": steps, "alone_before": alone_before, "alone_after": alone_after}
    raw["interference"] = interference
    out.write_text(json.dumps(raw, indent=1), encoding="utf-8")
    print(f"raw: {out.relative_to(REPO)}")


def main() -> None:
    """Re-run in the benchmark's environment (threads, vLLM's CPU settings, Ray's niceness), then drive."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.6M", help="a peer-benchmark model size (0.6M, 15M)")
    parser.add_argument("--steps", type=int, default=24, help="training steps, each paired with a bare call")
    parser.add_argument("--alone", type=int, default=6, help="bare calls alone before and after the trainer")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        drive(args)
        return
    command = [sys.executable, __file__, "--inner", "--size", args.size, "--steps", str(args.steps)]
    command += ["--alone", str(args.alone)]
    sys.exit(subprocess.run(command, env=run_env(THREADS), cwd=REPO).returncode)


if __name__ == "__main__":
    main()
