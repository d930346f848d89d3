"""Weight versions of samples: how old a sample is when a step trains on it.

Version ``v`` is the policy after ``v`` optimizer steps; step ``k`` trains from version ``k - 1``. An asynchronous
schedule stamps every sample with the versions of its first and last response tokens (``version_first``,
``version_last``: (B,) int64 tensors in the batch); a response continued across updates has tokens of several
versions. A sample's staleness at step ``k`` is ``k - 1 - version_first`` (AReaL's head staleness): 0 for a sample
of the synchronous loop, 1 for every sample of ``one_step_off``.
"""

from __future__ import annotations

import torch


def trained_version(step: int) -> int:
    """The weight version step ``step`` (1-based) trains from: the weights after ``step - 1`` updates."""
    return step - 1


def staleness(version_first: torch.Tensor, step: int) -> torch.Tensor:
    """(B,) how many versions each sample's first token is behind the weights step ``step`` trains from."""
    return trained_version(step) - version_first


def version_metrics(version_first: torch.Tensor, version_last: torch.Tensor, step: int) -> dict[str, float]:
    """``async/`` metrics of a step's samples (one row per sample):

    - ``staleness/mean``, ``staleness/max``, and ``staleness/<s>``: the fraction of samples ``s`` versions old;
    - ``span/mean``, ``span/max``: the versions a response's tokens came from (1: one version; 2: continued once
      under newer weights);
    - ``partial_ratio``: the fraction of responses continued across at least one update.
    """
    ages = staleness(version_first, step)
    spans = version_last - version_first + 1
    metrics = {
        "async/staleness/mean": ages.double().mean().item(),
        "async/staleness/max": float(ages.max().item()),
        "async/span/mean": spans.double().mean().item(),
        "async/span/max": float(spans.max().item()),
        "async/partial_ratio": (spans > 1).double().mean().item(),
    }
    for age in range(int(ages.max().item()) + 1):
        metrics[f"async/staleness/{age}"] = (ages == age).double().mean().item()
    return metrics
