"""Kill sweep of the asynchronous schedules: ``kill -9`` of the CPU demo job mid-run, then a resume.

The cases of ``faults_kill_sweep.py`` (its launcher, its watch of the driver's stack, its kill), run on
examples/config_cpu.yaml, 12 steps, a checkpoint every 2 steps and validation every 4, under one schedule:

- ``one_step_off`` (default): ``placement=split``, ``generator_workers=1``, the HF engine; the batch generated ahead
  at a checkpoint is saved with it and trained after the resume;
- ``partial_rollout``: on a tiny model whose responses end at any of 14 tokens (long-tailed lengths), 48-token
  responses, three batches in flight (``max_staleness=2``), vLLM: the responses still running at a checkpoint are
  saved with it and continued after the resume.

Each resumed run's metrics must equal the uninterrupted run's at every step (timings, throughput, memory and the
schedule's wait and idle shares of wall time left out).

    PYTHONPATH=$PWD .venv/bin/python bench/faults_kill_async.py [--schedule partial_rollout] [--seed 0] [--cases ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import faults_kill_sweep as sweep


SCHEDULES = {
    "one_step_off": [
        "async_training.schedule=one_step_off",
        "async_training.placement=split",
        "async_training.generator_workers=1",
        "worker.rollout.name=hf",
    ],
    "partial_rollout": [
        "async_training.schedule=partial_rollout",
        "async_training.in_flight_prompts=48",
        "async_training.max_staleness=2",
        "data.max_response_length=48",
    ],
}
MEASURED = ("timing/", "throughput/", "perf/", "async/trainer_wait_ratio", "async/generator_idle_ratio")


def run_args(run_dir: Path, schedule: str, model: Path | None) -> list[str]:
    """The job's CLI arguments: the sweep's single-turn job under ``schedule`` (on ``model`` when given)."""
    extra = [f"worker.actor.model.model_path={model}"] if model is not None else []
    return [*sweep.run_args(False, run_dir), *SCHEDULES[schedule], *extra]


def metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per step, every metric but the measurements of the machine."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in records}


def plan_cases(seed: int) -> list[sweep.Case]:
    """Five cases: two in generation (the driver waiting for the batch generated ahead, or pushing), one in the
    update (the next batch generating meanwhile), one in a checkpoint write, one in validation."""
    draw = random.Random(seed)
    steps = range(1, sweep.STEPS + 1)
    cases = [
        sweep.Case(f"generation-{i + 1}", False, "generation", step, draw.random())
        for i, step in enumerate(sorted(draw.sample(steps, 2)))
    ]
    cases.append(sweep.Case("update-1", False, "update", draw.choice(steps), draw.random()))
    saves = range(sweep.SAVE_FREQ, sweep.STEPS + 1, sweep.SAVE_FREQ)
    cases.append(sweep.Case("checkpoint-1", False, "checkpoint", draw.choice(saves), draw.random()))
    validated = range(sweep.VAL_FREQ, sweep.STEPS + 1, sweep.VAL_FREQ)
    cases.append(sweep.Case("validation", False, "validation", draw.choice(validated), draw.random()))
    return cases


def main() -> None:
    """The uninterrupted run, then each case; one line per case, the results as JSON in bench/results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="one_step_off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all five)")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "easyr1.tools.demo_assets"], cwd=sweep.REPO, check=True)
    work = Path(tempfile.mkdtemp(prefix=f"kill_{args.schedule}_"))
    model = None
    if args.schedule == "partial_rollout":
        from easyr1.tools.tiny_model import build_tiny_model

        model = build_tiny_model(work / "long_tail_model", stop_tokens=12)
    cases = plan_cases(args.seed)
    if args.cases:
        cases = [case for case in cases if case.name in args.cases.split(",")]
    print(f"work directory: {work}", flush=True)
    reference_dir = work / "reference"
    began = time.perf_counter()
    reference_job = run_args(reference_dir, args.schedule, model)
    process = sweep.start(reference_job, work / "reference.log", work / "reference.stacks")
    if process.wait() != 0:
        raise SystemExit(f"the uninterrupted run failed: {(work / 'reference.log').read_text()[-3000:]}")
    print(f"uninterrupted run: {time.perf_counter() - began:.0f} s", flush=True)
    expected = metrics(reference_dir)
    records = [json.loads(line) for line in (reference_dir / "metrics.jsonl").read_text().splitlines()]
    timings = {r["step"]: r for r in records}
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(sweep.REPO)}
    for case in cases:
        run_dir = work / case.name
        job = run_args(run_dir, args.schedule, model)
        stacks, log = work / f"{case.name}.stacks", work / f"{case.name}.log"
        process = sweep.start(job, log, stacks)
        try:
            phase_seconds = timings[case.step].get(sweep.PHASE_TIMINGS[case.phase], 0.0)
            sweep.kill_at_moment(case, process, run_dir, stacks, log, phase_seconds)
        except RuntimeError as error:
            sweep.kill_hard(process)
            case.result = f"no kill: {error}"[:300]
            print(f"{case.name}: {case.result}", flush=True)
            continue
        began = time.perf_counter()
        resumed = subprocess.run(
            [sys.executable, "-m", "easyr1.main", *job],
            cwd=sweep.REPO,
            env=environment,
            capture_output=True,
            text=True,
        )
        case.resume_s = time.perf_counter() - began
        (work / f"{case.name}.resume.log").write_text(resumed.stdout + resumed.stderr)
        found = re.search(r"resumed from (\S+)", resumed.stdout)
        case.resumed_from = Path(found.group(1)).name if found else "the start"
        if resumed.returncode != 0:
            case.result = f"resume failed ({resumed.returncode}): {resumed.stderr[-300:]}"
        else:
            actual = metrics(run_dir)
            differing = [step for step in expected if actual.get(step) != expected[step]]
            case.result = "equal" if not differing else f"steps {differing} differ"
        print(
            f"{case.name}: aimed at {case.fraction:.0%} into the {case.phase} of step {case.step}, killed after "
            f"{case.killed_after_s:.1f} s in {case.killed_in} ({sweep.innermost_own_frame(case.stack)}), "
            f"{case.steps_done_at_kill} steps logged; resumed from {case.resumed_from} in {case.resume_s:.0f} s: "
            f"{case.result}",
            flush=True,
        )
    passed = sum(case.result == "equal" for case in cases)
    print(f"{passed} of {len(cases)} {args.schedule} cases resumed to the uninterrupted run's metrics", flush=True)
    sweep.RESULTS.mkdir(parents=True, exist_ok=True)
    out = sweep.RESULTS / f"kill-{args.schedule.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    summary = {"schedule": args.schedule, "seed": args.seed, "work": str(work), "cases": [asdict(c) for c in cases]}
    out.write_text(json.dumps(summary, indent=1))
    print(f"results: {out}", flush=True)
    raise SystemExit(0 if passed == len(cases) else 1)


if __name__ == "__main__":
    main()
