"""Advantages for episodes whose turns are separate rows (``env.context=latest``): one advantage per episode.

When each turn of an episode is its own training sequence, the episode is still the sample an estimator compares
with the other episodes of its seed. :func:`episode_advantages` sums each episode's rewards over all its rows,
runs an estimator that gives one advantage per sample (``EstimatorNeeds.one_per_sample``: GRPO, RLOO, ...) on those
per-episode totals, and puts the episode's advantage on every model token of every one of its rows. The policy
gradient is then exactly the one of the same episodes trained as single sequences; only the context each turn was
conditioned on differs.
"""

from __future__ import annotations

from typing import Any

import torch

from easyr1.algorithms.advantage import compute_advantages, estimator_needs


def episode_advantages(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    episode_index: torch.Tensor,
    index: Any,
    **inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator ``name`` on whole episodes, each episode's advantage put on all its rows' model tokens.

    Args:
        name: a registered estimator with ``one_per_sample`` (ValueError otherwise).
        token_level_rewards: (R, T) rewards of every row (turn rewards, KL-in-reward if any).
        response_mask: (R, T) model tokens of every row (a padding row has none).
        episode_index: (R,) the episode of each row, 0..E-1, every episode with at least one row.
        index: (R,) group label (seed uid) of every row; all rows of an episode share it.
        inputs: further estimator inputs (``norm_adv_by_std``, ...), passed through.

    Returns:
        (advantages (R, T), returns (R, T)), zero outside the response mask.
    """
    if not estimator_needs(name).one_per_sample:
        raise ValueError(f"advantage estimator {name!r} gives one advantage per token, not one per episode")
    episodes = int(episode_index.max()) + 1
    row_totals = (token_level_rewards.to(torch.float64) * response_mask).sum(dim=-1)
    totals = torch.zeros(episodes, dtype=torch.float64).index_add_(0, episode_index, row_totals)
    groups: list[Any] = [None] * episodes
    for row, episode in enumerate(episode_index.tolist()):
        groups[episode] = index[row]
    ones = torch.ones((episodes, 1), dtype=response_mask.dtype)
    advantages, returns = compute_advantages(
        name,
        token_level_rewards=totals.unsqueeze(-1).to(token_level_rewards.dtype),
        response_mask=ones,
        index=groups,
        **inputs,
    )
    mask = response_mask.to(advantages.dtype)
    return advantages[episode_index] * mask, returns[episode_index] * mask
