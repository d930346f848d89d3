"""The scores of a batch of samples (:class:`Rewards`), and rewards still being computed (:class:`PendingRewards`).

The trainer reads only these: a reward scorer (:mod:`easyr1.reward.scorer`) returns a :class:`PendingRewards` for the
samples it was given, and the rollout stage hands it on, so the reward function can run while the workers compute
log-probs. Nothing here imports torch at module level: the Ray reward actor (``ray_scorer.py``) stays a small process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from easyr1.reward.function import RewardFunction, RewardInput


if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Rewards:
    """The scores of a batch of samples, in the batch's order: what the reward actor returns and the trainer reads.

    ``sub_scores`` maps every score key (``overall`` included) to its B values, kept as python floats so that their
    metrics are computed exactly as the function returned them; ``scores`` is the (B,) float32 ``overall`` score.
    Plain lists travel from the reward actor, which then never imports torch (about 0.2 GB less resident memory).
    """

    sub_scores: dict[str, list[float]]

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
        return Rewards({key: [values[i] for i in rows] for key, values in self.sub_scores.items()})

    @staticmethod
    def concat(parts: Sequence[Rewards]) -> Rewards:
        """The rewards of several batches, one after the other."""
        return Rewards(
            {key: [value for part in parts for value in part.sub_scores[key]] for key in parts[0].sub_scores}
        )


class PendingRewards:
    """A batch's :class:`Rewards`: already known, or still computing (``resolve`` waits for them)."""

    def __init__(self, source: Rewards | Callable[[], Rewards]) -> None:
        self._source = source

    def result(self) -> Rewards:
        """The rewards, in the batch's order (waits for the scorer if it still runs)."""
        if not isinstance(self._source, Rewards):
            self._source = self._source()
        return self._source


def score_batch(reward_fn: RewardFunction, inputs: Sequence[RewardInput]) -> Rewards:
    """Score reward inputs (one dict per sample, see the module docstring) with ``reward_fn``."""
    score_dicts = reward_fn(inputs)
    keys = list(score_dicts[0]) if score_dicts else ["overall"]
    return Rewards({key: [float(score[key]) for score in score_dicts] for key in keys})
