"""Batches that mix text-only, single-image, three-image and video rows train for every Qwen-VL family, with vLLM and
the actor agreeing on every token (video m-rope positions included): Qwen2.5-VL on 2 Ray workers (ranks holding
different mixes of row kinds), the other families in one process (their m-rope and processors are the point)."""

from __future__ import annotations

import json

import pytest
from helpers import ONE_PROCESS, train
from test_cli import base_args

from easyr1.tools.tiny_dataset import build_mixed_dataset


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]


@pytest.fixture(scope="module")
def mixed_dataset_dir(tmp_path_factory):
    return build_mixed_dataset(tmp_path_factory.mktemp("mixed"), num_rows=64, seed=0)


@pytest.mark.parametrize("family", ["qwen2_vl", pytest.param("qwen2_5_vl", marks=pytest.mark.ray), "qwen3_vl"])
def test_mixed_rows_train_three_steps(family, tiny_model_dir, mixed_dataset_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = train(
        [
            *base_args(tiny_model_dir(family), mixed_dataset_dir),
            *([] if family == "qwen2_5_vl" else ONE_PROCESS),
            f"data.train_files={mixed_dataset_dir / 'train.jsonl'}",
            "data.max_prompt_length=120",
            "data.min_pixels=null",  # the family's own processor bounds (Qwen3-VL's patches are larger)
            "data.max_pixels=null",
            "trainer.max_steps=3",
            # packed on the first family, padded on the others: both layouts see every row kind
            f"worker.actor.padding_free={str(family == 'qwen2_vl').lower()}",
            f"trainer.save_checkpoint_path={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    # 16 prompts per step cycle through the four row kinds, so every step mixes all of them
    assert max(record["rollout/log_prob_gap_max"] for record in records) < 1e-4
    assert all(record["actor/grad_norm"] > 0 for record in records)
