"""Rollout stages: what turns a step's prompts into scored samples for the trainer (``base.py``: the interface).

``single_turn.py``: one response per sample (DAPO refills, ReMax baselines, validation over ``data.val_files``);
``multi_turn.py``: agents' episodes in environments; ``sampling.py``: sampling settings and seeds.
"""

from easyr1.stages.base import RolloutStage, ScoredSamples, Validation


__all__ = ["RolloutStage", "ScoredSamples", "Validation"]
