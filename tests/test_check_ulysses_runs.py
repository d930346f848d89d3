"""``make check-ulysses``' harness, in milliseconds: its comparison of two runs' metrics and its verdicts, with the
CLI runs replaced by fakes that write metrics.jsonl. The real runs (about 20 of them, minutes) run outside CI."""

from __future__ import annotations

import json

import pytest

from easyr1.tools import check_ulysses_runs
from easyr1.tools.check_ulysses_runs import BOUND, STEPS, Run, compare, skip_reason


def _record(step: int, **values: float) -> dict:
    return {"step": step, "actor/grad_norm": 0.5, "reward/overall": 0.25, "timing/step": 1.0 + step, **values}


def test_equal_runs_pass_and_machine_metrics_are_not_compared():
    first = [_record(step, **{"perf/mfu": 0.1, "perf/max_host_memory_gb": 0.5}) for step in (1, 2, 3)]
    second = [
        _record(step, **{"perf/mfu": 0.2, "perf/max_host_memory_gb": 0.7, "timing/gen": 3.0}) for step in (1, 2, 3)
    ]
    result = compare(first, second, (1, 2, 3))
    assert result.ok and result.compared == 6
    assert result.skipped == {"timing/step", "timing/gen", "perf/mfu", "perf/max_host_memory_gb"}
    assert skip_reason("perf/bytes_to_workers") is None  # counts are compared, only wall-clock and memory are not


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        ([_record(1), _record(2), _record(3, **{"actor/grad_norm": 0.5 + 3 * BOUND})], "actor/grad_norm"),
        ([_record(1), _record(2), _record(3, **{"reward/overall": float("nan")})], "reward/overall"),
        ([_record(1), _record(2)], "step 3 missing"),
        ([_record(1), _record(2), _record(3, **{"critic/vf_loss": 0.1})], "only in run 2"),
    ],
)
def test_a_gap_a_missing_step_or_key_fails(second, problem):
    result = compare([_record(step) for step in (1, 2, 3)], second, (1, 2, 3))
    assert not result.ok and any(problem in line for line in result.problems), result.problems


def test_a_gap_within_the_bound_passes_relative_to_the_values_size():
    big = [_record(step, **{"actor/entropy": 6.0}) for step in (1, 2, 3)]
    near = [_record(step, **{"actor/entropy": 6.0 * (1 + BOUND / 2)}) for step in (1, 2, 3)]
    assert compare(big, near, (1, 2, 3)).ok


def _fake_train(
    grad_norm_of_ulysses_2: float, resumed_line: bool = True, announce: bool = True, resumed_shift: float = 0.0
):
    """A stand-in for check_ulysses_runs.train: metrics with actor/grad_norm depending on ulysses_size."""

    def train(directory, args, steps=STEPS, label="run"):
        ulysses = int(next(arg for arg in args if arg.startswith("worker.actor.ulysses_size=")).split("=")[1])
        path = directory / "metrics.jsonl"
        old = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        first = len(old) + 1
        grad_norm = (grad_norm_of_ulysses_2 if ulysses == 2 else 0.5) + (resumed_shift if old else 0.0)
        records = old + [_record(step, **{"actor/grad_norm": grad_norm}) for step in range(first, steps + 1)]
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        stdout = "".join(f"step {step}/{steps} | ...\n" for step in range(first, steps + 1))
        for arg in args if announce else ():  # what sequence_parallel.install prints on rank 0
            if ".ulysses_size=" in arg and not arg.endswith("=1"):
                stdout = f"(HybridWorker pid=1) easyr1: {arg}: Model's 2 decoder layers split ...\n" + stdout
        if old and resumed_line:
            stdout = f"easyr1: resumed from {directory / f'global_step_{len(old)}'} (step {len(old)} of 3)\n" + stdout
        return Run(directory, 0, 1.0, stdout, "")

    return train


def test_the_harness_passes_equal_runs_and_fails_a_ulysses_difference(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(check_ulysses_runs, "train", _fake_train(0.5))
    assert check_ulysses_runs.main(["--work-dir", str(tmp_path / "equal")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"ulysses runs: {len(check_ulysses_runs.ALL)}/{len(check_ulysses_runs.ALL)} pass"
    assert "not compared (wall-clock seconds): timing/step" in out

    # a gradient counted twice under ulysses 2: every pair and both resumes (their steps under ulysses 2) fail
    monkeypatch.setattr(check_ulysses_runs, "train", _fake_train(1.0))
    assert check_ulysses_runs.main(["--work-dir", str(tmp_path / "twice"), "--scenario", "hf"]) == 1
    out = capsys.readouterr().out
    assert "| hf | FAIL |" in out and "actor/grad_norm" in out and out.splitlines()[-1] == "ulysses runs: 0/1 pass"


def test_a_resume_that_did_not_resume_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(check_ulysses_runs, "train", _fake_train(0.5, resumed_line=False))
    assert check_ulysses_runs.main(["--work-dir", str(tmp_path), "--scenario", "resume_2_to_1"]) == 1
    assert "did not print 'easyr1: resumed from" in capsys.readouterr().out


def test_a_run_whose_workers_did_not_split_the_model_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(check_ulysses_runs, "train", _fake_train(0.5, announce=False))
    assert check_ulysses_runs.main(["--work-dir", str(tmp_path), "--scenario", "hf"]) == 1
    assert "hf_u2: the workers split nothing where worker.actor.ulysses_size=2" in capsys.readouterr().out


def test_a_resume_whose_resumed_step_differs_fails(monkeypatch, tmp_path, capsys):
    # e.g. the optimizer's moments lost at the checkpoint: steps after it differ from the uninterrupted run's
    monkeypatch.setattr(check_ulysses_runs, "train", _fake_train(0.5, resumed_shift=1e-3))
    assert check_ulysses_runs.main(["--work-dir", str(tmp_path), "--scenario", "resume_2_to_1_at_step_1"]) == 1
    out = capsys.readouterr().out
    assert "step 2 actor/grad_norm" in out and "step 1 actor/grad_norm" not in out
    assert "largest gap after the resume 1.0e-03" in out
