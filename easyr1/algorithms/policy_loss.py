"""Policy-gradient losses, as per-token loss matrices plus diagnostics.

A loss function here never reduces over tokens: it returns a (B, T) matrix that the actor reduces with
:func:`~easyr1.algorithms.aggregation.aggregate_loss`, so every loss works with every aggregation mode and with
global normalisation over micro-batches. Losses are registered by name (``worker.actor.loss_type``) and share
one signature: ``fn(old_log_probs, log_probs, advantages, response_mask, params) -> PolicyLossOutput``.

Registered: ``ppo`` (clipped surrogate, asymmetric clip, dual clip), ``gspo`` and ``gspo_token`` (sequence-level
ratio), ``cispo`` (clipped, stop-gradient importance weight on a REINFORCE term) and ``sapo`` (soft gates instead
of a hard clip). Rollout correction multiplies any of these loss matrices by per-token weights, see
:mod:`easyr1.algorithms.rollout_correction`.
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
        clip_ratio_low: the ratio is clipped below at ``1 - clip_ratio_low`` (ppo, gspo, cispo); 1 removes the
            lower bound (MiniMax-M1's CISPO setting).
        clip_ratio_high: the ratio is clipped above at ``1 + clip_ratio_high`` (DAPO clip-higher; ppo, gspo, cispo).
        clip_ratio_dual: dual-clip constant ``c > 1``: for negative advantages the loss is at most ``-c * A``
            (ppo, gspo).
        tau_positive: SAPO gate temperature for tokens with ``A >= 0``.
        tau_negative: SAPO gate temperature for tokens with ``A < 0`` (larger: the gate closes faster).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.3
    clip_ratio_dual: float = 3.0
    tau_positive: float = 1.0
    tau_negative: float = 1.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low <= 1.0:
            raise ConfigError(f"clip_ratio_low must be in [0, 1], got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0.0:
            raise ConfigError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_dual <= 1.0:
            raise ConfigError(f"clip_ratio_dual must be > 1 (dual-clip PPO), got {self.clip_ratio_dual}")
        for name in ("tau_positive", "tau_negative"):
            if getattr(self, name) <= 0.0:
                raise ConfigError(f"{name} must be positive (SAPO gate temperature), got {getattr(self, name)}")


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

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "worker.actor.loss_type")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a policy loss under ``name``."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """Return the policy loss registered as ``name`` (ConfigError listing the valid names otherwise)."""
    return POLICY_LOSSES.get(name)


def _check_shapes(
    old_log_probs: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> None:
    if not (old_log_probs.shape == log_probs.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            "policy loss inputs must share one (B, T) shape, got old_log_probs "
            f"{tuple(old_log_probs.shape)}, log_probs {tuple(log_probs.shape)}, advantages "
            f"{tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    if response_mask.dim() != 2:
        raise ValueError(f"policy loss inputs must be (B, T), got shape {tuple(response_mask.shape)}")


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))


def _clipped_surrogate(
    log_ratio: torch.Tensor,
    token_log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """The clipped, dual-clipped surrogate of ``ppo``/``gspo``/``gspo_token`` for a given (B, T) log-ratio.

    ``token_log_ratio`` (``log_probs - old_log_probs``) only feeds the ``ppo_kl`` metric.
    """
    ratio = _ratio(log_ratio)
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
            "ppo_kl": masked_mean(-token_log_ratio, response_mask).item(),
        }
    return PolicyLossOutput(loss_mat=loss_mat, metrics=metrics)


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

    PPO: Schulman et al. 2017, arXiv:1707.06347; clip-higher: DAPO, Yu et al. 2025, arXiv:2503.14476.

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
    _check_shapes(old_log_probs, log_probs, advantages, response_mask)
    log_ratio = log_probs - old_log_probs
    return _clipped_surrogate(log_ratio, log_ratio, advantages, response_mask, params)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams | None = None,
) -> PolicyLossOutput:
    """GSPO: the PPO clip applied to one importance ratio per sequence (Zheng et al. 2025, arXiv:2507.18071).

    ``s_i = exp(mean_t (log_probs_it - old_log_probs_it))`` over the valid tokens of response ``i`` (the
    length-normalised sequence likelihood ratio) replaces the token ratio in :func:`compute_policy_loss_ppo`'s
    formula, clip ranges and dual clip included (as in EasyR1), and is broadcast to every token of the row: each
    token's loss depends on all the row's log-probs, each of which receives ``1 / |y_i|`` of ``d s_i``. With
    ``seq-mean-token-mean`` aggregation this is exactly the paper's objective. The paper's clip range is tiny
    (``clip_ratio_low=3e-4``, ``clip_ratio_high=4e-4``, EasyR1's GSPO example); the defaults are PPO's. A row
    without valid tokens gets ratio 1.

    Metrics as in :func:`compute_policy_loss_ppo` (clip fractions count tokens, so longer sequences weigh more;
    ``ppo_kl`` is the token-level k1).

    Args:
        old_log_probs: (B, T) log-probs of the sampled tokens under the policy that generated them.
        log_probs: (B, T) log-probs under the current policy (requires grad).
        advantages: (B, T) advantages (GSPO uses sequence-level ones, constant along each row).
        response_mask: (B, T) valid response tokens.
        params: clip ranges; defaults to :class:`PolicyLossParams`.

    Returns:
        :class:`PolicyLossOutput` with the (B, T) loss matrix.
    """
    params = params or PolicyLossParams()
    _check_shapes(old_log_probs, log_probs, advantages, response_mask)
    token_log_ratio = log_probs - old_log_probs
    sequence_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1)
    log_ratio = sequence_log_ratio.unsqueeze(-1).expand_as(token_log_ratio)
    return _clipped_surrogate(log_ratio, token_log_ratio, advantages, response_mask, params)


@register_policy_loss("gspo_token")
def compute_policy_loss_gspo_token(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams | None = None,
) -> PolicyLossOutput:
    """GSPO-token: the sequence ratio's value with a per-token gradient (Zheng et al. 2025, arXiv:2507.18071).

    ``s_it = sg[s_i] * pi_it / sg[pi_it]``, i.e. in log space ``sg[log s_i] + log_probs_it - sg[log_probs_it]``:
    numerically equal to GSPO's ``s_i`` (so the same clip decisions, per sequence), but the gradient of token ``t``
    is ``s_i * d log_probs_it`` and so uses that token's own advantage. With advantages constant along each row
    the gradient equals :func:`compute_policy_loss_gspo`'s; they differ for token-level advantages. Same clip and
    dual clip as :func:`compute_policy_loss_ppo` (EasyR1).

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
    _check_shapes(old_log_probs, log_probs, advantages, response_mask)
    token_log_ratio = log_probs - old_log_probs
    sequence_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1).detach()
    log_ratio = sequence_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach()
    return _clipped_surrogate(log_ratio, token_log_ratio, advantages, response_mask, params)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams | None = None,
) -> PolicyLossOutput:
    """CISPO: REINFORCE weighted by a clipped importance ratio that carries no gradient (MiniMax-M1).

    ``loss = -sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log_probs`` (MiniMax et al. 2025,
    arXiv:2506.13585). Unlike PPO no token loses its gradient: a clipped ratio only caps the token's weight. The
    paper uses no lower bound (``clip_ratio_low=1``); EasyR1's example uses ``clip_ratio_low=0``,
    ``clip_ratio_high=4``. The loss *value* contains ``log_probs`` and is not comparable to PPO's; its gradient
    ``-w * A * d log_probs`` is what matters.

    Metrics: ``pg_clipfrac_higher`` / ``pg_clipfrac_lower``: the ratio was above ``1 + clip_ratio_high`` / below
    ``1 - clip_ratio_low`` (its weight was capped); ``ppo_kl`` as in :func:`compute_policy_loss_ppo`.

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
    _check_shapes(old_log_probs, log_probs, advantages, response_mask)
    log_ratio = log_probs - old_log_probs
    with torch.no_grad():
        ratio = _ratio(log_ratio)
        low, high = 1.0 - params.clip_ratio_low, 1.0 + params.clip_ratio_high
        weight = ratio.clamp(low, high)
    loss_mat = -weight * advantages * log_probs
    with torch.no_grad():
        metrics = {
            "pg_clipfrac_higher": masked_mean((ratio > high).float(), response_mask).item(),
            "pg_clipfrac_lower": masked_mean((ratio < low).float(), response_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return PolicyLossOutput(loss_mat=loss_mat, metrics=metrics)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams | None = None,
) -> PolicyLossOutput:
    """SAPO: a smooth, temperature-controlled gate on the token ratio instead of PPO's hard clip.

    ``loss = -A * f_tau(r)`` with ``f_tau(r) = (4 / tau) * sigmoid(tau * (r - 1))``, ``tau = tau_positive`` for
    ``A >= 0`` and ``tau_negative`` for ``A < 0`` (Gao et al. 2025, "Soft Adaptive Policy Optimization",
    arXiv:2511.20347; EasyR1's formula). The gradient is ``-A * w * r * d log_probs`` with the gate weight
    ``w = 4 * sigmoid(x) * (1 - sigmoid(x))``, ``x = tau * (r - 1)``: 1 at ``r = 1`` (the on-policy gradient) and
    decaying smoothly as the ratio leaves 1, faster for larger ``tau``.

    Metrics: ``sapo_gate_weight``: mean of ``w`` (1 on-policy; lower means more damped tokens); ``ppo_kl`` as in
    :func:`compute_policy_loss_ppo`.

    Args:
        old_log_probs: (B, T) log-probs of the sampled tokens under the policy that generated them.
        log_probs: (B, T) log-probs under the current policy (requires grad).
        advantages: (B, T) per-token advantages.
        response_mask: (B, T) valid response tokens.
        params: gate temperatures; defaults to :class:`PolicyLossParams`.

    Returns:
        :class:`PolicyLossOutput` with the (B, T) loss matrix.
    """
    params = params or PolicyLossParams()
    _check_shapes(old_log_probs, log_probs, advantages, response_mask)
    log_ratio = log_probs - old_log_probs
    ratio = _ratio(log_ratio)
    tau = torch.where(
        advantages >= 0,
        torch.full_like(ratio, params.tau_positive),
        torch.full_like(ratio, params.tau_negative),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss_mat = -advantages * gate
    with torch.no_grad():
        opening = torch.sigmoid(tau * (ratio - 1.0))
        metrics = {
            "sapo_gate_weight": masked_mean(4.0 * opening * (1.0 - opening), response_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return PolicyLossOutput(loss_mat=loss_mat, metrics=metrics)
