"""Reducing a per-token loss matrix to the scalar that is back-propagated, normalised over the global batch.

The actor updates on a mini-batch that is spread over ``world_size`` data-parallel workers, each of which splits
its share into micro-batches and accumulates gradients. The loss of a micro-batch must therefore be normalised by
counts over the *whole* mini-batch, not by its own counts, or the result depends on how the batch was cut.

Convention (used by every mode):

* the caller counts, once per mini-batch, the valid tokens (``num_global_tokens``) and the sequences with at least
  one valid token (``num_global_seqs``) summed over **all** workers (see :func:`count_normalizers`, then an
  all-reduce SUM), and passes the same numbers with every micro-batch, together with ``world_size``;
* each worker **sums** the returned micro-batch losses (``loss.backward()`` per micro-batch, no division by the
  number of micro-batches);
* data-parallel gradient reduction (FSDP) **averages** over the ``world_size`` workers, which the factor
  ``world_size`` inside :func:`aggregate_loss` cancels.

Then the applied gradient equals the gradient of the mode's loss over the whole mini-batch computed in one piece,
for any split into workers and micro-batches. Leaving both counts ``None`` normalises by the micro-batch's own
counts (correct for a single micro-batch on a single worker, and for metrics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from easyr1.algorithms.registry import Registry
from easyr1.errors import ConfigError


@dataclass(frozen=True)
class AggregationInputs:
    """What a loss aggregation mode reduces: the masked (B, T) loss and the counts it normalises by.

    Attributes:
        masked: the per-token loss with masked-out positions set to 0.
        weights: the response mask as 0/1 in the loss's dtype.
        num_tokens: valid tokens of the whole mini-batch (or of this micro-batch when no global count is given).
        num_seqs: sequences with a valid token, counted the same way.
        world_size: number of data-parallel workers whose gradients are averaged.
        loss_scale_factor: the constant length normaliser of ``seq-mean-token-sum-norm`` (None: the padded length).
    """

    masked: torch.Tensor
    weights: torch.Tensor
    num_tokens: float
    num_seqs: float
    world_size: int
    loss_scale_factor: float | None


LossAggregation = Callable[[AggregationInputs], torch.Tensor]

LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation mode", "worker.actor.loss_agg_mode")


def register_loss_aggregation(name: str) -> Callable[[LossAggregation], LossAggregation]:
    """Decorator registering a loss aggregation mode ``fn(AggregationInputs) -> scalar`` under ``name``."""
    return LOSS_AGGREGATIONS.register(name)


@register_loss_aggregation("token-mean")
def _token_mean(inputs: AggregationInputs) -> torch.Tensor:
    """Every token in the mini-batch weighs the same."""
    return inputs.masked.sum() * inputs.world_size / max(inputs.num_tokens, 1.0)


@register_loss_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(inputs: AggregationInputs) -> torch.Tensor:
    """Every sequence weighs the same; tokens are averaged within a sequence."""
    seq_losses = inputs.masked.sum(dim=-1) / inputs.weights.sum(dim=-1).clamp(min=1)
    return seq_losses.sum() * inputs.world_size / max(inputs.num_seqs, 1.0)


@register_loss_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(inputs: AggregationInputs) -> torch.Tensor:
    """Every sequence weighs the same; tokens are summed within a sequence."""
    return inputs.masked.sum(dim=-1).sum() * inputs.world_size / max(inputs.num_seqs, 1.0)


@register_loss_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(inputs: AggregationInputs) -> torch.Tensor:
    """Token sums divided by a constant length, so long responses are not down-weighted (Dr. GRPO)."""
    masked = inputs.masked
    scale = float(masked.shape[-1]) if inputs.loss_scale_factor is None else float(inputs.loss_scale_factor)
    if scale <= 0:
        raise ConfigError(f"loss_scale_factor must be positive for seq-mean-token-sum-norm, got {scale}")
    return masked.sum(dim=-1).sum() * inputs.world_size / (max(inputs.num_seqs, 1.0) * scale)


# The registered modes, for parametrised tests and help texts; the registry stays the one list.
LOSS_AGG_MODES: tuple[str, ...] = tuple(LOSS_AGGREGATIONS.names())


def count_normalizers(mask: torch.Tensor) -> tuple[float, float]:
    """Count the valid tokens and the sequences with at least one valid token in a (B, T) mask.

    Returns:
        (num_tokens, num_seqs) as python floats, to be summed over micro-batches and workers by the caller.
    """
    mask = mask.bool()
    return float(mask.sum().item()), float(mask.any(dim=-1).sum().item())


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is true (0 where nothing is valid).

    Args:
        values: (B, T) or any shape.
        mask: same shape as ``values``, bool or 0/1.
        dim: reduce this dimension only; ``None`` reduces everything to a scalar.
    """
    valid = mask.bool()
    # Select rather than multiply so that inf/nan in masked-out positions cannot leak into the mean.
    selected = torch.where(valid, values, torch.zeros_like(values))
    total = selected.sum() if dim is None else selected.sum(dim=dim)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    return total / count.clamp(min=1).to(values.dtype)


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_global_tokens: float | None = None,
    num_global_seqs: float | None = None,
    world_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into this micro-batch's share of the global loss.

    With ``N`` = ``num_global_tokens``, ``S`` = ``num_global_seqs``, ``W`` = ``world_size`` and the sums running
    over the rows ``i`` and valid tokens ``t`` of this micro-batch:

    * ``token-mean``: ``W * sum_it loss_it / N`` — every token in the mini-batch weighs the same (DAPO; EasyR1's
      ``token``).
    * ``seq-mean-token-mean``: ``W * sum_i (mean_t loss_it) / S`` — every sequence weighs the same (GRPO paper;
      EasyR1's ``seq``).
    * ``seq-mean-token-sum``: ``W * sum_i (sum_t loss_it) / S``.
    * ``seq-mean-token-sum-norm``: ``W * sum_i (sum_t loss_it) / (S * loss_scale_factor)`` — Dr. GRPO: a
      constant length normaliser (the maximum response length), so long responses are not down-weighted.
      ``loss_scale_factor`` defaults to ``T`` (the padded length), which is constant only if the caller pads to
      the configured maximum; pass it explicitly. (verl's variant of this mode divides by the constant only,
      without the sequence mean, so its scale grows with the batch size.)

    Rows with no valid token contribute 0 and are not counted as sequences. See the module docstring for how the
    caller combines micro-batches and workers; with ``num_global_*`` left ``None`` the counts of ``mask`` itself
    are used.

    Args:
        loss_mat: (B, T) per-token loss.
        mask: (B, T) response mask, bool or 0/1.
        mode: a name registered in :data:`LOSS_AGGREGATIONS`.
        num_global_tokens: valid tokens in the whole mini-batch, summed over all workers.
        num_global_seqs: sequences with a valid token in the whole mini-batch, summed over all workers.
        world_size: number of data-parallel workers whose gradients are averaged.
        loss_scale_factor: the constant length normaliser of ``seq-mean-token-sum-norm``.

    Returns:
        A scalar tensor (0 if nothing is valid).
    """
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    if mode not in LOSS_AGGREGATIONS:
        raise ConfigError(
            f"Unknown loss aggregation mode {mode!r}. Valid modes: {', '.join(LOSS_AGGREGATIONS.names())}."
        )
    # Masked-out entries may hold inf/nan (e.g. exp of a huge log-ratio); select instead of multiplying.
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    local_tokens, local_seqs = count_normalizers(mask)
    inputs = AggregationInputs(
        masked=masked,
        weights=mask.to(loss_mat.dtype),
        num_tokens=local_tokens if num_global_tokens is None else num_global_tokens,
        num_seqs=local_seqs if num_global_seqs is None else num_global_seqs,
        world_size=world_size,
        loss_scale_factor=loss_scale_factor,
    )
    return LOSS_AGGREGATIONS.get(mode)(inputs)
