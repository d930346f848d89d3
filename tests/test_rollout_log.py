"""Rollouts kept for the report (``write_rollouts``) and the report page built from them (``write_report``):
single-turn samples as before, and agent episodes turn by turn with each observation's images.

Real files in tmp_path, real PIL images, the tiny BPE tokenizer; the batches are built by hand with the fields
the trainer's batch carries at the point it logs rollouts.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from easyr1.logging.rollouts import write_rollouts
from easyr1.protocol import Batch
from easyr1.tools.report import write_report
from easyr1.tools.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny byte-level BPE tokenizer the demo model uses."""
    return build_tokenizer()


def solid(colour: tuple[int, int, int], size: int = 24) -> Image.Image:
    """A one-colour image, so a file's pixels tell which image it is."""
    return Image.new("RGB", (size, size), colour)


def colour_of(path: Path) -> tuple[int, int, int]:
    """The one colour of a saved solid image (asserting it is one colour)."""
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    assert (pixels == pixels[0]).all(), f"{path} is not one colour"
    return tuple(int(value) for value in pixels[0])


def padded(rows: list[list[int]], width: int, pad: int) -> torch.Tensor:
    """Right-padded token rows."""
    return torch.tensor([row + [pad] * (width - len(row)) for row in rows], dtype=torch.long)


def write_report_beside(run_dir: Path) -> str:
    """The report page of ``run_dir`` (a metrics file is what the report needs to exist)."""
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/overall": 0.5}) + "\n")
    return write_report(run_dir).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------------- single-turn
def single_turn_batch(tokenizer) -> tuple[Batch, list[str], list[Image.Image]]:
    """Two prompts (one image each) with two responses each, rows of a group interleaved as after balancing."""
    pad = tokenizer.pad_token_id
    texts = ["red circle", "blue <b> square", "green", "yellow triangle"]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(len(row) for row in ids) + 3
    images = [solid((200, 20, 20)), solid((20, 20, 200))]
    uids = ["a", "b", "a", "b"]
    prompt_ids = {"a": tokenizer.encode("What colour? A", add_special_tokens=False)}
    prompt_ids["b"] = tokenizer.encode("What shape? B", add_special_tokens=False)
    batch = Batch(
        tensors={
            "responses": padded(ids, width, pad),
            "response_mask": padded([[1] * len(row) for row in ids], width, 0),
        },
        non_tensors={
            "uid": uids,
            "raw_prompt_ids": [prompt_ids[uid] for uid in uids],
            "ground_truth": ["red" if uid == "a" else "square" for uid in uids],
            "multi_modal_data": [{"images": [images[0 if uid == "a" else 1]]} for uid in uids],
        },
    )
    return batch, texts, images


def test_single_turn_rollouts_keep_their_format(tmp_path, tokenizer):
    batch, texts, images = single_turn_batch(tokenizer)
    scores = torch.tensor([1.0, 0.25, 0.0, 0.5])
    sub_scores = {"overall": scores.tolist(), "format": [1.0, 1.0, 0.0, 1.0], "accuracy": [1.0, 0.0, 0.0, 0.0]}
    write_rollouts(tmp_path, 4, batch, scores, sub_scores, tokenizer, count=2)

    (entry,) = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert set(entry) == {"step", "prompts"} and entry["step"] == 4
    assert [set(prompt) for prompt in entry["prompts"]] == [{"prompt", "ground_truth", "images", "responses"}] * 2
    first, second = entry["prompts"]
    assert (first["prompt"], first["ground_truth"]) == ("What colour? A", "red")
    assert (second["prompt"], second["ground_truth"]) == ("What shape? B", "square")
    assert first["images"] == ["rollouts/step_4/p0_i0.png"] and second["images"] == ["rollouts/step_4/p1_i0.png"]
    assert colour_of(tmp_path / first["images"][0]) == images[0].getpixel((0, 0))
    assert colour_of(tmp_path / second["images"][0]) == images[1].getpixel((0, 0))
    # the responses of each group, in batch order, with exactly the keys single-turn logs always had
    assert first["responses"] == [
        {"text": texts[0], "score": 1.0, "sub_scores": {"format": 1.0, "accuracy": 1.0}},
        {"text": texts[2], "score": 0.0, "sub_scores": {"format": 0.0, "accuracy": 0.0}},
    ]
    assert [response["text"] for response in second["responses"]] == [texts[1], texts[3]]
    # one image per prompt, nothing else
    assert sorted(p.name for p in (tmp_path / "rollouts" / "step_4").iterdir()) == ["p0_i0.png", "p1_i0.png"]

    page = write_report_beside(tmp_path)
    assert "blue &lt;b&gt; square" in page and "class=turns" not in page
    assert '<img src="../rollouts/step_4/p1_i0.png"' in page and "<td class=reward>0.25</td>" in page


# -------------------------------------------------------------------------------------------------------- episodes
# A distinct colour for every observation image of the test, so that a wrong index shows in the saved pixels.
COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240)]


def episode_batch(tokenizer) -> tuple[Batch, list[dict], list[list[list[tuple[int, int, int]]]]]:
    """Three episodes as the multi-turn stage assembles them: seed 7 played twice (2 and 3 turns, rows 0 and 2)
    and seed 8 once (1 turn, text only, row 1). Returns the batch, the episode records, and per row the colours of
    each turn's observation images."""
    pad = tokenizer.pad_token_id
    # per row: per turn, the colours of the observation the model saw before it (several images on one turn)
    observations = [[[COLOURS[0]], [COLOURS[1]]], [[]], [[COLOURS[2]], [COLOURS[3], COLOURS[4]], [COLOURS[5]]]]
    turn_texts = [
        ["go up", "then <script>alert(1)</script> left"],
        ["press nothing"],
        ["right", "up up", "done: down"],
    ]
    actions: list[list[object]] = [[("up", 1), None], ["noop"], ["right", "up", "down"]]
    valid = [[True, False], [True], [True, True, True]]
    rewards = [[0.0, -0.1], [0.0], [0.0, 0.25, 1.0]]
    records, responses, masks, images = [], [], [], []
    for row, texts in enumerate(turn_texts):
        ids, mask = [], []
        for turn, text in enumerate(texts):
            model = tokenizer.encode(text, add_special_tokens=False)
            ids += model
            mask += [1] * len(model)
            if turn + 1 < len(texts):  # the next observation's tokens: attended to, never trained on
                observation = tokenizer.encode(" observation ", add_special_tokens=False)
                ids += observation
                mask += [0] * len(observation)
        responses.append(ids)
        masks.append(mask)
        turns = [
            {
                "text": text,
                "action": actions[row][turn],
                "reward": rewards[row][turn],
                "action_valid": valid[row][turn],
                "tokens": len(tokenizer.encode(text, add_special_tokens=False)),
                "observation_images": len(observations[row][turn]),
            }
            for turn, text in enumerate(texts)
        ]
        records.append({"seed": 8 if row == 1 else 7, "success": row == 2, "truncated": row == 0, "turns": turns})
        images.append([solid(colour) for turn in observations[row] for colour in turn])
    width = max(len(ids) for ids in responses) + 2
    uids = ["3-0", "3-1", "3-0"]
    prompt = {uid: tokenizer.encode(f"Reach the goal. Seed {uid}", add_special_tokens=False) for uid in set(uids)}
    batch = Batch(
        tensors={"responses": padded(responses, width, pad), "response_mask": padded(masks, width, 0)},
        non_tensors={
            "uid": uids,
            "raw_prompt_ids": [prompt[uid] for uid in uids],
            "ground_truth": [f"seed {record['seed']}" for record in records],
            "multi_modal_data": [{"images": row_images} if row_images else {} for row_images in images],
            "episode": records,
        },
    )
    return batch, records, observations


def test_episodes_are_logged_and_shown_turn_by_turn(tmp_path, tokenizer):
    batch, records, observations = episode_batch(tokenizer)
    returns = torch.tensor([sum(turn["reward"] for turn in record["turns"]) for record in records])
    sub_scores = {"overall": returns.tolist(), "success": [float(record["success"]) for record in records]}
    write_rollouts(tmp_path, 3, batch, returns, sub_scores, tokenizer, count=2)

    (entry,) = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    seed_7, seed_8 = entry["prompts"]
    # the prompt of an episode group shows the first observation of its first episode only
    assert seed_7["ground_truth"] == "seed 7" and seed_7["images"] == ["rollouts/step_3/p0_i0.png"]
    assert colour_of(tmp_path / seed_7["images"][0]) == COLOURS[0]
    assert seed_8["ground_truth"] == "seed 8" and seed_8["images"] == []
    logged = {0: seed_7["responses"][0], 2: seed_7["responses"][1], 1: seed_8["responses"][0]}
    place = {0: (0, 0), 2: (0, 1), 1: (1, 0)}  # batch row -> (prompt, response) in the log
    for row, response in logged.items():
        record, episode = records[row], response["episode"]
        assert response["score"] == pytest.approx(float(returns[row]))
        assert response["sub_scores"] == {"success": float(record["success"])}
        assert response["text"] == "\n\n".join(turn["text"] for turn in record["turns"])
        assert (episode["seed"], episode["success"], episode["truncated"]) == (
            record["seed"],
            record["success"],
            record["truncated"],
        )
        assert len(episode["turns"]) == len(record["turns"])
        prompt, position = place[row]
        for number, (turn, expected) in enumerate(zip(episode["turns"], record["turns"])):
            assert turn["text"] == expected["text"] and turn["reward"] == pytest.approx(expected["reward"])
            assert turn["action"] == (None if expected["action"] is None else str(expected["action"]))
            assert turn["action_valid"] is expected["action_valid"] and turn["tokens"] == expected["tokens"]
            colours = observations[row][number]
            assert turn["images"] == [
                f"rollouts/step_3/p{prompt}_r{position}_t{number}_i{k}.png" for k in range(len(colours))
            ]
            assert [colour_of(tmp_path / path) for path in turn["images"]] == colours
    assert logged[0]["episode"]["turns"][0]["action"] == "('up', 1)"  # the parsed action's str()
    saved = sorted(path.name for path in (tmp_path / "rollouts" / "step_3").iterdir())
    assert len(saved) == 1 + 2 + 4  # the prompt's image, then every observation image of the two image episodes

    page = write_report_beside(tmp_path)
    assert "<script>" not in page and "then &lt;script&gt;alert(1)&lt;/script&gt; left" in page
    # every turn in order, each row: its observation images, the model's text, the action, the reward
    turn_rows = re.findall(r"<table class=turns>.*?</table>", page)
    assert len(turn_rows) == 3
    for table, row in zip(turn_rows, [0, 2, 1]):  # the page follows the log: seed 7's two episodes, then seed 8
        cells = re.findall(
            r"<tr><td>(\d+)</td><td class=images>(.*?)</td><td class=text>(.*?)</td>(<td.*?</td>)"
            r"<td class=reward>(.*?)</td></tr>",
            table,
        )
        response = logged[row]["episode"]
        assert [int(cell[0]) for cell in cells] == list(range(1, len(response["turns"]) + 1))
        for (_, images, text, action, reward), turn in zip(cells, response["turns"]):
            assert re.findall(r'src="\.\./([^"]+)"', images) == turn["images"]
            assert text == html.escape(turn["text"])
            shown = "none" if turn["action"] is None else html.escape(turn["action"])
            if turn["action_valid"]:
                assert action == f"<td class=action>{shown}</td>"
            else:
                assert action == f"<td class='action invalid'>{shown} (invalid)</td>"
            assert float(reward) == pytest.approx(turn["reward"])
    summaries = re.findall(r"<p class=episode>(.*?)</p>", page)
    assert summaries == [
        "seed 7 · 2 turns · return <b>-0.1</b> · no success · truncated",
        "seed 7 · 3 turns · return <b>1.25</b> · success",
        "seed 8 · 1 turn · return <b>0</b> · no success",
    ]


def test_success_rates_are_plotted_with_the_other_curves(tmp_path):
    records = [
        {"step": step, "reward/overall": 0.1 * step, "env/success_rate": 0.2 * step, "val/success_rate": 0.15 * step}
        for step in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    index = write_report(tmp_path)
    assert sorted(path.name for path in index.parent.glob("*.png")) == ["reward.png", "success_rate.png"]
    assert '<img src="success_rate.png"' in index.read_text()
    pixels = np.asarray(Image.open(index.parent / "success_rate.png").convert("RGB"), dtype=int)
    # both series are drawn: matplotlib's first two line colours (blue, orange) are on the canvas
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(pixels - colour).sum(axis=-1) < 30).sum() > 50, colour
