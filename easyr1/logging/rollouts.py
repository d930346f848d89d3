"""Rollout samples on disk for the report's viewer: per logged step, a few prompts with their images and every
response with its reward and sub-scores; for agent runs, every response's episode turn by turn.

``<log_dir>/rollouts.jsonl`` holds one object per logged step::

    {"step": 5, "prompts": [{"prompt": ..., "ground_truth": ..., "images": ["rollouts/step_5/p0_i0.png"],
                             "responses": [{"text": ..., "score": 0.2, "sub_scores": {"format": 1.0, ...}}]}]}

With ``worker.reward_model`` each response also has ``"reward_model": {"score": ..., "text": ..., "parsed": ...}``
(``text``: the judge's raw judgement, null for a classifier).

Image paths are relative to ``log_dir``; images are the exact pixels the model saw (after resizing).

When the batch comes from the multi-turn stage (it has ``episode`` records), a prompt is an environment seed: its
``images`` are the first observation's, and each response also has::

    "episode": {"seed": 3, "success": true, "truncated": false,
                "turns": [{"images": ["rollouts/step_5/p0_r1_t0_i0.png"], "text": ..., "action": "UP",
                           "action_valid": true, "reward": 0.0, "tokens": 12}, ...]}

where turn ``t``'s images are those of the observation the model saw right before it (``r`` numbers the responses
of the prompt, in order), ``action`` is the environment's parsed action as text (null when it read none), and the
response's ``text`` is its turns' texts separated by blank lines. When an episode's turns are separate rows
(``env.context=latest``), its first row carries the record and the images of all its turns (``episode_images``);
the episode is one response all the same.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from PIL import Image


def group_rows(uids: list[str], count: int) -> list[list[int]]:
    """Row indices of the first ``count`` prompts (by uid, in order of first appearance), one list per prompt."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        if uid in groups or len(groups) < count:
            groups.setdefault(uid, []).append(row)
    return list(groups.values())


def save_image(image: Image.Image, log_dir: Path, relative: str) -> str:
    """Save ``image`` as ``log_dir/relative`` (a PNG) and return ``relative``, the path the log records."""
    path = log_dir / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return relative


def observation_slices(episode: dict[str, Any], image_count: int) -> list[tuple[int, int]]:
    """For each turn of ``episode``, the (start, end) of its observation's images in the trajectory's images.

    The trajectory holds the first observation's images, then each later observation's; turn ``k`` records how
    many images the observation right before it had, so the slices are consecutive.
    """
    slices, start = [], 0
    for turn in episode["turns"]:
        end = start + int(turn["observation_images"])
        if end > image_count:
            raise ValueError(
                f"episode of seed {episode['seed']}: its turns count {end} observation images so far but the "
                f"trajectory has {image_count}; the episode record and multi_modal_data disagree"
            )
        slices.append((start, end))
        start = end
    return slices


def episode_entry(episode: dict[str, Any], images: list[Image.Image], log_dir: Path, prefix: str) -> dict[str, Any]:
    """An episode record as the log keeps it: each turn with its observation's images saved as
    ``{prefix}_t{turn}_i{k}.png``, its text, parsed action (as text), validity, reward and tokens."""
    turns = []
    for number, (turn, (start, end)) in enumerate(zip(episode["turns"], observation_slices(episode, len(images)))):
        observation = images[start:end]
        files = [save_image(image, log_dir, f"{prefix}_t{number}_i{k}.png") for k, image in enumerate(observation)]
        action = turn["action"]
        turns.append(
            {
                "images": files,
                "text": turn["text"],
                "action": None if action is None else str(action),
                "action_valid": bool(turn["action_valid"]),
                "reward": float(turn["reward"]),
                "tokens": int(turn["tokens"]),
            }
        )
    return {
        "seed": int(episode["seed"]),
        "success": bool(episode["success"]),
        "truncated": bool(episode["truncated"]),
        "turns": turns,
    }


def write_rollouts(
    log_dir: str | os.PathLike,
    step: int,
    batch: Any,
    scores: torch.Tensor,
    sub_scores: dict[str, list[float]],
    tokenizer: Any,
    count: int,
    reward_model: list[dict[str, Any]] | None = None,
) -> None:
    """Append ``count`` prompts of ``batch`` (a scored rollout batch) with all their responses to rollouts.jsonl;
    with ``episode`` records in the batch, each response's episode turn by turn (see the module docstring);
    ``reward_model``: each sample's reward model result (``worker.reward_model``), in the batch's order."""
    log_dir = Path(log_dir)
    step_dir = f"rollouts/step_{step}"
    lengths = batch["response_mask"].sum(dim=-1).tolist()
    episodes = batch["episode"] if "episode" in batch else [None] * len(batch)
    if "episode_images" in batch:  # one row per turn: the episode's first row speaks for it
        images_of = list(batch["episode_images"])
        shown = [row for row in range(len(batch)) if episodes[row] is not None]
    else:
        images_of = [(batch["multi_modal_data"][row] or {}).get("images", []) for row in range(len(batch))]
        shown = list(range(len(batch)))
    uids = list(batch["uid"])
    prompts = []
    for index, group in enumerate(group_rows([uids[row] for row in shown], count)):
        rows = [shown[position] for position in group]
        first = rows[0]
        images = list(images_of[first])
        if episodes[first] is not None and episodes[first]["turns"]:
            # the prompt of an episode is its first observation; later images belong to the turns
            images = images[: int(episodes[first]["turns"][0]["observation_images"])]
        responses = []
        for position, row in enumerate(rows):
            episode = None
            if episodes[row] is None:
                text = tokenizer.decode(batch["responses"][row, : lengths[row]].tolist(), skip_special_tokens=True)
            else:
                episode = episode_entry(
                    episodes[row], list(images_of[row]), log_dir, f"{step_dir}/p{index}_r{position}"
                )
                # the response region interleaves turns and observations, so the text comes from the turns
                text = "\n\n".join(turn["text"] for turn in episode["turns"])
            # an episode's score is its return (with one row per turn, a row scores its turn only)
            score = sum(turn["reward"] for turn in episode["turns"]) if episode is not None else float(scores[row])
            response: dict[str, Any] = {
                "text": text,
                "score": float(score),
                "sub_scores": {key: float(values[row]) for key, values in sub_scores.items() if key != "overall"},
            }
            if episode is not None:
                response["episode"] = episode
            if reward_model is not None:  # worker.reward_model: its score, and a judge's raw text
                response["reward_model"] = dict(reward_model[row])
            responses.append(response)
        files = [save_image(image, log_dir, f"{step_dir}/p{index}_i{k}.png") for k, image in enumerate(images)]
        prompts.append(
            {
                "prompt": tokenizer.decode(batch["raw_prompt_ids"][first], skip_special_tokens=False),
                "ground_truth": str(batch["ground_truth"][first]),
                "images": files,
                "responses": responses,
            }
        )
    with (log_dir / "rollouts.jsonl").open("a", encoding="utf-8") as file:
        file.write(json.dumps({"step": step, "prompts": prompts}) + "\n")
