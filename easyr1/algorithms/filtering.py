"""DAPO dynamic sampling: keep only the prompt groups whose responses still carry a learning signal.

A group whose responses all score the same (all right or all wrong) gets zero group-relative advantage and only
dilutes the batch. DAPO (Yu et al. 2025, arXiv:2503.14476) drops such groups and generates more prompts until the
batch is full. The pure part lives here: which samples of a scored batch to keep. The rule is EasyR1's: a group is
kept when the mean of its ``filter_key`` scores lies strictly between ``filter_low`` and ``filter_high``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from easyr1.algorithms.advantage import group_ids_from_index
from easyr1.errors import ConfigError


def filter_groups(
    scores_by_key: Mapping[str, torch.Tensor | Sequence[float] | np.ndarray],
    index: np.ndarray | Sequence[Any] | torch.Tensor,
    filter_key: str = "overall",
    filter_low: float = 0.01,
    filter_high: float = 0.99,
) -> torch.Tensor:
    """Indices of the samples whose group's mean ``filter_key`` score is in ``(filter_low, filter_high)``.

    Groups are kept or dropped whole; kept indices are returned in batch order. With 0/1 accuracy scores and the
    defaults (0.01, 0.99), exactly the groups that are neither all wrong nor all right are kept. A group whose
    mean is nan is dropped.

    Args:
        scores_by_key: score name -> (B,) per-sample scores, as the reward function returns them (``overall`` and
            any sub-scores).
        index: (B,) group label (prompt uid) of every sample.
        filter_key: the score the rule looks at (``algorithm.filter_key``).
        filter_low: exclusive lower bound of the group mean (``algorithm.filter_low``).
        filter_high: exclusive upper bound of the group mean (``algorithm.filter_high``).

    Returns:
        (K,) long tensor of kept sample indices, ascending (empty when no group qualifies).
    """
    if filter_key not in scores_by_key:
        available = ", ".join(sorted(scores_by_key)) or "none"
        raise ConfigError(
            f"algorithm.filter_key={filter_key!r} is not a score the reward function returns; available: {available}"
        )
    values = scores_by_key[filter_key]
    if isinstance(values, torch.Tensor):
        scores = values.detach().cpu().to(torch.float64).reshape(-1)
    else:
        scores = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(-1)
    group_ids = group_ids_from_index(index, scores.shape[0])
    num_groups = int(group_ids.max().item()) + 1 if len(group_ids) else 0
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, scores)
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, torch.ones_like(scores))
    means = sums / counts
    kept_groups = (means > filter_low) & (means < filter_high)
    return torch.nonzero(kept_groups[group_ids], as_tuple=False).reshape(-1)
