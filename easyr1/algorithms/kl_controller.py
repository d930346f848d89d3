"""Controllers of the KL coefficient used when the KL penalty is folded into the reward.

With ``algorithm.use_kl_loss=false`` the trainer computes ``r_t = score_t - beta * KL_t`` before the advantages;
``beta`` comes from a controller: fixed (``algorithm.kl_type=fixed``) or adapted towards a target KL
(``adaptive``, Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593).
Controllers have ``state_dict`` / ``load_state_dict`` so that a resumed run continues with the same coefficient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from easyr1.algorithms.registry import Registry
from easyr1.errors import ConfigError


# Ziegler et al. clip the proportional error so one step changes beta by at most 20% of n_steps / horizon.
_ERROR_CLIP = 0.2


class FixedKLController:
    """A constant KL coefficient.

    Args:
        kl_coef: the coefficient ``beta >= 0``.
    """

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ConfigError(f"algorithm.kl_coef must be non-negative, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt: the coefficient stays fixed."""

    def state_dict(self) -> dict[str, Any]:
        """The coefficient, for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.value = _read_value(state)


class AdaptiveKLController:
    """A KL coefficient that grows when the measured KL exceeds the target and shrinks when it is below.

    After each step: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + e * n_steps / horizon`` (Ziegler et al. 2019, arXiv:1909.08593, eq. 2; EasyR1, verl and TRL
    call it with ``n_steps`` = the number of samples in the step).

    Args:
        init_kl_coef: the starting coefficient (``algorithm.kl_coef``).
        target_kl: the KL per token the controller steers towards (``algorithm.kl_target``).
        horizon: samples over which a constant error changes the coefficient by about ``e`` (``algorithm.kl_horizon``).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not init_kl_coef >= 0:
            raise ConfigError(f"algorithm.kl_coef must be non-negative, got {init_kl_coef}")
        if not target_kl > 0:
            raise ConfigError(f"algorithm.kl_target must be positive for the adaptive KL controller, got {target_kl}")
        if not horizon > 0:
            raise ConfigError(f"algorithm.kl_horizon must be positive for the adaptive KL controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards keeping ``current_kl`` at the target, scaled by ``n_steps / horizon``."""
        if not math.isfinite(current_kl):
            raise ValueError(f"the measured KL is {current_kl}; cannot adapt the KL coefficient")
        error = min(max(current_kl / self.target_kl - 1.0, -_ERROR_CLIP), _ERROR_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """The current coefficient, for checkpoints (target and horizon come from the config)."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.value = _read_value(state)


KLController = FixedKLController | AdaptiveKLController

# A builder ``fn(kl_coef, kl_target, kl_horizon) -> controller`` per ``algorithm.kl_type``.
KLControllerBuilder = Callable[[float, float, float], KLController]

KL_CONTROLLERS: Registry[KLControllerBuilder] = Registry("KL controller", "algorithm.kl_type")


@KL_CONTROLLERS.register("fixed")
def _fixed(kl_coef: float, kl_target: float, kl_horizon: float) -> KLController:
    return FixedKLController(kl_coef)


@KL_CONTROLLERS.register("adaptive")
def _adaptive(kl_coef: float, kl_target: float, kl_horizon: float) -> KLController:
    return AdaptiveKLController(kl_coef, kl_target, kl_horizon)


# The registered types, for help texts; the registry stays the one list.
KL_CONTROLLER_TYPES: tuple[str, ...] = tuple(KL_CONTROLLERS.names())


def build_kl_controller(
    kl_type: str, kl_coef: float, kl_target: float = 0.1, kl_horizon: float = 10000.0
) -> KLController:
    """The controller registered as ``algorithm.kl_type`` (``fixed`` or ``adaptive``), built from the config values."""
    if kl_type not in KL_CONTROLLERS:
        raise ConfigError(
            f"algorithm.kl_type={kl_type!r} is not supported; valid values: {', '.join(KL_CONTROLLERS.names())}"
        )
    return KL_CONTROLLERS.get(kl_type)(kl_coef, kl_target, kl_horizon)


def _read_value(state: dict[str, Any]) -> float:
    value = state.get("value") if isinstance(state, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"KL controller state must be {{'value': float}}, got {state!r}")
    return float(value)
