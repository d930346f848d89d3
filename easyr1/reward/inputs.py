"""What a reward function is called with: one dict per sample, built on the driver from the rollout batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from easyr1.reward.function import RewardInput


if TYPE_CHECKING:
    from easyr1.protocol import Batch


# The batch field holding each sample's other dataset columns ({name: value}), as the dataset yields them.
ROW_COLUMNS = "row_columns"


def build_reward_inputs(batch: Batch, tokenizer: Any, skip_special_tokens: bool) -> list[RewardInput]:
    """One reward input per sample of ``batch`` (its keys: :mod:`easyr1.reward.function`'s docstring).

    Reads ``responses``, ``response_mask``, ``ground_truth``, ``raw_prompt_ids`` and, when present, ``row_columns``;
    a prompt shared by several samples (same ``uid``) is decoded once.
    """
    lengths = batch["response_mask"].sum(dim=-1).tolist()
    responses = tokenizer.batch_decode(
        [ids[:length].tolist() for ids, length in zip(batch["responses"], lengths)],
        skip_special_tokens=skip_special_tokens,
    )
    keys = batch["uid"] if "uid" in batch else range(len(batch))
    prompt_texts: dict[Any, str] = {}
    for key, prompt_ids in zip(keys, batch["raw_prompt_ids"]):
        if key not in prompt_texts:
            prompt_texts[key] = tokenizer.decode(list(prompt_ids), skip_special_tokens=skip_special_tokens)
    columns = batch[ROW_COLUMNS] if ROW_COLUMNS in batch else [{}] * len(batch)
    inputs = []
    for i, (key, response, length) in enumerate(zip(keys, responses, lengths)):
        reward_input = {
            "response": response,
            "response_length": int(length),
            "ground_truth": batch["ground_truth"][i],
            "prompt": prompt_texts[key],
        }
        for name, value in (columns[i] or {}).items():
            reward_input.setdefault(name, value)
        inputs.append(reward_input)
    return inputs
