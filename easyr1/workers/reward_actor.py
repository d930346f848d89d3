"""A Ray actor that scores responses with the user's reward function, off the driver's critical path."""

from __future__ import annotations

from typing import Any

import ray
import torch

from easyr1.workers.reward import load_reward_function


@ray.remote
class RewardActor:
    """Loads the reward function once, then scores batches of reward inputs."""

    def __init__(self, spec: str, kwargs: dict[str, Any] | None, reward_type: str | None) -> None:
        self.reward_fn = load_reward_function(spec, kwargs, reward_type)

    def score(self, inputs: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """(B,) overall scores and every sub-score as a list (``overall`` included)."""
        score_dicts = self.reward_fn(inputs)
        sub_scores = {key: [float(scores[key]) for scores in score_dicts] for key in score_dicts[0]}
        return torch.tensor(sub_scores["overall"], dtype=torch.float32), sub_scores
