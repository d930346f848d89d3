"""The scores of a batch of samples (:class:`Rewards`), and rewards still being computed (:class:`PendingRewards`).

The trainer reads only these: a reward scorer (:mod:`easyr1.reward.scorer`) returns a :class:`PendingRewards` for the
samples it was given, and the rollout stage hands it on, so the reward function can run while the workers compute
log-probs. Nothing here imports torch at module level: the Ray reward actor (``ray_scorer.py``) stays a small process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from easyr1.reward.function import RewardFunction, RewardInput


if TYPE_CHECKING:
    import torch

    from easyr1.reward.timed import TimedRewardFunction


@dataclass(frozen=True)
class Rewards:
    """The scores of a batch of samples, in the batch's order: what the reward actor returns and the trainer reads.

    ``sub_scores`` maps every score key (``overall`` included) to its B values, kept as python floats so that their
    metrics are computed exactly as the function returned them; ``scores`` is the (B,) float32 ``overall`` score.
    Plain lists travel from the reward actor, which then never imports torch (about 0.2 GB less resident memory).
    ``timed_out`` says, per sample, whether its reward call ran past ``worker.reward.timeout`` and it got
    ``worker.reward.timeout_score``; None when no call can time out that way. ``reward_model``: with
    ``worker.reward_model``, each sample's result (``{"score", "text", "parsed"}``,
    :mod:`easyr1.reward_model.results`), for the metrics and the rollout log; None without one.
    """

    sub_scores: dict[str, list[float]]
    timed_out: list[bool] | None = field(default=None)
    reward_model: list[dict[str, Any]] | None = field(default=None)

    def __len__(self) -> int:
        return len(self.sub_scores["overall"])

    @functools.cached_property
    def scores(self) -> torch.Tensor:
        """The (B,) float32 ``overall`` scores, the reward the advantages are computed from."""
        import torch

        return torch.tensor(self.sub_scores["overall"], dtype=torch.float32)

    def index(self, rows: Sequence[int] | torch.Tensor) -> Rewards:
        """The rewards of ``rows``, in that order (a reordering, a selection or both)."""
        rows = rows.tolist() if hasattr(rows, "tolist") else list(rows)
        timed_out = None if self.timed_out is None else [self.timed_out[i] for i in rows]
        reward_model = None if self.reward_model is None else [self.reward_model[i] for i in rows]
        sub_scores = {key: [values[i] for i in rows] for key, values in self.sub_scores.items()}
        return Rewards(sub_scores, timed_out, reward_model)

    @staticmethod
    def concat(parts: Sequence[Rewards]) -> Rewards:
        """The rewards of several batches, one after the other."""
        timed_out = None
        if any(part.timed_out is not None for part in parts):
            timed_out = [flag for part in parts for flag in (part.timed_out or [False] * len(part))]
        reward_model = None
        if all(part.reward_model is not None for part in parts):
            reward_model = [result for part in parts for result in part.reward_model]
        return Rewards(
            {key: [value for part in parts for value in part.sub_scores[key]] for key in parts[0].sub_scores},
            timed_out,
            reward_model,
        )

    @property
    def timeouts(self) -> int:
        """How many samples got the timeout score."""
        return sum(self.timed_out or [])


class PendingRewards:
    """A batch's :class:`Rewards`: already known, or still computing (``resolve`` waits for them)."""

    def __init__(self, source: Rewards | Callable[[], Rewards]) -> None:
        self._source = source

    def result(self) -> Rewards:
        """The rewards, in the batch's order (waits for the scorer if it still runs)."""
        if not isinstance(self._source, Rewards):
            self._source = self._source()
        return self._source


def score_batch(reward_fn: RewardFunction | TimedRewardFunction, inputs: Sequence[RewardInput]) -> Rewards:
    """Score reward inputs (one dict per sample, see :mod:`easyr1.reward.function`) with ``reward_fn``, under its
    time limit when it has one."""
    score_dicts, timed_out = reward_fn.score_with_timeouts(inputs)
    keys = list(score_dicts[0]) if score_dicts else ["overall"]
    return Rewards({key: [float(score[key]) for score in score_dicts] for key in keys}, timed_out)
