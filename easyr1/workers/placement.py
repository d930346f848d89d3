"""Where a worker's tensors live: micro-batches go to the worker's device, results come back to the host.

Batches travel between the driver and the workers on the CPU (Ray serialises them). A worker moves one micro-batch
at a time to its device just before the forward, so the device holds one micro-batch of inputs rather than the
whole share, and hands its results back as CPU tensors so the driver never receives device memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from easyr1.protocol import Batch


# Per-sample python objects that hold tensors the model consumes: the processor outputs of each row
# (``pixel_values``, ``image_grid_thw``, ...). Other object columns (images, strings, id lists) stay on the host.
TENSOR_ROW_KEYS = ("multi_modal_inputs",)


def _row_to(row: Any, device: torch.device) -> Any:
    if not row:
        return row
    return {key: _tensor_to(value, device) for key, value in row.items()}


def _tensor_to(value: Any, device: torch.device) -> Any:
    # non_blocking: a host-to-device copy from pageable memory is ordered on the stream like a blocking one
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def batch_to(batch: Batch, device: torch.device | str) -> Batch:
    """A copy of ``batch`` whose tensors, and the tensors inside each row's vision inputs, are on ``device``.

    Object columns other than :data:`TENSOR_ROW_KEYS` and ``meta`` are shared, not copied. Tensors already on
    ``device`` are not copied either (``Tensor.to`` returns them as they are).
    """
    device = torch.device(device)
    tensors = {key: _tensor_to(value, device) for key, value in batch.tensors.items()}
    non_tensors: dict[str, np.ndarray] = {}
    for key, column in batch.non_tensors.items():
        if key in TENSOR_ROW_KEYS:
            moved = np.empty(len(column), dtype=object)
            for index, row in enumerate(column):
                moved[index] = _row_to(row, device)
            column = moved
        non_tensors[key] = column
    return Batch(tensors=tensors, non_tensors=non_tensors, meta=batch.meta)


def to_host(value: torch.Tensor) -> torch.Tensor:
    """``value`` on the CPU, detached (results handed back to the driver)."""
    return value.detach().to("cpu")
