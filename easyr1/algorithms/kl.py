"""Per-token KL estimators between the current policy and the reference policy.

Used in two places: as a penalty folded into the reward (``algorithm.use_kl_in_reward``) and as a loss term the
actor adds to the policy loss (``kl_coef * aggregate_loss(kl_penalty(...))``). Estimators follow J. Schulman,
"Approximating KL divergence" (2020); names follow EasyR1/verl, with the k1/k2/k3 aliases verl also accepts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from easyr1.algorithms.registry import Registry


KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", "algorithm.kl_penalty")

# A log-ratio of +-20 already means a probability ratio of ~5e8; clamping keeps exp() finite.
_LOG_RATIO_LIMIT = 20.0
# The k3 estimator is clamped like EasyR1/verl so that a few outlier tokens cannot dominate the loss.
_LOW_VAR_KL_LIMIT = 10.0


def register_kl_estimator(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator registering ``fn(log_probs, ref_log_probs) -> kl`` under one or more names."""

    def decorator(fn: KLEstimator) -> KLEstimator:
        for name in names:
            KL_ESTIMATORS.register(name)(fn)
        return fn

    return decorator


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate, computed in float32 (or float64 if given).

    Args:
        log_probs: (B, T) log-probs of the sampled tokens under the current policy; for ``kind="full"``,
            (B, T, V) log-probabilities over the whole vocabulary.
        ref_log_probs: same shape as ``log_probs``, under the reference policy.
        kind: ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3`` or ``full``.

    Returns:
        (B, T) per-token estimate; mask and aggregate it with :func:`~easyr1.algorithms.aggregation.aggregate_loss`.
    """
    estimator = KL_ESTIMATORS.get(kind)
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and ref_log_probs {tuple(ref_log_probs.shape)} differ")
    dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    return estimator(log_probs.to(dtype), ref_log_probs.to(dtype))


@register_kl_estimator("kl", "k1")
def _kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1 = log p - log q: unbiased, high variance, can be negative per token."""
    return log_probs - ref_log_probs


@register_kl_estimator("abs")
def _kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """|log p - log q|."""
    return (log_probs - ref_log_probs).abs()


@register_kl_estimator("mse", "k2")
def _kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log p - log q)^2: biased, low variance, non-negative."""
    return 0.5 * (log_probs - ref_log_probs).square()


@register_kl_estimator("low_var_kl", "k3")
def _kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 = q/p - log(q/p) - 1, unbiased and non-negative; clamped to [-10, 10] like EasyR1/verl."""
    log_ratio = (ref_log_probs - log_probs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return (log_ratio.exp() - log_ratio - 1).clamp(-_LOW_VAR_KL_LIMIT, _LOW_VAR_KL_LIMIT)


@register_kl_estimator("full")
def _kl_full(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || q) = sum_v p_v (log p_v - log q_v) from full (..., V) log-distributions."""
    if log_probs.dim() < 3:
        raise ValueError(
            "kl_penalty 'full' needs the full log-distributions (B, T, V) of both policies, got shape "
            f"{tuple(log_probs.shape)}; use 'low_var_kl' with sampled-token log-probs instead"
        )
    probs = log_probs.exp()
    # p * (log p - log q) with p == 0 must contribute 0 even where log q is -inf.
    terms = torch.where(probs > 0, probs * (log_probs - ref_log_probs), torch.zeros_like(probs))
    return terms.sum(dim=-1)


def kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The reward with the KL to the reference folded in: ``scores - kl_coef * KL`` on every response token.

    Args:
        token_level_scores: (B, R) the reward function's scores (on each response's last valid token).
        old_log_probs: (B, R) the rollout policy's log-probs of the sampled tokens.
        ref_log_probs: (B, R) the reference policy's log-probs of the same tokens.
        response_mask: (B, R) 1 on the response's tokens; the KL is 0 elsewhere.
        kl_coef: the KL controller's current coefficient.
        kind: the estimator (``algorithm.kl_penalty``), see :func:`kl_penalty`.

    Returns:
        (B, R) token-level rewards, and ``reward_kl`` (the per-token KL averaged over each response, then over
        the batch: what an adaptive KL controller tracks) with ``kl_coef``.
    """
    kl = kl_penalty(old_log_probs, ref_log_probs, kind) * response_mask
    rewards = token_level_scores - kl_coef * kl
    sequence_kl = (kl.sum(-1) / response_mask.sum(-1).clamp(min=1)).mean().item()
    return rewards, {"reward_kl": sequence_kl, "kl_coef": kl_coef}
