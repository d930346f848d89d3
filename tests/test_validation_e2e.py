"""Validation before training, every val_freq steps and alone (val_only), with its metrics, logged samples and
the best-step bookkeeping of the checkpoint tracker."""

from __future__ import annotations

import json

import pytest
from helpers import ONE_PROCESS, train
from test_cli import base_args


pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def records_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.ray  # validated_run: 2 Ray workers, validation rounds not a multiple of their share
def test_validation_before_and_during_training(validated_run):
    run_dir, result = validated_run
    records = records_of(run_dir)
    assert [record["step"] for record in records] == [0, 1, 2, 3]
    validated = [record["step"] for record in records if "val/reward_score" in record]
    assert validated == [0, 2, 3]  # before training, every 2 steps, and after the last step
    # three validation rounds, one engine sleep after the last; the weights synced once per actor update (and once
    # at first), whichever generation comes first after it
    assert all(record["val/engine_sleeps"] == 1 for record in records if "val/reward_score" in record)
    syncs = sum(record.get("perf/weight_syncs", 0) + record.get("val/weight_syncs", 0) for record in records)
    assert syncs == 1 + 3
    for record in records:
        if "val/reward_score" in record:
            assert {"val/format", "val/accuracy", "val/response_length/mean"} <= set(record)
            assert 0.0 <= record["val/reward_score"] <= 1.0
    samples = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert [sample["step"] for sample in samples] == [0, 0, 2, 2, 3, 3]
    assert all({"prompt", "response", "ground_truth", "score"} <= set(sample) for sample in samples)
    assert sum("val sample" in line for line in result.stdout.splitlines()) == 6
    # the final checkpoint carries the validation score it was saved with
    tracker = json.loads((run_dir / "checkpoint_tracker.json").read_text())
    assert tracker["best_global_step"] == 3
    assert tracker["best_val_reward_score"] == pytest.approx(records[-1]["val/reward_score"])


def test_val_only_runs_validation_and_nothing_else(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment):
    run_dir = tmp_path / "run"
    result = train(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            *ONE_PROCESS,
            f"data.val_files={tiny_dataset_dir / 'val.jsonl'}",
            "trainer.val_only=true",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = records_of(run_dir)
    assert len(records) == 1 and records[0]["step"] == 0 and "val/reward_score" in records[0]
    assert "reward/overall" not in records[0]
    assert not list(run_dir.glob("global_step_*"))
