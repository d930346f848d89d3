"""The judge demo's classifier builder (easyr1/tools/demo_judge.py): a few training steps write a checkpoint that the
reward model loads as a classifier (docs/reward_models.md's format), holding the trained weights, with its held-out
accuracy beside it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from easyr1.reward_model.classifier import HEAD_FILE, load_classifier
from easyr1.tools.demo_judge import ACCURACY_FILE, JudgeTraining, build_shape_judge, judge_accuracy
from easyr1.tools.tiny_model import build_tiny_model


def test_builder_writes_a_loadable_trained_classifier(tmp_path: Path) -> None:
    settings = JudgeTraining(seed=3, num_train_images=8, num_heldout_images=4, steps=3, batch_size=4)
    judge_dir = build_shape_judge(tmp_path / "judge", settings, log=False)

    model = load_classifier(str(judge_dir), torch.float32)
    hidden = model.config.text_config.hidden_size if hasattr(model.config, "text_config") else model.config.hidden_size
    head = load_file(str(judge_dir / HEAD_FILE))
    assert head["weight"].shape == (1, hidden) and head["bias"].shape == (1,)
    assert head["weight"].abs().sum() > 0  # ValueModel starts its head at zero: a trained head is not

    # the backbone saved is the trained one, not the random model the builder started from
    untrained = load_file(
        str(
            build_tiny_model(
                tmp_path / "untrained",
                family="qwen2_5_vl",
                seed=settings.seed,
                hidden_size=settings.hidden_size,
                intermediate_size=settings.intermediate_size,
                num_layers=settings.num_layers,
            )
            / "model.safetensors"
        )
    )
    trained = load_file(str(judge_dir / "model.safetensors"))
    assert trained.keys() == untrained.keys()
    assert all(trained[name].shape == untrained[name].shape for name in trained)
    assert any(not torch.equal(trained[name], untrained[name]) for name in trained)

    record = json.loads((judge_dir / ACCURACY_FILE).read_text())
    assert 0.0 <= judge_accuracy(judge_dir) == record["judge_accuracy"] <= 1.0
    assert record["settings"]["steps"] == settings.steps
    assert 0.0 < record["highest_other_score"] < 1.0
