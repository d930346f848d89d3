"""A reward model on workers of its own (``worker.reward_model.placement=standalone``): each
:class:`RewardModelWorker` is one Ray actor with a device of its own (a GPU, or CPU threads) holding the classifier or
the judge, awake for the whole run. The driver hands them a generated batch and goes on: they score it while the
hybrid workers compute the old log-probs, the reference's and the critic's (:mod:`easyr1.reward_model.client`).

Verl's counterpart is the reward model's own resource pool (``enable_resource_pool=true``); here the workers see the
images as the colocated scorer does, through the same :class:`~easyr1.reward_model.scorer.RewardModelScorer`.
"""

from __future__ import annotations

from typing import Any

from easyr1.distributed.precision import resolve_precision
from easyr1.distributed.worker import Worker, device_type
from easyr1.protocol import Batch
from easyr1.reward_model.scorer import RewardModelScorer
from easyr1.seeding import seed_everything


class RewardModelWorker(Worker):
    """One rank of the reward model's group: its scorer on this worker's device."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.scorer: RewardModelScorer | None = None

    def init_models(self) -> None:
        """Load the classifier or start the judge's engine (in the dtype the policy's engine samples in)."""
        import transformers

        from easyr1.workers.hybrid_worker import engine_dtype

        config = self.config
        self.device = device_type(config.trainer.device)
        transformers.utils.logging.disable_progress_bar()
        seed_everything(config.trainer.seed)
        precision = resolve_precision(config.worker.actor.fsdp, self.device, "actor")
        dtype = engine_dtype(config.worker.rollout.dtype, precision.compute)
        # nothing else needs this device: the scorer stays awake between steps
        self.scorer = RewardModelScorer(config, dtype, self.device, stays_awake=True)

    def score(self, batch: Batch) -> Batch:
        """This rank's share of a generated batch, scored (fields: :mod:`easyr1.reward_model.scorer`)."""
        return self.scorer.score(batch)

    def close(self) -> None:
        """Release the engine, then leave the process group."""
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None
        super().close()
