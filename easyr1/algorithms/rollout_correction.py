"""Rollout correction: truncated importance sampling (TIS) between the rollout engine and the trainer.

The rollout engine (vLLM, bf16 kernels, its own sampler) and the trainer (FSDP, another numerics path) assign
slightly different probabilities to the same tokens, so responses are sampled from ``pi_rollout`` while the policy
gradient assumes ``pi_old`` (the trainer's log-probs before the update). Truncated importance sampling reweights
each token's loss by ``w = min(pi_old / pi_rollout, threshold)`` (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"; verl's ``rollout_is``). Both log-probs are fixed before the update,
so the weights carry no gradient: the actor multiplies the per-token loss matrix by them before aggregation::

    loss_mat = policy_loss(...).loss_mat * weights

Config: ``algorithm.rollout_correction`` is null (off), ``"token_tis"`` (one weight per token) or ``"seq_tis"``
(one weight per sequence, the product of its token ratios); ``algorithm.rollout_correction_threshold`` is the cap.
"""

from __future__ import annotations

import torch

from easyr1.algorithms.aggregation import masked_mean
from easyr1.errors import ConfigError


# Config name -> level of the importance weight.
ROLLOUT_CORRECTIONS: dict[str, str] = {"token_tis": "token", "seq_tis": "sequence"}

# exp() of a larger log-ratio overflows in float32 products; such weights are truncated anyway.
_LOG_RATIO_LIMIT = 20.0


def rollout_mismatch_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the trainer's, on the sampled tokens.

    The tokens were sampled from the rollout policy, so with ``d = log pi_old - log pi_rollout``:

    * ``rollout_kl_k1`` = mean of ``-d``: k1 estimate of KL(pi_rollout || pi_old) (unbiased, can be negative);
    * ``rollout_kl_k3`` = mean of ``exp(d) - d - 1``: k3 estimate of the same KL (unbiased, non-negative);
    * ``rollout_log_prob_abs_diff`` = mean of ``|d|``.

    Means run over valid tokens. Useful with the correction off too: it measures the mismatch it would correct.

    Args:
        old_log_probs: (B, T) trainer log-probs of the sampled tokens (before the update).
        rollout_log_probs: (B, T) the rollout engine's log-probs of the same tokens.
        response_mask: (B, T) valid response tokens.
    """
    _check_shapes(old_log_probs, rollout_log_probs, response_mask)
    with torch.no_grad():
        diff = (old_log_probs.detach().double() - rollout_log_probs.detach().double()).clamp(
            -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT
        )
        return {
            "rollout_kl_k1": masked_mean(-diff, response_mask).item(),
            "rollout_kl_k3": masked_mean(diff.exp() - diff - 1.0, response_mask).item(),
            "rollout_log_prob_abs_diff": masked_mean(diff.abs(), response_mask).item(),
        }


def rollout_correction_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str = "token",
    threshold: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights of the trainer's policy against the rollout engine's, and their metrics.

    * ``mode="token"`` (``token_tis``): ``w_it = min(exp(old_it - rollout_it), threshold)``.
    * ``mode="sequence"`` (``seq_tis``): ``w_i = min(exp(sum_t (old_it - rollout_it)), threshold)`` over the valid
      tokens, the same for every token of the row.

    Metrics (over valid tokens; the truncated fraction counts sequences in sequence mode):
    ``rollout_is_mean`` / ``rollout_is_max`` (of the truncated weights), ``rollout_is_truncated_fraction`` (raw
    weight above ``threshold``), plus :func:`rollout_mismatch_metrics`.

    Args:
        old_log_probs: (B, T) trainer log-probs of the sampled tokens (before the update).
        rollout_log_probs: (B, T) the rollout engine's log-probs of the same tokens.
        response_mask: (B, T) valid response tokens.
        mode: ``"token"`` / ``"sequence"``, or the config names ``"token_tis"`` / ``"seq_tis"``.
        threshold: the cap ``C > 0`` on the weights (verl and the TIS blog use about 2).

    Returns:
        (weights (B, T) without gradient, float32 (float64 for float64 inputs), 0 outside the mask; metrics as
        python floats).
    """
    _check_shapes(old_log_probs, rollout_log_probs, response_mask)
    level = ROLLOUT_CORRECTIONS.get(mode, mode)
    if level not in ("token", "sequence"):
        valid = ", ".join([*ROLLOUT_CORRECTIONS, "token", "sequence"])
        raise ConfigError(f"Unknown rollout correction {mode!r} for `algorithm.rollout_correction`. Valid: {valid}.")
    if not threshold > 0:
        raise ConfigError(f"algorithm.rollout_correction_threshold must be positive, got {threshold}")

    valid_tokens = response_mask.bool()
    with torch.no_grad():
        diff = old_log_probs.detach().double() - rollout_log_probs.detach().double()
        diff = torch.where(valid_tokens, diff, torch.zeros_like(diff))
        if level == "sequence":
            diff = diff.sum(dim=-1, keepdim=True).expand_as(diff)
        raw = diff.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT).exp()
        weights = torch.where(valid_tokens, raw.clamp(max=threshold), torch.zeros_like(raw))
        truncated = (raw > threshold) & valid_tokens
        if level == "sequence":
            rows = valid_tokens.any(dim=-1)
            fraction = (truncated.any(dim=-1) & rows).sum().item() / max(rows.sum().item(), 1)
        else:
            fraction = masked_mean(truncated.double(), valid_tokens).item()
        metrics = {
            "rollout_is_mean": masked_mean(weights, valid_tokens).item(),
            "rollout_is_max": weights.max().item() if valid_tokens.any() else 0.0,
            "rollout_is_truncated_fraction": fraction,
            **rollout_mismatch_metrics(old_log_probs, rollout_log_probs, response_mask),
        }
    dtype = torch.float64 if old_log_probs.dtype == torch.float64 else torch.float32
    return weights.to(dtype), metrics


def _check_shapes(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor) -> None:
    if not (old_log_probs.shape == rollout_log_probs.shape == response_mask.shape) or response_mask.dim() != 2:
        raise ValueError(
            "rollout correction inputs must share one (B, T) shape, got old_log_probs "
            f"{tuple(old_log_probs.shape)}, rollout_log_probs {tuple(rollout_log_probs.shape)}, response_mask "
            f"{tuple(response_mask.shape)}"
        )
