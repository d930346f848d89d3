"""The rollout stage's pieces that run without workers: sampling seeds and the reward inputs built from a batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from easyr1.data import RLDataset, collate_fn
from easyr1.errors import UserError
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.reward import build_reward_inputs
from easyr1.stages.sampling import GREEDY_SEEDS_START, greedy_baseline_first_seed, round_first_seed


def sampling_seeds(seed: int, step: int, round_index: int, samples: int) -> set[int]:
    first = round_first_seed(seed, step, round_index, samples)
    return set(range(first, first + samples))


def greedy_seeds(seed: int, step: int, prompts: int) -> set[int]:
    first = greedy_baseline_first_seed(seed, step, prompts)
    return set(range(first, first + prompts))


def test_sampling_seeds_are_those_of_earlier_releases() -> None:
    """Sampling rounds keep their seeds (a resumed run and the metrics of earlier runs depend on them)."""
    assert round_first_seed(1, 3, 2, 64) == ((1 * 1_000_003 + 3) * 1_009 + 2) * 64


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_greedy_baseline_seeds_are_no_sampling_round_seeds(seed: int) -> None:
    """ReMax's greedy round used round 999, which DAPO reaches with trainer.max_try_make_batch=-1. Greedy rounds
    now draw from a range no sampling round reaches, for any round count, step or batch size."""
    prompts, n = 16, 4
    for step in (1, 2, 500):
        greedy = greedy_seeds(seed, step, prompts)
        assert min(greedy) >= GREEDY_SEEDS_START
        for round_index in (0, 1, 998, 999, 1_000, 100_000):
            for samples in (prompts, prompts * n, 4 * n):
                assert not greedy & sampling_seeds(seed, step, round_index, samples), (step, round_index, samples)
    # distinct steps have distinct greedy seeds
    assert not greedy_seeds(seed, 1, prompts) & greedy_seeds(seed, 2, prompts)
    # and seeds stay int64, as the engines take them
    assert max(greedy_seeds(seed, 10**6, 4096)) < 2**63


def test_a_seed_that_leaves_the_sampling_range_is_a_user_error() -> None:
    with pytest.raises(UserError, match="worker.rollout.seed"):
        round_first_seed(10**12, 1, 0, 4096)


@pytest.fixture(scope="module")
def tokenizer_and_rows(tiny_qwen2_5_vl_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    rows = [
        {"problem": "What colour is a ripe tomato?", "answer": "red", "data_source": "fruit", "extra_info": {"id": 3}},
        {"problem": "What colour is the sky?", "answer": "blue", "data_source": "nature", "extra_info": {"id": 8}},
        # columns named like the fixed reward inputs do not replace them
        {"problem": "What colour is grass?", "answer": "green", "data_source": "nature", "response": "spoof"},
    ]
    path = tmp_path_factory.mktemp("reward_rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tokenizer, processor = load_tokenizer_and_processor(str(tiny_qwen2_5_vl_dir))
    dataset = RLDataset(
        str(path),
        tokenizer,
        processor,
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=64,
        model_config=load_model_config(str(tiny_qwen2_5_vl_dir)),
    )
    return tokenizer, rows, collate_fn([dataset[i] for i in range(len(rows))])


def test_reward_inputs_carry_the_prompt_and_the_rows_other_columns(tokenizer_and_rows) -> None:
    tokenizer, rows, prompts = tokenizer_and_rows
    n = 2
    prompts["uid"] = np.array([f"1-0-{i}" for i in range(len(rows))], dtype=object)
    batch = prompts.repeat(n, interleave=True)
    responses = [tokenizer.encode(text, add_special_tokens=False) for text in ("red", "blue sky") * len(rows)]
    width = max(len(ids) for ids in responses) + 2
    batch["responses"] = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids in responses])
    batch["response_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in responses])

    inputs = build_reward_inputs(batch, tokenizer, skip_special_tokens=True)

    assert len(inputs) == len(rows) * n
    for i, reward_input in enumerate(inputs):
        row = rows[i // n]
        expected_columns = {key: value for key, value in row.items() if key not in ("problem", "answer")}
        expected_columns.pop("response", None)
        assert list(reward_input)[:4] == ["response", "response_length", "ground_truth", "prompt"]
        assert {key: reward_input[key] for key in expected_columns} == expected_columns
        assert set(reward_input) == {"response", "response_length", "ground_truth", "prompt", *expected_columns}
        assert reward_input["ground_truth"] == row["answer"]
        assert reward_input["response"] == ("red" if i % 2 == 0 else "blue sky")
        assert reward_input["response_length"] == len(responses[i])
        # the prompt as the model saw it: the chat template around the row's text
        assert row["problem"] in reward_input["prompt"] and reward_input["prompt"] != row["problem"]
    with_special = build_reward_inputs(batch, tokenizer, skip_special_tokens=False)
    assert "<|im_start|>" in with_special[0]["prompt"] and "<|im_start|>" not in inputs[0]["prompt"]
