"""Batch dataset items into a :class:`~easyr1.protocol.Batch`: tensors are stacked, everything else kept per sample."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from easyr1.protocol import Batch


def collate_fn(rows: Sequence[dict[str, Any]]) -> Batch:
    """Stack the tensor fields of ``rows`` (they must share shapes) and keep the others as per-sample objects.

    With :class:`~easyr1.data.dataset.RLDataset` items this gives tensors ``input_ids`` / ``attention_mask``
    (B, P) and ``position_ids`` (B, 4, P) or (B, P), and non-tensors ``raw_prompt_ids``, ``multi_modal_data``,
    ``multi_modal_inputs`` and ``ground_truth``.
    """
    if not rows:
        raise ValueError("cannot collate an empty list of rows")
    keys = list(rows[0])
    for position, row in enumerate(rows):
        if list(row) != keys:
            raise ValueError(f"row {position} has fields {sorted(row)}, row 0 has {sorted(keys)}")
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, list[Any]] = {}
    for key in keys:
        values = [row[key] for row in rows]
        if all(isinstance(value, torch.Tensor) for value in values):
            shapes = {tuple(value.shape) for value in values}
            if len(shapes) > 1:
                raise ValueError(f"cannot stack field {key!r}: the rows have shapes {sorted(shapes)}")
            tensors[key] = torch.stack(values)
        else:
            non_tensors[key] = values
    return Batch(tensors=tensors, non_tensors=non_tensors)
