"""Policy-gradient losses, as per-token loss matrices plus diagnostics.

A loss function here never reduces over tokens: it returns a (B, T) matrix that the actor reduces with
:func:`~easyr1.algorithms.aggregation.aggregate_loss`, so every loss works with every aggregation mode and with
global normalisation over micro-batches. Losses are registered by name (``worker.actor.policy_loss``) and share
one signature: ``fn(old_log_probs, log_probs, advantages, response_mask, params) -> PolicyLossOutput``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from easyr1.algorithms.aggregation import masked_mean
from easyr1.algorithms.registry import Registry
from easyr1.errors import ConfigError


# exp() of a log-ratio beyond +-20 overflows in bf16 and yields nan gradients; the clamp only affects tokens
# whose ratio is clipped anyway.
_LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class PolicyLossParams:
    """Hyper-parameters shared by the policy losses (each loss reads the ones it needs).

    Attributes:
        clip_ratio_low: PPO lower clip: the ratio is clipped below at ``1 - clip_ratio_low``.
        clip_ratio_high: PPO upper clip: the ratio is clipped above at ``1 + clip_ratio_high`` (DAPO clip-higher).
        clip_ratio_dual: dual-clip constant ``c > 1``: for negative advantages the loss is at most ``-c * A``.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.3
    clip_ratio_dual: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ConfigError(f"clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0.0:
            raise ConfigError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_dual <= 1.0:
            raise ConfigError(f"clip_ratio_dual must be > 1 (dual-clip PPO), got {self.clip_ratio_dual}")


@dataclass
class PolicyLossOutput:
    """Result of a policy loss.

    Attributes:
        loss_mat: (B, T) per-token loss, differentiable w.r.t. ``log_probs``; not yet masked or reduced.
        metrics: scalar diagnostics (python floats), each a mean over the valid tokens of this micro-batch.
    """

    loss_mat: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


PolicyLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossParams], PolicyLossOutput]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "worker.actor.policy_loss")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a policy loss under ``name``."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """Return the policy loss registered as ``name`` (ConfigError listing the valid names otherwise)."""
    return POLICY_LOSSES.get(name)


@register_policy_loss("ppo")
def compute_policy_loss_ppo(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams | None = None,
) -> PolicyLossOutput:
    """Clipped PPO surrogate with asymmetric clip range and dual clip, per token.

    With ``r = exp(log_probs - old_log_probs)`` and ``A`` the advantage::

        clipped = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        loss    = min(clipped, -A * clip_ratio_dual)   if A < 0   (dual clip, arXiv:1912.09729)
                  clipped                              otherwise

    Metrics (means over valid tokens):

    * ``pg_clipfrac_higher``: the PPO clip raised the loss (the ratio left the trust region in the direction the
      advantage pushes it), so the token gets no gradient. Exactly on the boundary counts as not clipped.
    * ``pg_clipfrac_lower``: the dual clip lowered the loss of a negative-advantage token.
    * ``ppo_kl``: mean of ``old_log_probs - log_probs`` (k1 estimate of KL(old || new)).

    Args:
        old_log_probs: (B, T) log-probs of the sampled tokens under the policy that generated them.
        log_probs: (B, T) log-probs under the current policy (requires grad).
        advantages: (B, T) per-token advantages.
        response_mask: (B, T) valid response tokens.
        params: clip ranges; defaults to :class:`PolicyLossParams`.

    Returns:
        :class:`PolicyLossOutput` with the (B, T) loss matrix.
    """
    params = params or PolicyLossParams()
    if not (old_log_probs.shape == log_probs.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            "policy loss inputs must share one (B, T) shape, got old_log_probs "
            f"{tuple(old_log_probs.shape)}, log_probs {tuple(log_probs.shape)}, advantages "
            f"{tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))
    clipped_ratio = ratio.clamp(1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high)

    unclipped_loss = -advantages * ratio
    clip_loss = -advantages * clipped_ratio
    clipped = torch.maximum(unclipped_loss, clip_loss)
    dual_bound = -advantages * params.clip_ratio_dual
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(clipped, dual_bound), clipped)

    with torch.no_grad():
        clipped_higher = (clip_loss > unclipped_loss).float()
        clipped_lower = (negative & (clipped > dual_bound)).float()
        metrics = {
            "pg_clipfrac_higher": masked_mean(clipped_higher, response_mask).item(),
            "pg_clipfrac_lower": masked_mean(clipped_lower, response_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return PolicyLossOutput(loss_mat=loss_mat, metrics=metrics)
