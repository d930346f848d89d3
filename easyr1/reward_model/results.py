"""What a reward model gives each sample, and how the reward function reads it.

Each reward input carries the reward model's result under :data:`RESULT_KEY`: ``{"score": float, "text": str | None,
"parsed": bool}`` (``text``: a judge's raw judgement; ``parsed``: whether the parser read it, always true for a
classifier). A reward function that declares a parameter named ``reward_model`` is called with a
:class:`ReadRewardModel` there: ``reward_model(inputs)`` returns the results of those inputs (one input or a list).
The reward model runs on the workers before the reward function is called, so the callable hands back results that
are already computed; a reward file that does not ask for it is called as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


# The key of the reward model's result in each reward input.
RESULT_KEY = "reward_model"
# The name of the reward function's parameter that receives a ReadRewardModel.
ARGUMENT = "reward_model"


class RewardModelResult(TypedDict):
    """One sample's result: its score, the judge's raw text (None for a classifier), whether it was parsed."""

    score: float
    text: str | None
    parsed: bool


class ReadRewardModel:
    """``reward_model(inputs)``: the reward model's results of reward inputs, in their order.

    Called with one input (a dict), it returns one result; with a list, a list. An input without a result (a run
    without a reward model) is a ``KeyError`` naming the key.
    """

    def __call__(self, inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
        """The result of one input, or the results of a list of inputs."""
        if isinstance(inputs, Mapping):
            return self._one(inputs)
        return [self._one(reward_input) for reward_input in inputs]

    @staticmethod
    def _one(reward_input: Mapping[str, Any]) -> RewardModelResult:
        if RESULT_KEY not in reward_input:
            raise KeyError(
                f"this reward input has no {RESULT_KEY!r} result: the run has no worker.reward_model (set "
                "worker.reward_model.kind)"
            )
        return reward_input[RESULT_KEY]
