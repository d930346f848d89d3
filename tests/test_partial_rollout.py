"""``async_training.schedule=partial_rollout``: responses that span updates, a bounded staleness, exact resume.

A tiny model whose responses end at any of 14 tokens has long-tailed lengths (p50 about 16 tokens, a few past 100),
so with 48-token responses and three times the step's prompts in flight (``max_staleness=2``) most steps stop with
responses still running, which continue under the next step's weights. Runs are in this process
(``trainer.single_process``) on vLLM.
"""

from __future__ import annotations

import json

import pytest
from helpers import ONE_PROCESS, train
from test_cli import base_args

from easyr1.tools.tiny_model import build_tiny_model


pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

MEASURED = ("timing/", "perf/", "throughput/")


@pytest.fixture(scope="module")
def long_tail_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("long_tail"), stop_tokens=12)


def partial_args(model_dir, data_dir, run_dir, *overrides: str) -> list[str]:
    return [
        *base_args(model_dir, data_dir),
        *ONE_PROCESS,
        "async_training.schedule=partial_rollout",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=4",
        "data.max_response_length=48",
        "async_training.in_flight_prompts=12",
        "async_training.max_staleness=2",
        "trainer.val_before_train=false",
        "trainer.val_freq=-1",
        f"trainer.save_checkpoint_path={run_dir}",
        *overrides,
    ]


def records(run_dir) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {
        record["step"]: {key: value for key, value in record.items() if not key.startswith(MEASURED)}
        for record in map(json.loads, lines)
    }


def test_partial_responses_continue_within_the_bound_carry_their_images_and_resume_exactly(
    long_tail_model, tiny_dataset_dir, tmp_path, rank_environment
):
    # the policy is not updated in steps 1-2 (trainer.critic_warmup=2), then trained in steps 3-4
    full = train(
        partial_args(
            long_tail_model,
            tiny_dataset_dir,
            tmp_path / "full",
            "trainer.max_steps=4",
            "trainer.save_freq=2",
            "trainer.critic_warmup=2",
        )
    )
    assert full.returncode == 0, full.stderr[-3000:]
    steps = records(tmp_path / "full")
    assert sorted(steps) == [1, 2, 3, 4]
    # responses crossed updates, none older than the bound (max_staleness=2), every trained sample counted
    assert steps[2]["async/partial_ratio"] > 0 and max(record["async/span/max"] for record in steps.values()) >= 2
    assert all(record["async/staleness/max"] <= 2 for record in steps.values())
    assert any(record["async/staleness/max"] == 2 for record in steps.values())  # the bound is what held them back
    assert all(record["batch/samples"] == 16 for record in steps.values())
    assert any(record["async/carried_groups"] > 0 or record["async/inflight_groups"] > 4 for record in steps.values())
    # While the weights are unchanged (steps 1-2), every token the engine sampled, in any segment, has the log-prob
    # the actor gives it: a continuation that lost its images (or their positions) would be scored differently.
    assert all(steps[step]["rollout/log_prob_gap_max"] < 1e-4 for step in (1, 2)), [steps[1], steps[2]]

    # the pool in flight at step 2 is in the checkpoint: the resumed run's steps 3 and 4 are the uninterrupted run's
    resumed = train(
        partial_args(
            long_tail_model,
            tiny_dataset_dir,
            tmp_path / "resumed",
            "trainer.max_steps=4",
            "trainer.critic_warmup=2",
            f"trainer.load_checkpoint_path={tmp_path / 'full' / 'global_step_2'}",
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = records(tmp_path / "resumed")
    assert sorted(again) == [3, 4]
    for step in (3, 4):
        assert again[step] == steps[step], step
    assert steps[3]["actor/pg_loss"] != steps[4]["actor/pg_loss"]  # the steps differ: the equality says something

    # the pool belongs to the schedule: resuming that step synchronously is refused before any worker starts
    switched = train(
        [
            *base_args(long_tail_model, tiny_dataset_dir),
            *ONE_PROCESS,
            f"trainer.save_checkpoint_path={tmp_path / 'switched'}",
            f"trainer.load_checkpoint_path={tmp_path / 'full' / 'global_step_2'}",
        ]
    )
    assert switched.returncode == 2
    assert "async_training.schedule=partial_rollout" in switched.stderr and "asks for sync" in switched.stderr
