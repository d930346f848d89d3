"""LoRA and a frozen vision tower through the whole loop: which weights change, what the optimizer holds."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import ONE_PROCESS, train
from test_cli import base_args

from easyr1.checkpoint.merge import load_model_state_dict
from easyr1.models.loading import load_model


pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.usefixtures("rank_environment")]


def optimizer_state_keys(actor_dir) -> set[str]:
    """Parameter names that have optimizer state in the checkpoint."""
    metadata = dcp.FileSystemReader(str(actor_dir / "optimizer")).read_metadata().state_dict_metadata
    return {key.split(".", 1)[1].rsplit(".", 1)[0] for key in metadata if key.startswith("state.")}


def train_records(model_dir, data_dir, run_dir, *overrides: str) -> list[dict]:
    result = train(
        [
            *base_args(model_dir, data_dir),
            *ONE_PROCESS,
            "worker.actor.optim.lr=1e-2",
            f"trainer.save_checkpoint_path={run_dir}",
            *overrides,
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_lora_trains_only_the_adapters(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    records = train_records(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        tmp_path / "run",
        "trainer.max_steps=3",
        "worker.actor.model.lora.rank=8",
        "worker.actor.model.lora.alpha=16",
        "algorithm.disable_kl=false",
        "algorithm.use_kl_loss=true",
    )
    # vLLM sampled from base + adapters: its log-probs match the adapted actor's after every update
    assert max(record["rollout/log_prob_gap"] for record in records) < 1e-3
    # the reference is the base model (adapters off): the KL to it grows from 0 once the adapters moved
    assert records[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6) and records[-1]["actor/kl_loss"] > 1e-4

    actor_dir = tmp_path / "run" / "global_step_3" / "actor"
    saved = load_model_state_dict(actor_dir)
    initial = load_model(str(tiny_qwen2_5_vl_dir), torch.float32).state_dict()
    adapters = {key for key in saved if ".lora_" in key}
    assert adapters and not any("visual" in key for key in adapters)  # no adapters in the vision tower
    for key, value in saved.items():
        if key in adapters:
            continue
        plain = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(value, initial[plain]), f"base weight {plain} changed"
    assert any(saved[key].abs().max() > 0 for key in adapters if ".lora_B." in key)  # lora_B starts at zero
    # the optimizer holds state for the adapters only
    assert optimizer_state_keys(actor_dir) == adapters


def test_frozen_vision_tower_does_not_change(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    train_records(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        tmp_path / "run",
        "trainer.max_steps=2",
        "worker.actor.model.freeze_vision_tower=true",
    )
    actor_dir = tmp_path / "run" / "global_step_2" / "actor"
    saved = load_model_state_dict(actor_dir)
    initial = load_model(str(tiny_qwen2_5_vl_dir), torch.float32).state_dict()
    visual = [key for key in saved if key.startswith("model.visual.")]
    assert visual and all(torch.equal(saved[key], initial[key]) for key in visual)
    language = [key for key in saved if key.startswith("model.language_model.")]
    assert any(not torch.equal(saved[key], initial[key]) for key in language)
    state_keys = optimizer_state_keys(actor_dir)
    assert state_keys and not any(key.startswith("model.visual.") for key in state_keys)
