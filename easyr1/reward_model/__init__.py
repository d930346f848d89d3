"""Reward models that see the images: a classifier (a value head) or a generative judge, on the hybrid workers.

``worker.reward_model`` (:mod:`easyr1.config.reward_model`) configures it. The driver renders each sample's judge
request (:mod:`~easyr1.reward_model.template`) and calls :meth:`HybridWorker.score_with_reward_model` on every worker
through ``run_split``, after generation and before the reward function (:mod:`~easyr1.reward_model.client`); each
worker scores its share with its :class:`~easyr1.reward_model.scorer.RewardModelScorer` (the classifier's forward, or
the judge's engine and :mod:`~easyr1.reward_model.parser`). The results reach the reward function in each input's
``reward_model`` entry and through its ``reward_model`` argument (:mod:`~easyr1.reward_model.results`); without a
reward file the score is the reward (``as_reward.py``). docs/reward_models.md is the user's page.
"""

from easyr1.reward_model.results import RESULT_KEY, ReadRewardModel, RewardModelResult


__all__ = ["RESULT_KEY", "ReadRewardModel", "RewardModelResult"]
