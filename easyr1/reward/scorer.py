"""Reward scorers: what the rollout stage sends reward inputs to, getting :class:`PendingRewards` back.

A scorer's ``score(inputs)`` starts scoring and returns at once when it can, so that the reward function (user code)
runs while the workers compute log-probs. :class:`LocalRewardScorer` serves it from this process: under
``worker.reward.timeout`` (the default) the function runs in its child process and a thread here waits for the
scores, so ``score`` returns at once; without a limit the function is called here and ``score`` returns finished
rewards (``trainer.single_process`` only). :class:`~easyr1.reward.ray_scorer.RayRewardScorer` calls a function
without a limit in a Ray actor, off the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
    """The reward function served from this process: in its child process by a thread of this one when it has a
    time limit (``score`` returns at once), else called here (``score`` returns finished rewards)."""

    def __init__(self, reward_fn: RewardFunction | TimedRewardFunction) -> None:
        self.reward_fn = reward_fn
        # The child computes; the thread only sends the inputs through a pipe and waits for the scores, without the
        # GIL, so the caller goes on. One thread: calls are scored in the order they were made.
        timed = isinstance(reward_fn, TimedRewardFunction)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="reward") if timed else None

    def score(self, inputs: Sequence[RewardInput]) -> PendingRewards:
        """Start scoring ``inputs``: the rewards of a function with a time limit come later, others at once."""
        if self._thread is None:
            return PendingRewards(score_batch(self.reward_fn, inputs))
        return PendingRewards(self._thread.submit(score_batch, self.reward_fn, list(inputs)).result)

    def close(self) -> None:
        """Drop the calls not started, wait for the one running (at most the time limit), and stop the reward
        function's child process, if it has one."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        if isinstance(self.reward_fn, TimedRewardFunction):
            self.reward_fn.close()
