"""Advantage estimators: turn rewards into per-token advantages (and returns) for the policy update.

Every estimator is registered by name with :func:`register_adv_estimator` and called through
:func:`compute_advantages`, which passes each estimator only the keyword arguments its signature names, so the
trainer can hand over everything it has (rewards, mask, group index, values, gamma, ...) without knowing which
estimator needs what. Shapes: ``B`` samples, ``T`` response tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from easyr1.algorithms.registry import Registry


AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "algorithm.adv_estimator")


def register_adv_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering an estimator ``fn(**inputs) -> (advantages (B, T), returns (B, T))`` as ``name``."""
    return ADV_ESTIMATORS.register(name)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """Return the estimator registered as ``name`` (ConfigError listing the valid names otherwise)."""
    return ADV_ESTIMATORS.get(name)


def compute_advantages(name: str, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator ``name`` on the subset of ``inputs`` that its signature accepts.

    Returns:
        (advantages (B, T), returns (B, T)), zero outside the response mask.
    """
    estimator = get_adv_estimator(name)
    parameters = inspect.signature(estimator).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return estimator(**inputs)
    missing = [
        p.name
        for p in parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and p.name not in inputs
    ]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs {missing}, which the caller did not provide")
    return estimator(**{key: value for key, value in inputs.items() if key in parameters})


def group_ids_from_index(index: np.ndarray | Sequence[Any] | torch.Tensor, batch_size: int) -> torch.Tensor:
    """Map arbitrary group labels (uids, ints) to dense ids 0..G-1.

    Args:
        index: (B,) group label of every sample; samples generated from the same prompt share a label.
        batch_size: B, to check the length.

    Returns:
        (B,) long tensor of dense group ids.
    """
    labels = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    if labels.shape != (batch_size,):
        raise ValueError(f"group index has shape {labels.shape}, expected ({batch_size},): one label per sample")
    _, inverse = np.unique(labels, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def sequence_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Sequence score from token rewards: (B, T) -> (B,) sum over tokens; a (B,) input is returned as is."""
    if token_level_rewards.dim() == 1:
        return token_level_rewards
    if token_level_rewards.dim() == 2:
        return token_level_rewards.sum(dim=-1)
    shape = tuple(token_level_rewards.shape)
    raise ValueError(f"rewards must be (B, T) token rewards or (B,) scores, got shape {shape}")


@register_adv_estimator("grpo")
def compute_grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | torch.Tensor,
    eps: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the sequence score normalised within its group of responses to one prompt.

    ``A_i = (s_i - mean_g) / (std_g + eps)`` (or ``s_i - mean_g`` with ``norm_adv_by_std=False``, Dr. GRPO), put on
    every valid token of response ``i``. ``std_g`` is the unbiased (``n - 1``) standard deviation, as
    ``torch.std`` computes it in EasyR1 and verl. A group whose scores are all equal gets advantage 0. A group of
    a single response gets advantage 0 (there is nothing to compare it with; EasyR1 refuses such groups and verl
    uses mean 0 / std 1, i.e. the raw score).

    Args:
        token_level_rewards: (B, T) rewards (summed into the score) or (B,) scores.
        response_mask: (B, T) valid response tokens.
        index: (B,) group label (prompt uid) of every sample.
        eps: added to the std to avoid dividing by zero.
        norm_adv_by_std: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        (advantages (B, T), returns (B, T)); both are the same tensor for GRPO.
    """
    scores = sequence_scores(token_level_rewards)
    batch_size = scores.shape[0]
    if response_mask.dim() != 2 or response_mask.shape[0] != batch_size:
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected ({batch_size}, T)")
    group_ids = group_ids_from_index(index, batch_size).to(scores.device)
    num_groups = int(group_ids.max().item()) + 1 if batch_size else 0

    # Group statistics in float64: rewards are small numbers but groups can be large.
    scores64 = scores.detach().to(torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, group_ids, torch.ones_like(scores64)
    )
    sums = torch.zeros_like(counts).index_add_(0, group_ids, scores64)
    centered = scores64 - (sums / counts)[group_ids]
    squares = torch.zeros_like(counts).index_add_(0, group_ids, centered.square())
    std = (squares / (counts - 1).clamp(min=1)).sqrt()
    advantages = centered / (std[group_ids] + eps) if norm_adv_by_std else centered
    advantages = torch.where(counts[group_ids] > 1, advantages, torch.zeros_like(advantages))

    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    token_advantages = advantages.to(dtype).unsqueeze(-1) * response_mask.to(dtype)
    return token_advantages, token_advantages
