"""Fault test: ``kill -9`` the driver during a checkpoint write, resume, and get exactly the metrics of an
uninterrupted run; the checkpoint directory never holds a partial step afterwards.

Kills at other moments (generation, the update, validation, an agent run, and under the asynchronous schedules) are
the kill sweeps outside the suite, minutes each: ``make bench-faults`` and ``make bench-faults-async``
(bench/README.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import train
from test_cli import base_args

from easyr1.checkpoint.manager import TRACKER_NAME, CheckpointDirectory
from easyr1.checkpoint.merge import load_model_state_dict


pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.e2e]

STEPS = 6


def run_args(model_dir: Path, data_dir: Path, run_dir: Path) -> list[str]:
    """6 steps (64 rows / 16 prompts: the run crosses an epoch boundary), a checkpoint every 2 steps, PPO with a
    critic, a cosine LR schedule and an adaptive KL controller in the reward: the data position, both models'
    weights and optimizer state, the scheduler and the KL state all have to come back exactly."""
    return [
        *base_args(model_dir, data_dir),
        f"trainer.max_steps={STEPS}",
        "trainer.save_freq=2",
        "algorithm.adv_estimator=gae",
        "worker.actor.optim.lr_scheduler_type=cosine",
        "algorithm.disable_kl=false",
        "algorithm.use_kl_loss=false",
        "algorithm.kl_type=adaptive",
        "worker.actor.optim.lr=1e-3",
        f"trainer.save_checkpoint_path={run_dir}",
    ]


def start(args: list[str], log: Path) -> subprocess.Popen:
    """The CLI in its own process group, so a kill reaches Ray's helper processes too."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "easyr1.main", *args],
            cwd=Path(__file__).resolve().parents[1],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_hard(process: subprocess.Popen) -> None:
    """``kill -9`` the driver, then whatever of its process group is left (Ray's agents)."""
    process.send_signal(signal.SIGKILL)
    process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(2)  # let the orphaned workers notice their driver is gone


def deterministic_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per step, every metric except measurements of the machine (wall times, peak memory)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records]
    assert steps == sorted(set(steps)), f"steps logged twice or out of order: {steps}"
    return {
        record["step"]: {k: v for k, v in record.items() if not k.startswith(("timing/", "throughput/", "perf/"))}
        for record in records
    }


def test_kill_during_checkpoint_write_then_resume_exactly(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    reference_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "interrupted"
    # the uninterrupted run in this process: its process is not the point
    reference = train(run_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir, reference_dir))
    assert reference.returncode == 0, reference.stderr[-4000:]
    expected = deterministic_metrics(reference_dir)
    assert sorted(expected) == list(range(1, STEPS + 1))

    # 1. Killed while step 4's checkpoint is being written: the partial step stays on disk under its staging name.
    args = run_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir, run_dir)
    process = start(args, tmp_path / "run.log")
    partial = run_dir / "global_step_4.partial"
    deadline = time.monotonic() + 600
    while not partial.exists():
        assert process.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "step 4's checkpoint was never written"
        time.sleep(0.002)
    kill_hard(process)
    assert partial.exists() and not (run_dir / "global_step_4").exists()
    assert CheckpointDirectory(run_dir).complete_steps() == [2]

    # 2. Resumed to the end (the leftover partial step removed, step 2 the newest).
    final = train(args)  # in this process
    assert final.returncode == 0, final.stderr[-4000:]
    assert "resumed from" in final.stdout and "global_step_2" in final.stdout
    context = "(killed during step 4's checkpoint write)"

    actual = deterministic_metrics(run_dir)
    assert sorted(actual) == list(range(1, STEPS + 1)), context
    for step in expected:
        assert actual[step] == expected[step], f"step {step} differs {context}"
    checkpoints = CheckpointDirectory(run_dir)
    assert checkpoints.leftovers() == [] and checkpoints.complete_steps() == [2, 4, 6], context
    assert json.loads((run_dir / TRACKER_NAME).read_text())["last_global_step"] == STEPS
    # and it ends with bit-identical weights (actor and critic), saved by 2 ranks and read back by one
    for component in ("actor", "critic"):
        expected_weights = load_model_state_dict(reference_dir / f"global_step_{STEPS}" / component)
        actual_weights = load_model_state_dict(run_dir / f"global_step_{STEPS}" / component)
        assert expected_weights.keys() == actual_weights.keys()
        for name, value in expected_weights.items():
            assert torch.equal(actual_weights[name], value), f"{component} {name} {context}"
