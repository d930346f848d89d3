"""Rollout samples on disk for the report's viewer: per logged step, a few prompts with their images and every
response with its reward and sub-scores.

``<log_dir>/rollouts.jsonl`` holds one object per logged step::

    {"step": 5, "prompts": [{"prompt": ..., "ground_truth": ..., "images": ["rollouts/step_5/p0_i0.png"],
                             "responses": [{"text": ..., "score": 0.2, "sub_scores": {"format": 1.0, ...}}]}]}

Image paths are relative to ``log_dir``; images are the exact pixels the model saw (after resizing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def group_rows(uids: list[str], count: int) -> list[list[int]]:
    """Row indices of the first ``count`` prompts (by uid, in order of first appearance), one list per prompt."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        if uid in groups or len(groups) < count:
            groups.setdefault(uid, []).append(row)
    return list(groups.values())


def write_rollouts(
    log_dir: str | os.PathLike,
    step: int,
    batch: Any,
    scores: torch.Tensor,
    sub_scores: dict[str, list[float]],
    tokenizer: Any,
    count: int,
) -> None:
    """Append ``count`` prompts of ``batch`` (a scored rollout batch) with all their responses to rollouts.jsonl."""
    log_dir = Path(log_dir)
    image_dir = log_dir / "rollouts" / f"step_{step}"
    lengths = batch["response_mask"].sum(dim=-1).tolist()
    prompts = []
    for index, rows in enumerate(group_rows(list(batch["uid"]), count)):
        first = rows[0]
        images = []
        for k, image in enumerate((batch["multi_modal_data"][first] or {}).get("images", [])):
            image_dir.mkdir(parents=True, exist_ok=True)
            image.save(image_dir / f"p{index}_i{k}.png")
            images.append(f"rollouts/step_{step}/p{index}_i{k}.png")
        responses = [
            {
                "text": tokenizer.decode(batch["responses"][row, : lengths[row]].tolist(), skip_special_tokens=True),
                "score": float(scores[row]),
                "sub_scores": {key: float(values[row]) for key, values in sub_scores.items() if key != "overall"},
            }
            for row in rows
        ]
        prompts.append(
            {
                "prompt": tokenizer.decode(batch["raw_prompt_ids"][first], skip_special_tokens=False),
                "ground_truth": str(batch["ground_truth"][first]),
                "images": images,
                "responses": responses,
            }
        )
    with (log_dir / "rollouts.jsonl").open("a", encoding="utf-8") as file:
        file.write(json.dumps({"step": step, "prompts": prompts}) + "\n")
