"""Kill sweep: ``kill -9`` of the whole CPU demo job at seeded random moments, then a resume, ten times.

Each case starts ``python -m easyr1.main`` (examples/config_cpu.yaml, 12 steps, a checkpoint every 2 steps,
validation every 4; one case on examples/config_agent_cpu.yaml, 6 steps) in a process group of its own, waits for
its moment, kills the group with SIGKILL, runs the same command again to the end, and checks that every step's
metrics (timings, throughput and memory left out) equal those of an uninterrupted run of the same config, that no
partial step is left and that the run's checkpoints are the uninterrupted run's.

Moments are chosen by watching the job, not by sleeps alone. The case draws a step, a phase and a fraction
(seeded). Once the step is under way (the previous step's line in ``metrics.jsonl``), the driver's Python stack is
read every few milliseconds (``faulthandler`` on SIGUSR1, registered by the launcher below; the job's own code is
unchanged) until it is inside the phase: ``collect`` (generation and scoring), ``_update`` (the policy update),
``validate``, or ``save_checkpoint`` (with ``global_step_N.partial`` on disk). The bench then waits the fraction of
that phase's duration in the uninterrupted run and kills at the next reading still inside the phase (if the phase
ended meanwhile, the same phase of a later step). The stack at the kill is kept, so each case reports where the
driver really was.

    PYTHONPATH=$PWD .venv/bin/python bench/faults_kill_sweep.py [--seed 0] [--cases validation,update-1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
STEPS, AGENT_STEPS = 12, 6
SAVE_FREQ, VAL_FREQ = 2, 4
# the driver's function that marks each phase in its stack (trainer.py, stages/), and the phase's timing metric
PHASE_FRAMES = {
    "checkpoint": "save_checkpoint",
    "validation": "validate",
    "update": "_update",
    "generation": "collect",
}
PHASE_TIMINGS = {
    "checkpoint": "timing/save_checkpoint",
    "validation": "timing/validate",
    "update": "timing/update",
    "generation": "timing/gen",
}
LAUNCHER = (
    "import faulthandler, runpy, signal, sys\n"
    "faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], 'w'), all_threads=True)\n"
    "sys.argv = ['easyr1.main', *sys.argv[2:]]\n"
    "runpy.run_module('easyr1.main', run_name='__main__', alter_sys=True)\n"
)


@dataclass
class Case:
    """One kill: which config, the phase aimed at, the step it is aimed into, and how far into the phase (a fraction
    of the phase's duration in the uninterrupted run)."""

    name: str
    agent: bool
    phase: str
    step: int
    fraction: float
    # filled by the run
    delay: float | None = None
    killed_after_s: float | None = None
    killed_in: str | None = None
    stack: list[str] = field(default_factory=list)
    partial_on_disk: list[str] = field(default_factory=list)
    steps_done_at_kill: int = 0
    resumed_from: str | None = None
    resume_s: float | None = None
    result: str = "not run"


def run_args(agent: bool, run_dir: Path) -> list[str]:
    """The CLI's arguments of a case's job (and of its uninterrupted reference)."""
    config = "examples/config_agent_cpu.yaml" if agent else "examples/config_cpu.yaml"
    args = [f"config={config}", f"trainer.save_freq={SAVE_FREQ}", f"trainer.save_checkpoint_path={run_dir}"]
    if agent:
        return [*args, f"trainer.max_steps={AGENT_STEPS}"]
    return [*args, f"trainer.max_steps={STEPS}", f"trainer.val_freq={VAL_FREQ}"]


def start(args: list[str], log: Path, stacks: Path) -> subprocess.Popen:
    """The CLI through the launcher, in a session of its own so that the kill reaches Ray's processes too."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(stacks), *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_hard(process: subprocess.Popen) -> None:
    """SIGKILL the driver, then whatever is left of its process group (Ray's processes, the workers)."""
    process.send_signal(signal.SIGKILL)
    process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(2)  # let orphaned workers notice their driver is gone


def logged_steps(run_dir: Path) -> int:
    """Training steps in the run's metrics.jsonl so far."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    # a line still being written has no newline yet: counted once it is complete
    return sum(1 for line in path.read_text().split("\n")[:-1] if '"timing/step"' in line)


def main_thread_stack(dump: str) -> list[str]:
    """The driver's main-thread frames (innermost first) from the newest faulthandler dump in ``dump``."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    for block in reversed(blocks):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if any(path.endswith("easyr1/main.py") for path, _, _ in frames):
            return [f"{short_path(path)}:{line} {function}" for path, line, function in frames]
    return []


def short_path(path: str) -> str:
    """A frame's file: relative to the repository for easyr1's own, its name for a library's."""
    return str(Path(path).relative_to(REPO)) if path.startswith(f"{REPO}/") else Path(path).name


def innermost_own_frame(stack: list[str]) -> str:
    """The innermost frame in easyr1's own code outside the worker-group plumbing: the call the driver was in."""
    own = [frame for frame in stack if frame.startswith("easyr1/") and not frame.startswith("easyr1/distributed/")]
    return own[0] if own else stack[0] if stack else "?"


def phase_of(stack: list[str]) -> str:
    """The phase a main-thread stack is in (the innermost marking frame wins)."""
    functions = [frame.split(" ")[-1] for frame in stack]
    for function in functions:
        for phase, marker in PHASE_FRAMES.items():
            if function == marker:
                return phase
    return "other"


def read_stack(process: subprocess.Popen, stacks: Path) -> list[str]:
    """The driver's main-thread stack now (it writes it to ``stacks`` on SIGUSR1)."""
    offset = stacks.stat().st_size if stacks.exists() else 0
    process.send_signal(signal.SIGUSR1)
    time.sleep(0.005)
    with stacks.open() as file:
        file.seek(offset)
        return main_thread_stack(file.read())


def kill_at_moment(
    case: Case, process: subprocess.Popen, run_dir: Path, stacks: Path, log: Path, phase_seconds: float
) -> None:
    """Wait for the case's step and phase, then ``case.fraction`` of ``phase_seconds``; kill at the next stack
    reading inside the phase."""
    began = time.perf_counter()
    deadline = time.monotonic() + 900

    def check_alive(what: str) -> None:
        if process.poll() is not None:
            raise RuntimeError(f"{case.name}: the job ended before {what}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{case.name}: {what} never came")

    while logged_steps(run_dir) < case.step - 1:
        check_alive(f"step {case.step}")
        time.sleep(0.01)

    def in_phase(stack: list[str]) -> bool:
        return phase_of(stack) == case.phase and (case.phase != "checkpoint" or any(run_dir.glob("*.partial")))

    while not in_phase(read_stack(process, stacks)):
        check_alive(f"the {case.phase} of step {case.step}")
        time.sleep(0.002)
    case.delay = case.fraction * phase_seconds
    time.sleep(case.delay)
    while True:
        stack = read_stack(process, stacks)
        if in_phase(stack):
            case.partial_on_disk = sorted(p.name for p in run_dir.glob("*.partial"))
            case.steps_done_at_kill = logged_steps(run_dir)
            kill_hard(process)
            case.killed_after_s = time.perf_counter() - began
            case.killed_in, case.stack = phase_of(stack), stack
            return
        check_alive(f"a {case.phase}")
        time.sleep(0.002)


def deterministic_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per step, every metric but measurements of the machine (as tests/test_resume_fault.py compares them)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [record["step"] for record in records]
    if steps != sorted(set(steps)):
        raise AssertionError(f"steps logged twice or out of order: {steps}")
    return {
        record["step"]: {k: v for k, v in record.items() if not k.startswith(("timing/", "throughput/", "perf/"))}
        for record in records
    }


def compare(expected: dict[int, dict[str, float]], run_dir: Path, total: int) -> str:
    """``"equal"``, or what differs."""
    actual = deterministic_metrics(run_dir)
    if sorted(actual) != list(range(1, total + 1)):
        return f"steps {sorted(actual)} logged"
    for step in expected:
        if actual[step] != expected[step]:
            keys = sorted(k for k in expected[step] if actual[step].get(k) != expected[step][k])
            return f"step {step} differs in {keys[:5]}"
    leftovers = sorted(p.name for p in run_dir.iterdir() if p.name.endswith((".partial", ".deleting")))
    steps = sorted(
        int(p.name.split("_")[-1]) for p in run_dir.glob("global_step_*") if p.name.split("_")[-1].isdigit()
    )
    if leftovers:
        return f"leftovers {leftovers}"
    wanted = list(range(SAVE_FREQ, total + 1, SAVE_FREQ))
    if steps != wanted:
        return f"checkpoints {steps}, expected {wanted}"
    return "equal"


def plan_cases(seed: int) -> list[Case]:
    """Ten cases: 3 in a checkpoint write, 3 in generation, 2 in the update, 1 in validation, 1 in an agent run."""
    draw = random.Random(seed)
    saves = list(range(SAVE_FREQ, STEPS + 1, SAVE_FREQ))
    cases = [
        Case(f"checkpoint-{i + 1}", False, "checkpoint", step, draw.random())
        for i, step in enumerate(sorted(draw.sample(saves, 3)))
    ]
    cases += [
        Case(f"generation-{i + 1}", False, "generation", step, draw.random())
        for i, step in enumerate(sorted(draw.sample(range(1, STEPS + 1), 3)))
    ]
    cases += [
        Case(f"update-{i + 1}", False, "update", step, draw.random())
        for i, step in enumerate(sorted(draw.sample(range(1, STEPS + 1), 2)))
    ]
    validated = range(VAL_FREQ, STEPS + 1, VAL_FREQ)
    cases.append(Case("validation", False, "validation", draw.choice(validated), draw.random()))
    agent_phase = draw.choice(["generation", "update"])
    cases.append(Case(f"agent-{agent_phase}", True, agent_phase, draw.randint(1, AGENT_STEPS), draw.random()))
    return cases


def reference(agent: bool, work: Path) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]], float]:
    """The uninterrupted run's deterministic metrics, its timings per step, and its wall time."""
    run_dir = work / ("reference-agent" if agent else "reference")
    began = time.perf_counter()
    process = start(run_args(agent, run_dir), work / f"{run_dir.name}.log", work / f"{run_dir.name}.stacks")
    if process.wait() != 0:
        raise SystemExit(f"the uninterrupted run failed: {(work / f'{run_dir.name}.log').read_text()[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timings = {r["step"]: {k: v for k, v in r.items() if k.startswith("timing/")} for r in records}
    return deterministic_metrics(run_dir), timings, time.perf_counter() - began


def main() -> None:
    """Run the references, then every case; print one line per case and write the results as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="draws the cases' steps, phases and fractions")
    parser.add_argument("--cases", default=None, help="comma-separated case names to run (default: all ten)")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "easyr1.tools.demo_assets"], cwd=REPO, check=True)
    work = Path(tempfile.mkdtemp(prefix="kill_sweep_"))
    cases = plan_cases(args.seed)
    if args.cases:
        wanted = args.cases.split(",")
        unknown = sorted(set(wanted) - {case.name for case in cases})
        if unknown:
            raise SystemExit(f"no such case: {unknown}; the cases are {[case.name for case in cases]}")
        cases = [case for case in cases if case.name in wanted]
    print(f"work directory: {work}", flush=True)
    expected, timings, seconds = {}, {}, {}
    for agent in sorted({case.agent for case in cases}):
        expected[agent], timings[agent], seconds[agent] = reference(agent, work)
        print(f"uninterrupted {'agent ' if agent else ''}run: {seconds[agent]:.0f} s", flush=True)
    for case in cases:
        run_dir = work / case.name
        args_ = run_args(case.agent, run_dir)
        stacks = work / f"{case.name}.stacks"
        process = start(args_, work / f"{case.name}.log", stacks)
        try:
            phase_seconds = timings[case.agent][case.step].get(PHASE_TIMINGS[case.phase], 0.0)
            kill_at_moment(case, process, run_dir, stacks, work / f"{case.name}.log", phase_seconds)
        except RuntimeError as error:
            kill_hard(process)
            case.result = f"no kill: {error}"[:300]
            print(f"{case.name}: {case.result}", flush=True)
            continue
        began = time.perf_counter()
        resumed = subprocess.run(
            [sys.executable, "-m", "easyr1.main", *args_],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
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
            case.result = compare(expected[case.agent], run_dir, AGENT_STEPS if case.agent else STEPS)
        print(
            f"{case.name}: aimed at {case.fraction:.0%} into the {case.phase} of step {case.step} "
            f"(+{case.delay:.2f} s), killed after {case.killed_after_s:.1f} s in {case.killed_in} "
            f"({innermost_own_frame(case.stack)}), {case.steps_done_at_kill} steps logged, partial on disk: "
            f"{case.partial_on_disk or 'none'}; resumed from {case.resumed_from} in {case.resume_s:.0f} s: "
            f"{case.result}",
            flush=True,
        )
    passed = sum(case.result == "equal" for case in cases)
    print(f"{passed} of {len(cases)} cases resumed to the uninterrupted run's metrics", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"kill-sweep-{time.strftime('%Y%m%d-%H%M%S')}.json"
    payload = {"seed": args.seed, "work": str(work), "reference_s": seconds, "cases": [asdict(c) for c in cases]}
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"results: {out}", flush=True)
    raise SystemExit(0 if passed == len(cases) else 1)


if __name__ == "__main__":
    main()
