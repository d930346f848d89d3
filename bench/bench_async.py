"""Speed of the asynchronous schedules against the synchronous loop, on long-tailed response lengths.

Per size (a ~0.8 M and a ~15 M tiny Qwen2.5-VL, both built with ``--stop-tokens 12``: a response ends at any of 14
tokens, so lengths have a long tail) three configurations run on the CPU demo's shape task with
``examples/config_cpu.yaml`` settings, the vLLM engine and 2 workers, each doing the same work per step
(``data.rollout_batch_size`` prompts x ``worker.rollout.n`` samples trained, one optimizer step):

- ``sync``: today's loop on 2 colocated workers;
- ``one_step_off``: a 1 + 1 split (1 generator, 1 trainer), the next batch generating while this one trains;
- ``partial_rollout``: the same 2 colocated workers, twice the step's prompts in flight, unfinished responses
  continued under the next step's weights.

Every run is its own ``python -m easyr1.main`` subprocess; runs are interleaved and rotated (repetition 1: A B C,
repetition 2: B C A, ...), sizes alternating within a repetition, so the machine's drift falls on all alike. Steps/s
is taken from the wall time between the run's metric lines (watched as ``metrics.jsonl`` grows) over the steps after
warm-up; ``timing/step`` is printed beside it as a check. Each async schedule's ratio to sync is paired within a
repetition. The last line is ``async-vs-sync: 0.8M=<ratio> 15M=<ratio>``, the better async schedule's median ratio.

``--correction``: instead, partial rollout with ``max_staleness=4`` and five times the step's prompts in flight on the
0.8 M model, correction off beside ``algorithm.rollout_correction_mode=decoupled algorithm.rollout_is=token`` (and
the same with token k1 rejection): the train-vs-engine mismatch per staleness, the IS weights, the masked fractions
and the reward curve of each.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_async.py                 # both sizes, 3 repetitions (~25 min)
    PYTHONPATH=$PWD .venv/bin/python bench/bench_async.py --sizes 0.8M --reps 1 --steps 6   # a smoke run
    PYTHONPATH=$PWD .venv/bin/python bench/bench_async.py --correction    # the correction comparison (~5 min)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "asyncbench"
RESULTS = REPO / "bench" / "results"
DATA = REPO / ".cache" / "demo" / "data"
SIZES = {
    "0.8M": [],  # the default tiny model: hidden 128, 2 layers
    "15M": ["--hidden-size", "512", "--num-layers", "6", "--intermediate-size", "1024"],
}
STOP_TOKENS = 12
# 128 keeps the whole tail of the 0.8 M model's lengths (measured at a 256 cap: p50 16, p90 56, max 119) while the
# prompt (<= 64) plus the response still fits a 192-token engine context.
MAX_RESPONSE = 128

# The work of every run, in one place: examples/config_cpu.yaml (16 prompts x 8 samples, one update per step) with
# these overrides. Validation and checkpoints off (the trainer still saves after the last step: that step is not
# measured).
COMMON = {
    "data.train_files": str(DATA / "train.jsonl"),
    "data.val_files": str(DATA / "val.jsonl"),
    "data.max_response_length": MAX_RESPONSE,
    "worker.rollout.max_model_len": 64 + MAX_RESPONSE,
    "trainer.n_gpus_per_node": 2,
    "trainer.logger": "[file]",
    "trainer.val_freq": -1,
    "trainer.val_before_train": False,
    "trainer.save_freq": -1,
    "trainer.find_last_checkpoint": False,
}
SCHEDULES = {
    "sync": {},
    "one_step_off": {
        "async_training.schedule": "one_step_off",
        "async_training.placement": "split",
        "async_training.generator_workers": 1,
    },
    # in_flight_prompts: null = twice the step's prompts; max_staleness 1 (the default)
    "partial_rollout": {"async_training.schedule": "partial_rollout"},
}
ASYNC = ("one_step_off", "partial_rollout")
PROMPTS = 16  # config_cpu.yaml's data.rollout_batch_size
CORRECTIONS = {
    "off": {},
    "token-is": {"algorithm.rollout_correction_mode": "decoupled", "algorithm.rollout_is": "token"},
    "token-is+k1-rs": {
        "algorithm.rollout_correction_mode": "decoupled",
        "algorithm.rollout_is": "token",
        "algorithm.rollout_rs": "token_k1",
    },
}
CORRECTION_RUN = {
    "async_training.schedule": "partial_rollout",
    "async_training.max_staleness": 4,
    "async_training.in_flight_prompts": 5 * PROMPTS,
}
# the metrics each run's summary keeps (means over the measured steps)
SUMMARY_KEYS = (
    "timing/step",
    "timing/gen",
    "timing/gen_wait",
    "timing/update",
    "timing/experience",
    "timing/reward",
    "timing/weight_push",
    "timing/sync",
    "timing/engine",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "async/staleness/mean",
    "async/staleness/max",
    "async/span/mean",
    "async/partial_ratio",
    "async/rounds",
    "async/reprefill_tokens",
    "async/generated_tokens",
    "async/evicted_groups",
    "async/trainer_wait_ratio",
    "async/generator_idle_ratio",
    "batch/samples",
)


# the step's phases printed per schedule (label, metric): gen is the whole generation as the driver waited for it,
# engine the engine's generate call on the first worker, weight sync the update's weights into the colocated engine
PHASES = (
    ("gen", "timing/gen"),
    ("engine", "timing/engine"),
    ("weight sync", "timing/sync"),
    ("experience", "timing/experience"),
    ("update", "timing/update"),
)


@dataclass
class Run:
    """One subprocess run and what it measured."""

    size: str
    schedule: str
    rep: int
    seconds: float = 0.0
    step_wall: dict[int, float] = field(default_factory=dict)  # step -> wall seconds since the previous line
    records: list[dict] = field(default_factory=list)
    error: str = ""
    load: list[float] = field(default_factory=list)  # the machine's 1-minute load average, sampled every 5 s


def run_env() -> dict[str, str]:
    """The runs' environment: the driver on one thread (easyr1 gives each worker the cores divided by the workers),
    vLLM's KV cache sized by easyr1, Ray's workers at the driver's priority."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # easyr1 sizes its KV cache itself
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        # Ray starts its workers at niceness +15 by default: on a shared machine they would get a smaller share of
        # the CPU than the driver (which waits for them); same priority for every process of a run.
        RAY_worker_niceness="0",
    )
    return env


def ensure_assets(sizes: list[str]) -> dict[str, Path]:
    """The demo's shape data and one ``--stop-tokens`` model per size (built once under .cache/asyncbench)."""
    subprocess.run([sys.executable, "-m", "easyr1.tools.demo_assets"], cwd=REPO, check=True, env=run_env())
    models = {}
    for size in sizes:
        model = CACHE / f"qwen2_5_vl-{size}-stop{STOP_TOKENS}"
        if not (model / ".complete").exists():
            command = [sys.executable, "-m", "easyr1.tools.tiny_model", str(model), "--stop-tokens", str(STOP_TOKENS)]
            subprocess.run(command + SIZES[size], cwd=REPO, check=True, env=run_env())
            (model / ".complete").write_text("complete\n")
        models[size] = model
    return models


def run_once(run: Run, model: Path, settings: dict, steps: int, work: Path) -> None:
    """One ``python -m easyr1.main`` run; each metric line's arrival is timed as the file grows."""
    work.mkdir(parents=True, exist_ok=True)
    overrides = {
        **COMMON,
        **settings,
        "worker.actor.model.model_path": str(model),
        "trainer.max_steps": steps,
        "trainer.save_checkpoint_path": str(work),
        "trainer.log_dir": str(work),
    }
    command = [sys.executable, "-m", "easyr1.main", "config=examples/config_cpu.yaml"]
    command += [f"{key}={value}" for key, value in overrides.items()]
    metrics_file = work / "metrics.jsonl"
    arrivals: dict[int, float] = {}
    start = time.perf_counter()
    with (work / "run.log").open("w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=run_env(), stdout=log, stderr=subprocess.STDOUT)
        seen = 0
        while True:
            done = process.poll() is not None
            if metrics_file.exists():
                lines = metrics_file.read_text().splitlines()
                now = time.perf_counter()
                for line in lines[seen:]:
                    if line.endswith("}"):  # a whole line (the tracker writes and flushes one line per step)
                        arrivals[json.loads(line)["step"]] = now
                        seen += 1
            if done:
                break
            if time.perf_counter() - start >= 5 * len(run.load):  # what else the machine was running
                run.load.append(os.getloadavg()[0])
            time.sleep(0.05)
    run.seconds = time.perf_counter() - start
    if process.returncode:
        run.error = "\n".join((work / "run.log").read_text(errors="replace").splitlines()[-20:])
        print(f"  {run.size} {run.schedule} rep {run.rep} FAILED (exit {process.returncode}):\n{run.error}")
        return
    run.records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    run.step_wall = {step: arrivals[step] - arrivals[step - 1] for step in arrivals if step - 1 in arrivals}


def measured_steps(steps: int, warmup: int) -> list[int]:
    """The steps timed: after ``warmup`` steps, and not the last (it saves a checkpoint)."""
    return list(range(warmup + 1, steps))


def steps_per_second(run: Run, window: list[int]) -> tuple[float, float]:
    """(steps/s from the wall time between metric lines, steps/s from the mean ``timing/step``) over ``window``."""
    wall = [run.step_wall[step] for step in window if step in run.step_wall]
    timed = [r["timing/step"] for r in run.records if r["step"] in window and "timing/step" in r]
    return len(wall) / sum(wall), len(timed) / sum(timed)


def tokens_per_second(run: Run, window: list[int]) -> float:
    """Response tokens trained per wall second over ``window``: the schedules train the same samples per step, but
    their responses' lengths drift apart as the policies do (an older policy's samples, groups that finish first)."""
    tokens = sum(r["response_length/mean"] * r["batch/samples"] for r in run.records if r["step"] in window)
    return tokens / sum(run.step_wall[step] for step in window if step in run.step_wall)


def summary(run: Run, window: list[int]) -> dict[str, float]:
    """Means of SUMMARY_KEYS over the measured steps; the staleness's max as a max."""
    rows = [r for r in run.records if r["step"] in window]
    out = {}
    for key in SUMMARY_KEYS:
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = max(values) if key.endswith("/max") else statistics.fmean(values)
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); a single value three times."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def fmt(q: tuple[float, float, float], digits: int = 3) -> str:
    """``median [q1, q3]``."""
    return f"{q[1]:.{digits}f} [{q[0]:.{digits}f}, {q[2]:.{digits}f}]"


def speed(args: argparse.Namespace) -> None:
    """The interleaved speed comparison; a table per size and the ``async-vs-sync`` line."""
    sizes = args.sizes.split(",")
    models = ensure_assets(sizes)
    work = Path(tempfile.mkdtemp(prefix="bench_async_"))
    window = measured_steps(args.steps, args.warmup)
    names = list(SCHEDULES)
    print(f"work directory: {work}; steps 1-{args.steps}, timed {window[0]}-{window[-1]}", flush=True)
    runs: list[Run] = []
    began = time.time()
    for rep in range(1, args.reps + 1):
        rotation = names[(rep - 1) % 3 :] + names[: (rep - 1) % 3]
        order = sizes if rep % 2 else sizes[::-1]
        for size in order:
            for schedule in rotation:
                run = Run(size, schedule, rep)
                run_once(run, models[size], SCHEDULES[schedule], args.steps, work / f"{size}-{schedule}-{rep}")
                runs.append(run)
                if not run.error:
                    wall, timed = steps_per_second(run, window)
                    print(
                        f"  rep {rep} {size:>4} {schedule:<15} {wall:.3f} steps/s (timing/step: {timed:.3f}), "
                        f"{run.seconds:.0f} s in all, load average {statistics.fmean(run.load):.1f}",
                        flush=True,
                    )
    results = report(runs, sizes, window)
    results["seconds"] = time.time() - began
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"async-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"\nresults: {out} ({results['seconds'] / 60:.1f} min)")
    print(results["better_line"])
    print(results["last_line"])


def load_runs(path: Path) -> tuple[list[Run], list[str], list[int]]:
    """The runs, sizes and timed steps of a saved result file."""
    saved = json.loads(path.read_text())
    runs = []
    for size_out in saved["sizes"].values():
        for schedule, entry in size_out.items():
            if schedule in ("ratios", "token_ratios"):
                continue
            for raw in entry["runs"]:
                run = Run(**raw)
                run.step_wall = {int(step): seconds for step, seconds in raw["step_wall"].items()}
                runs.append(run)
    return runs, list(saved["sizes"]), saved["window"]


def report(runs: list[Run], sizes: list[str], window: list[int]) -> dict:
    """Print a table per size; the results as a dict, with the last two lines under ``better_line`` and
    ``last_line``."""
    names = list(SCHEDULES)
    results: dict = {"sizes": {}, "window": window, "settings": {"common": COMMON, "schedules": SCHEDULES}}
    best_line = {}
    for size in sizes:
        print(f"\n== {size}: steps/s over steps {window[0]}-{window[-1]}, median [quartiles] over repetitions")
        by = {s: {r.rep: r for r in runs if r.size == size and r.schedule == s and not r.error} for s in names}
        size_out: dict = {}
        for schedule in names:
            reps = by[schedule]
            if not reps:
                continue
            rates = [steps_per_second(r, window) for r in reps.values()]
            stats = {
                k: statistics.fmean([summary(r, window).get(k, float("nan")) for r in reps.values()])
                for k in SUMMARY_KEYS
            }
            maxima = [summary(r, window).get("async/staleness/max", 0.0) for r in reps.values()]
            size_out[schedule] = {
                "steps_per_s": [w for w, _ in rates],
                "steps_per_s_timing": [t for _, t in rates],
                "means": stats,
                "staleness_max": max(maxima),
                "runs": [asdict(r) for r in reps.values()],
            }
            tokens = [tokens_per_second(r, window) for r in reps.values()]
            size_out[schedule]["tokens_per_s"] = tokens
            line = f"{schedule:<15} {fmt(quartiles([w for w, _ in rates]))} steps/s"
            line += f" (from timing/step {fmt(quartiles([t for _, t in rates]))}),"
            line += f" {fmt(quartiles(tokens), 0)} response tokens trained/s"
            print(line)
            parts = [
                *(
                    f"{label} {stats[key]:.3f} s"
                    for label, key in PHASES
                    if not math.isnan(stats[key]) and (stats[key] > 0 or key != "timing/sync")
                ),
                f"response length mean {stats['response_length/mean']:.1f} max {stats['response_length/max']:.0f}"
                f" clipped {stats['response_length/clip_ratio']:.3f}",
            ]
            if schedule != "sync":
                parts.append(
                    f"staleness mean {stats['async/staleness/mean']:.2f} max {max(maxima):.0f}"
                    f", partial ratio {stats['async/partial_ratio']:.2f}"
                )
            if schedule == "one_step_off":
                parts.append(
                    f"trainer wait {stats['async/trainer_wait_ratio']:.2f}, generator idle "
                    f"{stats['async/generator_idle_ratio']:.2f}, gen_wait {stats['timing/gen_wait']:.2f} s, "
                    f"weight push {stats['timing/weight_push']:.3f} s"
                )
            if schedule == "partial_rollout":
                parts.append(
                    f"rounds {stats['async/rounds']:.1f}, re-prefilled tokens {stats['async/reprefill_tokens']:.0f}"
                    f", evicted groups {stats['async/evicted_groups']:.2f}"
                )
            print("    " + "; ".join(p for p in parts if p))
        ratios = {}
        for schedule in ASYNC:
            paired = [
                steps_per_second(by[schedule][rep], window)[0] / steps_per_second(by["sync"][rep], window)[0]
                for rep in by[schedule]
                if rep in by["sync"]
            ]
            if paired:
                ratios[schedule] = paired
                per_token = [
                    tokens_per_second(by[schedule][rep], window) / tokens_per_second(by["sync"][rep], window)
                    for rep in by[schedule]
                    if rep in by["sync"]
                ]
                size_out.setdefault("token_ratios", {})[schedule] = per_token
                print(
                    f"{schedule} / sync, paired per repetition: steps/s {fmt(quartiles(paired), 2)}, response "
                    f"tokens trained/s {fmt(quartiles(per_token), 2)} ({len(paired)} pairs)"
                )
        size_out["ratios"] = ratios
        results["sizes"][size] = size_out
        if ratios:
            best = max(ratios, key=lambda s: statistics.median(ratios[s]))
            best_line[size] = (best, statistics.median(ratios[best]))
    results["better_line"] = "better async schedule: " + " ".join(f"{size}={b}" for size, (b, _) in best_line.items())
    results["last_line"] = "async-vs-sync: " + " ".join(f"{size}={r:.2f}" for size, (_, r) in best_line.items())
    return results


def correction(args: argparse.Namespace) -> None:
    """Partial rollout at staleness 4 with and without the decoupled correction: mismatch per age, weights, rewards."""
    models = ensure_assets(["0.8M"])
    work = Path(tempfile.mkdtemp(prefix="bench_async_correction_"))
    print(f"work directory: {work}; {args.correction_steps} steps each", flush=True)
    runs = {}
    for name, settings in CORRECTIONS.items():
        run = Run("0.8M", f"partial_rollout/{name}", 1)
        run_once(run, models["0.8M"], {**CORRECTION_RUN, **settings}, args.correction_steps, work / name)
        runs[name] = run
        print(f"  {name}: {run.seconds:.0f} s", flush=True)
    out_runs = {name: asdict(run) for name, run in runs.items()}
    for name, run in runs.items():
        if run.error:
            continue
        rows = run.records
        print(f"\n== correction {name}")
        keys = sorted({k for r in rows for k in r if k.startswith(("rollout/", "rollout_corr/"))})
        ages = sorted({k.split("/")[2] for k in keys if k.startswith("rollout_corr/by_staleness/")}, key=int)
        for age in ages:
            prefix = f"rollout_corr/by_staleness/{age}/"
            cells = []
            for metric in ("k3_kl", "log_prob_gap", "masked_fraction"):
                values = [r[prefix + metric] for r in rows if prefix + metric in r]
                if values:
                    cells.append(
                        f"{metric} {statistics.fmean(values):.2e} (max {max(values):.2e}, {len(values)} steps)"
                    )
            print(f"  staleness {age}: " + ", ".join(cells))
        for key in (
            "rollout/rollout_kl_k3",
            "rollout/log_prob_gap",
            "rollout_corr/k3_kl",
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_max",
            "rollout_corr/rollout_is_ratio_fraction_high",
            "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/rollout_rs_masked_fraction",
            "async/staleness/mean",
            "async/staleness/max",
            "async/partial_ratio",
        ):
            values = [r[key] for r in rows if key in r]
            if values:
                print(f"  {key}: mean {statistics.fmean(values):.3e}, max {max(values):.3e}")
        rewards = [r.get("reward/overall", r.get("critic/score/mean", float("nan"))) for r in rows]
        print("  reward by step: " + " ".join(f"{v:.2f}" for v in rewards))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"async-correction-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"settings": {"common": COMMON, "run": CORRECTION_RUN, "corrections": CORRECTIONS}, "runs": out_runs},
            indent=1,
        )
    )
    print(f"\nresults: {out}")


def main() -> None:
    """Parse the flags and run the speed comparison, or the correction comparison with ``--correction``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.8M,15M", help="comma-separated, of " + ", ".join(SIZES))
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every (size, schedule)")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the last one is not timed)")
    parser.add_argument("--warmup", type=int, default=2, help="steps not timed at the start of each run")
    parser.add_argument("--correction", action="store_true", help="the correction comparison instead")
    parser.add_argument("--correction-steps", type=int, default=20)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every run, after the bench's own (repeatable; e.g. worker.actor.padding_free=true)",
    )
    parser.add_argument("--analyse", type=Path, default=None, help="print the tables of a saved async-*.json again")
    args = parser.parse_args()
    COMMON.update(dict(item.split("=", 1) for item in args.set))
    if args.analyse:
        runs, sizes, window = load_runs(args.analyse)
        results = report(runs, sizes, window)
        print(results["better_line"])
        print(results["last_line"])
    elif args.correction:
        correction(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
