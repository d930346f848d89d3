"""Pure-torch RL algorithm pieces: advantage estimators, policy losses, KL estimators, loss aggregation.

Nothing here knows about Ray, vLLM or FSDP; every function takes tensors and returns tensors, so each can be
tested against a plain-python reference. Variants are looked up by name in registries (see ``registry.py``).
"""

from easyr1.algorithms.advantage import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_grpo_advantages,
    get_adv_estimator,
    register_adv_estimator,
)
from easyr1.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss, count_normalizers, masked_mean
from easyr1.algorithms.kl import KL_ESTIMATORS, kl_penalty, register_kl_estimator
from easyr1.algorithms.logits import entropy_from_logits, log_probs_from_logits
from easyr1.algorithms.policy_loss import (
    POLICY_LOSSES,
    PolicyLossOutput,
    PolicyLossParams,
    compute_policy_loss_ppo,
    get_policy_loss,
    register_policy_loss,
)
from easyr1.algorithms.registry import Registry


__all__ = [
    "ADV_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "PolicyLossParams",
    "Registry",
    "aggregate_loss",
    "compute_advantages",
    "compute_grpo_advantages",
    "compute_policy_loss_ppo",
    "count_normalizers",
    "entropy_from_logits",
    "get_adv_estimator",
    "get_policy_loss",
    "kl_penalty",
    "log_probs_from_logits",
    "masked_mean",
    "register_adv_estimator",
    "register_kl_estimator",
    "register_policy_loss",
]
