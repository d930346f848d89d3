"""The reward function of a run with a reward model and no reward file: the reward model's score is the reward.

Sub-scores: ``reward_model`` (the same score) and ``reward_model_parsed`` (1 when the judgement was parsed).
"""

from __future__ import annotations

from typing import Any


REWARD_TYPE = "batch"


def compute_score(reward_inputs: list[dict[str, Any]], reward_model: Any) -> list[dict[str, float]]:
    """Each sample's reward model score as its reward."""
    results = reward_model(reward_inputs)
    return [
        {"overall": result["score"], "reward_model": result["score"], "reward_model_parsed": float(result["parsed"])}
        for result in results
    ]
