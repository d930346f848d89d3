"""Stages of a training step that the trainer drives: the rollout stage turns prompts into scored samples."""

from easyr1.stages.rollout import PendingRewards, Rollout, RolloutStage, SingleTurnRollout


__all__ = ["PendingRewards", "Rollout", "RolloutStage", "SingleTurnRollout"]
