"""The ``algorithm`` section: advantage estimator, KL regularisation and online filtering, with their checks.

Names (estimators, KL estimators, KL controllers, rollout corrections) are checked against the registries in
:mod:`easyr1.algorithms`, the only lists of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.algorithms.advantage import ADV_ESTIMATORS
from easyr1.algorithms.kl import KL_ESTIMATORS
from easyr1.algorithms.kl_controller import KL_CONTROLLERS
from easyr1.algorithms.rollout_correction import ROLLOUT_CORRECTIONS
from easyr1.config.fields import option
from easyr1.config.rules import NON_NEGATIVE, POSITIVE, UNIT, one_of


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
    rollout_correction: str | None = option(
        None,
        "truncated importance sampling against the rollout engine's log-probs: null (off), "
        + ", ".join(ROLLOUT_CORRECTIONS),
    )
    rollout_correction_threshold: float = option(2.0, "cap of the rollout-correction importance weights")


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
    if algo.rollout_correction is not None:
        one_of(problems, "algorithm.rollout_correction", algo.rollout_correction, list(ROLLOUT_CORRECTIONS))
