"""The reward function in a Ray actor, off the driver's critical path: its scores arrive while the workers go on.

Runs use it for a function without a time limit (``worker.reward.timeout: null``): called in the driver's process it
would hold the driver's GIL. A function with a limit runs in a child process of the driver instead
(:class:`~easyr1.reward.scorer.LocalRewardScorer`), where an actor would only relay the calls.

The actor runs on the driver's node when a CPU is free there (the reward file was found on that node; another node
may not have it). It never imports torch: :class:`~easyr1.reward.rewards.Rewards` travel as lists of floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from easyr1.errors import UserError
from easyr1.reward.function import RewardInput, load_reward_function
from easyr1.reward.rewards import PendingRewards, Rewards, score_batch
from easyr1.reward.timed import timed_reward_function


@ray.remote
class RewardActor:
    """Loads the reward function once, then scores batches of reward inputs (in a child process of the actor when
    the calls have a time limit: Ray runs an actor's methods outside its main thread, where no signal can stop
    them)."""

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any] | None,
        reward_type: str | None,
        timeout: float | None = None,
        timeout_score: float | None = None,
    ) -> None:
        self.reward_fn = timed_reward_function(load_reward_function(spec, kwargs, reward_type), timeout, timeout_score)

    def score(self, inputs: list[dict[str, Any]]) -> Rewards:
        """The rewards of ``inputs``: :func:`~easyr1.reward.rewards.score_batch` with the loaded function."""
        return score_batch(self.reward_fn, inputs)


class RayRewardScorer:
    """A :class:`~easyr1.reward.scorer.RewardScorer` whose reward function runs in a :class:`RewardActor`."""

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any] | None,
        reward_type: str | None,
        num_cpus: int,
        timeout: float | None = None,
        timeout_score: float | None = None,
    ) -> None:
        self.actor = RewardActor.options(
            num_cpus=num_cpus,
            # soft: if this node has no CPU free, any node will do
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
        ).remote(spec, kwargs, reward_type, timeout, timeout_score)

    def score(self, inputs: Sequence[RewardInput]) -> PendingRewards:
        """Send ``inputs`` to the actor; the rewards are fetched when first asked for."""
        scored = self.actor.score.remote(list(inputs))
        return PendingRewards(lambda: _fetch(scored))

    def close(self) -> None:
        """Stop the actor."""
        ray.kill(self.actor)


def _fetch(scored: ray.ObjectRef) -> Rewards:
    """The actor's rewards; a user error in the reward file is re-raised as it is (one message, no Ray traceback)."""
    try:
        return ray.get(scored)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, UserError):
            raise error.cause from None
        raise
