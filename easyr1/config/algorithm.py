"""The ``algorithm`` section: advantage estimator, KL regularisation and online filtering, with their checks.

Names (estimators, KL estimators, KL controllers, rollout correction methods) are checked against the registries
in :mod:`easyr1.algorithms`, the only lists of them. The rollout correction's keys carry verl's names
(``algorithm.rollout_correction.*`` there, flat here); :mod:`easyr1.algorithms.rollout_correction` resolves and
checks them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.algorithms.advantage import ADV_ESTIMATORS
from easyr1.algorithms.kl import KL_ESTIMATORS
from easyr1.algorithms.kl_controller import KL_CONTROLLERS
from easyr1.algorithms.rollout_correction import (
    DEFAULT_IS_THRESHOLD,
    ROLLOUT_IS,
    ROLLOUT_RS,
    CorrectionSettings,
    correction_settings,
    settings_problems,
)
from easyr1.config.fields import option
from easyr1.config.rules import NON_NEGATIVE, POSITIVE, POSITIVE_OR_NULL, UNIT, one_of


@dataclass
class AlgorithmConfig:
    """The RL algorithm: advantage estimator, KL regularisation and online filtering."""

    gamma: float = option(1.0, "discount factor (gae, reinforce_plus_plus; inside a turn for turn_gae)")
    lam: float = option(1.0, "lambda of GAE")
    turn_gamma: float = option(1.0, "discount from one turn of an episode to the next (turn_gae, multi-turn runs)")
    turn_lam: float = option(1.0, "GAE lambda over an episode's turns (turn_gae, multi-turn runs)")
    adv_estimator: str = option("grpo", f"advantage estimator: {', '.join(ADV_ESTIMATORS.names())}")
    disable_kl: bool = option(False, "no reference model and no KL term at all (wins over use_kl_loss)")
    use_kl_loss: bool = option(False, "put the KL in the policy loss (true) or subtract it from the reward (false)")
    kl_penalty: str = option("kl", f"KL estimator: {', '.join(KL_ESTIMATORS.names())}")
    kl_coef: float = option(1e-3, "KL coefficient (the starting value for the adaptive controller)")
    kl_type: str = option("fixed", f"controller of the in-reward KL coefficient: {', '.join(KL_CONTROLLERS.names())}")
    kl_horizon: float = option(10000.0, "horizon of the adaptive KL controller")
    kl_target: float = option(0.1, "target KL of the adaptive KL controller")
    online_filtering: bool = option(False, "DAPO dynamic sampling: drop groups whose mean score is out of range")
    filter_key: str = option("overall", "score key that online filtering looks at")
    filter_low: float = option(0.01, "online filtering keeps groups whose mean score is above this")
    filter_high: float = option(0.99, "online filtering keeps groups whose mean score is below this")
    norm_adv_by_std: bool = option(True, "divide group-relative advantages by the group's std (false: Dr.GRPO)")
    rollout_correction_mode: str = option(
        "decoupled",
        "decoupled (the trainer recomputes the old policy; rollout_is weights pi_old / pi_rollout act on the loss) or "
        "bypass (the engine's log-probs are the old policy: no old-log-prob pass, PPO's ratio is pi_theta / "
        "pi_rollout, weights are metrics only); verl's rollout_correction.bypass_mode",
    )
    rollout_is: str | None = option(
        None,
        f"importance weights against the rollout engine's log-probs: null (off), {', '.join(ROLLOUT_IS.names())} "
        "(token / sequence TIS capped at rollout_is_threshold; icepop: 0 outside [rollout_is_threshold_lower, "
        "rollout_is_threshold])",
    )
    rollout_is_threshold: float = option(
        DEFAULT_IS_THRESHOLD, "cap of the TIS weights; IcePop's upper ratio bound (verl's default for IcePop: 5.0)"
    )
    rollout_is_threshold_lower: float | None = option(
        None, "IcePop's lower ratio bound (null: 1 / rollout_is_threshold; verl's default: 0.5)"
    )
    rollout_rs: str | list[str] | None = option(
        None,
        f"rejection against the rollout engine: null (off), or one or more (a list, or comma-separated; all must "
        f"keep a token) of {', '.join(ROLLOUT_RS.names())}; rejected tokens leave the loss",
    )
    rollout_rs_threshold: str | None = option(
        None,
        "bounds of rollout_rs, verl's format: one for all options or one per option, comma-separated; *_k1 take "
        "ratio bounds low_high on 1 / ratio (or u for 1/u_u), *_k3 an upper bound; null: each option's preset "
        "(token_k1 0.2_5.0, seq_sum_k1 0.5_2.0, seq_mean_k1 0.999_1.001, seq_mean_k3 0.01)",
    )
    rollout_correction: str | None = option(
        None,
        "older shorthand of rollout_is: token_tis (rollout_is=token) or seq_tis (rollout_is=sequence); null: off",
    )
    rollout_correction_threshold: float = option(
        DEFAULT_IS_THRESHOLD, "older name of rollout_is_threshold (setting both to different values is refused)"
    )

    def rollout_correction_settings(self) -> CorrectionSettings:
        """The rollout correction these keys configure, the shorthand resolved (ConfigError for a bad setting)."""
        return correction_settings(self)


# Value rules of single keys, relative to ``algorithm``.
ALGORITHM_RANGES = {
    "gamma": UNIT,
    "lam": UNIT,
    "turn_gamma": UNIT,
    "turn_lam": UNIT,
    "kl_coef": NON_NEGATIVE,
    "kl_horizon": POSITIVE,
    "kl_target": POSITIVE,
    "rollout_correction_threshold": POSITIVE,
    "rollout_is_threshold": POSITIVE,
    "rollout_is_threshold_lower": POSITIVE_OR_NULL,
}


def check_algorithm_pairs(algo: AlgorithmConfig, problems: list[str]) -> None:
    """Pairs of ``algorithm`` values in the wrong order."""
    if algo.online_filtering and not algo.filter_low < algo.filter_high:
        problems.append(
            f"algorithm.filter_low={algo.filter_low} must be below algorithm.filter_high={algo.filter_high}: "
            "online filtering would drop every group"
        )


def check_algorithm_names(algo: AlgorithmConfig, problems: list[str]) -> None:
    """``algorithm`` names that must be registered."""
    one_of(problems, "algorithm.adv_estimator", algo.adv_estimator, ADV_ESTIMATORS.names())
    one_of(problems, "algorithm.kl_penalty", algo.kl_penalty, KL_ESTIMATORS.names())
    one_of(problems, "algorithm.kl_type", algo.kl_type, KL_CONTROLLERS.names())
    # the rollout correction's names, bounds and mode together (a threshold's meaning depends on the method)
    problems.extend(settings_problems(algo))
