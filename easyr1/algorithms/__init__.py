"""Pure-torch RL algorithm pieces: reward placement, advantage estimators, policy losses, KL, loss aggregation,
filtering.

Nothing here knows about Ray, vLLM or FSDP; every function takes tensors and returns tensors, so each can be
tested against a plain-python reference. Variants are looked up by name in registries (see ``registry.py``).
"""

from easyr1.algorithms.advantage import (
    ADV_ESTIMATORS,
    EstimatorNeeds,
    compute_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_grpo_passk_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    estimator_needs,
    get_adv_estimator,
    masked_whiten,
    register_adv_estimator,
)
from easyr1.algorithms.aggregation import (
    LOSS_AGG_MODES,
    LOSS_AGGREGATIONS,
    aggregate_loss,
    count_normalizers,
    masked_mean,
    register_loss_aggregation,
)
from easyr1.algorithms.episode_rows import episode_advantages
from easyr1.algorithms.filtering import filter_groups
from easyr1.algorithms.kl import KL_ESTIMATORS, kl_in_reward, kl_penalty, register_kl_estimator
from easyr1.algorithms.kl_controller import (
    KL_CONTROLLER_TYPES,
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    build_kl_controller,
)
from easyr1.algorithms.logits import entropy_from_logits, log_probs_from_logits
from easyr1.algorithms.policy_loss import (
    POLICY_LOSSES,
    PolicyLossOutput,
    PolicyLossParams,
    compute_policy_loss_cispo,
    compute_policy_loss_gspo,
    compute_policy_loss_gspo_token,
    compute_policy_loss_ppo,
    compute_policy_loss_sapo,
    get_policy_loss,
    register_policy_loss,
)
from easyr1.algorithms.registry import Registry
from easyr1.algorithms.rewards import place_scores_on_last_token, place_turn_rewards
from easyr1.algorithms.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    ROLLOUT_IS,
    ROLLOUT_RS,
    CorrectionSettings,
    correction_settings,
    rollout_correction,
    rollout_mismatch_metrics,
)
from easyr1.algorithms.turn_advantage import compute_turn_gae_advantages


__all__ = [
    "ADV_ESTIMATORS",
    "KL_CONTROLLER_TYPES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "ROLLOUT_CORRECTIONS",
    "ROLLOUT_IS",
    "ROLLOUT_RS",
    "CorrectionSettings",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "PolicyLossOutput",
    "PolicyLossParams",
    "Registry",
    "aggregate_loss",
    "build_kl_controller",
    "compute_advantages",
    "compute_gae_advantages",
    "compute_grpo_advantages",
    "compute_grpo_passk_advantages",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gspo",
    "compute_policy_loss_gspo_token",
    "compute_policy_loss_ppo",
    "compute_policy_loss_sapo",
    "compute_reinforce_plus_plus_advantages",
    "compute_reinforce_plus_plus_baseline_advantages",
    "compute_remax_advantages",
    "EstimatorNeeds",
    "estimator_needs",
    "compute_rloo_advantages",
    "compute_turn_gae_advantages",
    "count_normalizers",
    "entropy_from_logits",
    "episode_advantages",
    "filter_groups",
    "get_adv_estimator",
    "get_policy_loss",
    "kl_in_reward",
    "kl_penalty",
    "log_probs_from_logits",
    "masked_mean",
    "masked_whiten",
    "place_scores_on_last_token",
    "place_turn_rewards",
    "register_adv_estimator",
    "register_kl_estimator",
    "register_loss_aggregation",
    "register_policy_loss",
    "correction_settings",
    "rollout_correction",
    "rollout_mismatch_metrics",
]
