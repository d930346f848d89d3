"""The interface between the trainer and a rollout stage, and what a stage hands back.

A rollout stage turns a step's prompts into scored samples: the trainer calls :meth:`RolloutStage.collect` once per
step and :meth:`RolloutStage.validate` when it validates, reads :attr:`RolloutStage.rows_per_sample` (the training
rows one sample becomes) and does everything after the stage (balancing, experience, KL, advantages, updates) the
same way whatever the stage. A new stage is a class with these members; the trainer needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from easyr1.protocol import Batch
from easyr1.reward import PendingRewards


@dataclass
class ScoredSamples:
    """What a stage's ``collect`` returns: the samples, their rewards, and the stage's metrics and timings.

    ``batch`` holds one row per training row (``rows_per_sample`` per sample): ``prompts``, ``responses``,
    ``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs``, ``uid`` (samples
    of one prompt share it: the advantage groups), ``sample_id``, the prompt's objects, and ``reward_baselines``
    when the estimator declares a greedy baseline. ``rewards`` may still be computing (the reward function runs
    while the workers compute log-probs); ``result()`` gives them in the batch's order.
    """

    batch: Batch
    rewards: PendingRewards
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Validation:
    """What a stage's ``validate`` returns: ``val/`` metrics, and the samples to show (prompt, response,
    ground truth, score as text; ``trainer.val_generations_to_log`` of them)."""

    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


class RolloutStage(Protocol):
    """Turns a step's prompts into scored samples, and validates the current policy."""

    rows_per_sample: int
    """Training rows per sample (the unit of ``global_batch_size * n``): more than 1 when a sample is split into
    rows (an agent's turns with ``env.context=latest``)."""

    def collect(self, prompts: Batch | None, step: int) -> ScoredSamples:
        """Sample and score responses to ``prompts`` for training step ``step`` (``None`` for a stage with
        ``draws_prompts = True``, an asynchronous schedule that draws from the prompt stream itself)."""
        ...

    def validate(self, step: int) -> Validation:
        """Generate for the validation set (or seeds) with ``worker.rollout.val_override_config`` and score it."""
        ...

    def sampling(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """This run's sampling settings for one generation call, with ``overrides``."""
        ...
