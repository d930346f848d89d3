"""End to end through the CLI: GRPO on the tiny VLM learns (in one process: FSDP2 and vLLM), and on 2 Ray workers the
batch's reordering keeps each reward on its sample."""

from __future__ import annotations

import json

import pytest
from helpers import ONE_PROCESS, train, validated_run_args
from test_cli import base_args


pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

STEPS = 20


def test_grpo_reward_rises_and_metrics_are_logged(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment):
    run_dir = tmp_path / "run"
    result = train(
        [
            *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
            *ONE_PROCESS,
            f"trainer.max_steps={STEPS}",
            # a high learning rate learns the answer format (any colour word, reward 0.2) within a few steps
            "worker.actor.optim.lr=3e-3",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    expected = {
        "reward/overall",
        "reward/format",
        "reward/accuracy",
        "response_length/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/pg_clipfrac_higher",
        "actor/lr",
        "rollout/log_prob_gap",
        "rollout/rollout_kl_k3",
        "timing/gen",
        "timing/sync",
        "timing/engine",
        "timing/update",
        "throughput/tokens_per_second",
        "reward/accuracy_max",
        "prompt_length/max",
        "advantages/min",
        "actor/pg_clipfrac_lower",
        "perf/max_host_memory_gb",
        "perf/driver_max_host_memory_gb",
        "perf/bytes_to_workers",
        "perf/bytes_from_workers",
    }
    assert expected <= set(records[0])
    # the weight sync and the engine's generate are parts of the generation call the driver times
    assert all(0 < r["timing/sync"] + r["timing/engine"] <= r["timing/gen"] for r in records)
    # one update per step: the update's own forward gave the old log-probs (no separate pass), and the mismatch
    # metrics computed from them after the update still show vLLM and the actor in sync
    assert not any("timing/old" in record for record in records)
    # vLLM sampled with the same weights the actor scored with, at every step
    assert max(record["rollout/log_prob_gap"] for record in records) < 1e-3
    rewards = [record["reward/overall"] for record in records]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last - first >= 0.1, rewards
    # the console shows one line per step
    assert sum(line.startswith("step ") for line in result.stdout.splitlines()) == STEPS


@pytest.mark.ray
def test_balancing_the_batch_across_workers_keeps_rewards_on_their_samples(
    validated_run, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path
):
    """Samples are reordered between generation and update; the reward (computed in generation order) must follow
    them. Same seeds, same samples: the first update must be the same with and without reordering. The reordered
    run (the session's validated_run, balancing and caching by default) also caches the samples' tensors on the
    workers (rows that moved are sent to their new rank), the other sends every call its own copy: the cache must
    not change the update either, only the bytes moved."""
    run_dir = tmp_path / "unbalanced"
    args = validated_run_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir, run_dir)
    result = train([*args, "trainer.max_steps=1", "trainer.balance_batch=false", "trainer.cache_sample_tensors=false"])
    assert result.returncode == 0, result.stderr[-4000:]
    firsts = {
        balance: next(record for record in records_of(directory) if record["step"] == 1)
        for balance, directory in ((True, validated_run[0]), (False, run_dir))
    }
    assert firsts[True]["reward/overall"] == firsts[False]["reward/overall"]
    assert firsts[True]["actor/grad_norm"] == pytest.approx(firsts[False]["actor/grad_norm"], rel=1e-5)
    assert firsts[True]["actor/entropy"] == pytest.approx(firsts[False]["actor/entropy"], rel=1e-5)
    # fewer bytes both ways (bench/bench_transfer.py measures how many): balancing spreads each prompt's samples
    # over both ranks, so its vision tensors still reach each rank once; generation no longer returns them
    assert firsts[True]["perf/bytes_to_workers"] < firsts[False]["perf/bytes_to_workers"]
    assert firsts[True]["perf/bytes_from_workers"] < firsts[False]["perf/bytes_from_workers"] / 2


def records_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
