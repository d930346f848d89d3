"""The critic's loss for PPO with GAE: a clipped squared error between predicted values and returns."""

from __future__ import annotations

import torch

from easyr1.algorithms.aggregation import masked_mean


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped value loss (PPO2 style).

    ``clipped = old_values + clip(values - old_values, -cliprange_value, cliprange_value)`` and the loss is
    ``0.5 * max((values - returns)^2, (clipped - returns)^2)``: the critic cannot move further than
    ``cliprange_value`` from the values it had at rollout time to lower the loss.

    Args:
        values: (B, T) current predictions (requires grad).
        old_values: (B, T) predictions of the critic that scored the rollout.
        returns: (B, T) regression targets (GAE advantages + old values).
        response_mask: (B, T) valid response tokens.
        cliprange_value: half-width of the trust region around ``old_values``.

    Returns:
        (loss_mat (B, T), metrics): aggregate ``loss_mat`` with :func:`aggregate_loss`; metrics are means over the
        valid tokens: ``vf_clipfrac`` (the clipped term was the larger one) and ``vpred_mean``.
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    loss_mat = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean((clipped_loss > unclipped_loss).float(), response_mask).item(),
            "vpred_mean": masked_mean(values.detach(), response_mask).item(),
        }
    return loss_mat, metrics
