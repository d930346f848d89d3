"""Reward scorers: what the rollout stage sends reward inputs to, getting :class:`PendingRewards` back.

A scorer's ``score(inputs)`` starts scoring and returns at once when it can, so that the reward function (user code)
runs while the workers compute log-probs. :class:`LocalRewardScorer` calls the function in this process and returns
finished rewards (``trainer.single_process``); :class:`~easyr1.reward.ray_scorer.RayRewardScorer` calls it in a Ray
actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from easyr1.reward.function import RewardFunction, RewardInput
from easyr1.reward.rewards import PendingRewards, score_batch
from easyr1.reward.timed import TimedRewardFunction


class RewardScorer(Protocol):
    """Scores samples with the run's reward function."""

    def score(self, inputs: Sequence[RewardInput]) -> PendingRewards:
        """Start scoring ``inputs`` (one dict per sample); the rewards come in the same order."""
        ...

    def close(self) -> None:
        """Release what the scorer holds (a process, ...)."""
        ...


class LocalRewardScorer:
    """The reward function called from this process, at once (in its child process when it has a time limit)."""

    def __init__(self, reward_fn: RewardFunction | TimedRewardFunction) -> None:
        self.reward_fn = reward_fn

    def score(self, inputs: Sequence[RewardInput]) -> PendingRewards:
        """The finished rewards of ``inputs``."""
        return PendingRewards(score_batch(self.reward_fn, inputs))

    def close(self) -> None:
        """Stop the reward function's child process, if it has one."""
        if isinstance(self.reward_fn, TimedRewardFunction):
            self.reward_fn.close()
