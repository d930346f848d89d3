"""Rewards: loading the user's reward function (user code), building its inputs, and scoring through a scorer.

- ``function.py``: ``worker.reward.reward_function`` loaded and called with its contract checked;
- ``inputs.py``: one input dict per sample, built from a rollout batch;
- ``rewards.py``: :class:`Rewards` (the scores the trainer reads) and :class:`PendingRewards`;
- ``scorer.py``: the scorer interface, and the scorer that calls the function in this process;
- ``ray_scorer.py``: the scorer whose function runs in a Ray actor (imported only where Ray is used).

Nothing here imports torch at module level.
"""

from easyr1.reward.function import REWARD_TYPES, RewardFunction, load_reward_function
from easyr1.reward.inputs import ROW_COLUMNS, build_reward_inputs
from easyr1.reward.rewards import PendingRewards, Rewards, score_batch
from easyr1.reward.scorer import LocalRewardScorer, RewardScorer


__all__ = [
    "REWARD_TYPES",
    "ROW_COLUMNS",
    "LocalRewardScorer",
    "PendingRewards",
    "RewardFunction",
    "RewardScorer",
    "Rewards",
    "build_reward_inputs",
    "load_reward_function",
    "score_batch",
]
