"""A text-only causal LM (no processor, 1-row position ids) trains through the whole loop (in one process): FSDP2,
vLLM, padding-free and dynamic micro-batches."""

from __future__ import annotations

import json

import pytest
from helpers import ONE_PROCESS, train
from test_cli import base_args


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]

THINGS = [("grass", "green"), ("the sky", "blue"), ("a banana", "yellow"), ("a tomato", "red")]


def test_text_only_causal_lm_trains_three_steps(tiny_model_dir, tiny_dataset_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"What colour is {thing}?", "answer": colour}) + "\n"
            for thing, colour in THINGS * 16
        )
    )
    run_dir = tmp_path / "run"
    result = train(
        [
            *base_args(tiny_model_dir("qwen3"), tiny_dataset_dir),
            *ONE_PROCESS,
            f"data.train_files={data}",
            "trainer.max_steps=3",
            "worker.actor.padding_free=true",
            "worker.actor.dynamic_batching=true",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    assert max(record["rollout/log_prob_gap"] for record in records) < 1e-3  # vLLM and the actor agree
    assert all(record["actor/grad_norm"] > 0 for record in records)
    assert (run_dir / "global_step_3" / "actor" / "model" / ".metadata").exists()
