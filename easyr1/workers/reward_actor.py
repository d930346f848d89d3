"""A Ray actor that scores responses with the user's reward function, off the driver's critical path."""

from __future__ import annotations

from typing import Any

import ray

from easyr1.workers.reward import Rewards, load_reward_function, score_batch


@ray.remote
class RewardActor:
    """Loads the reward function once, then scores batches of reward inputs."""

    def __init__(self, spec: str, kwargs: dict[str, Any] | None, reward_type: str | None) -> None:
        self.reward_fn = load_reward_function(spec, kwargs, reward_type)

    def score(self, inputs: list[dict[str, Any]]) -> Rewards:
        """The rewards of ``inputs``: :func:`~easyr1.workers.reward.score_batch` with the loaded function."""
        return score_batch(self.reward_fn, inputs)
