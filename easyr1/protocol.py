"""The batch that flows between the driver and the workers.

A :class:`Batch` holds per-sample tensors (all with the same leading dimension), per-sample python
objects (numpy object arrays: images, ground truths, raw prompt ids, ...) and batch-wide ``meta``
(temperature, step, ...). It knows how to split, concatenate, repeat and merge itself, which is all
the dispatch layer needs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


# What the actor's (and critic's) forward reads from a batch; the rest (images for vLLM, strings) stays on the driver.
# `sample_id` keys the rows in the workers' per-step cache (distributed/sample_cache.py).
ACTOR_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "multi_modal_inputs",
    "sample_id",
)


def merge_vision_inputs(rows: Any) -> dict[str, torch.Tensor]:
    """Concatenate the per-sample processor outputs (``pixel_values``, ``image_grid_thw``, ...) of a micro-batch."""
    merged: dict[str, list[torch.Tensor]] = defaultdict(list)
    for row in rows:
        for key, value in (row or {}).items():
            merged[key].append(value)
    return {key: torch.cat(values, dim=0) for key, values in merged.items()}


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """Build a 1-d object array without numpy trying to broadcast nested lists."""
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


@dataclass
class Batch:
    """Per-sample tensors and python objects with a shared leading (sample) dimension."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {
            key: value if isinstance(value, np.ndarray) and value.dtype == object else _object_array(value)
            for key, value in self.non_tensors.items()
        }
        sizes = {key: len(value) for key, value in {**self.tensors, **self.non_tensors}.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the number of samples: {sizes}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return len(value)
        for value in self.non_tensors.values():
            return len(value)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no field {key!r}; it has {sorted([*self.tensors, *self.non_tensors])}")

    def __setitem__(self, key: str, value: Any) -> None:
        if len(value) != len(self) and (self.tensors or self.non_tensors):
            raise ValueError(f"field {key!r} has {len(value)} samples, the batch has {len(self)}")
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.non_tensors[key] = value if isinstance(value, np.ndarray) else _object_array(value)

    def index(self, indices: Sequence[int] | torch.Tensor | np.ndarray | slice) -> Batch:
        """Select samples by position (list of ints, index tensor or slice)."""
        if isinstance(indices, slice):
            tensor_index = numpy_index = indices
        else:
            numpy_index = np.asarray(indices, dtype=np.int64)
            tensor_index = torch.as_tensor(numpy_index, dtype=torch.long)
        return Batch(
            tensors={key: value[tensor_index] for key, value in self.tensors.items()},
            non_tensors={key: value[numpy_index] for key, value in self.non_tensors.items()},
            meta=dict(self.meta),
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of ``size`` samples (the last may be smaller)."""
        return [self.index(slice(start, start + size)) for start in range(0, len(self), size)]

    def chunk(self, parts: int) -> list[Batch]:
        """``parts`` equal consecutive chunks; the length must divide evenly."""
        if len(self) % parts != 0:
            raise ValueError(f"cannot split a batch of {len(self)} samples into {parts} equal parts")
        return self.split(len(self) // parts)

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        """Concatenate batches with the same fields; ``meta`` is taken from the first."""
        batches = list(batches)
        if not batches:
            raise ValueError("cannot concatenate an empty list of batches")
        first = batches[0]
        return Batch(
            tensors={key: torch.cat([b.tensors[key] for b in batches]) for key in first.tensors},
            non_tensors={key: np.concatenate([b.non_tensors[key] for b in batches]) for key in first.non_tensors},
            meta=dict(first.meta),
        )

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Repeat every sample ``times`` times: ``aabb`` when interleaved, ``abab`` otherwise."""
        if interleave:
            tensor_index = torch.arange(len(self)).repeat_interleave(times)
        else:
            tensor_index = torch.arange(len(self)).repeat(times)
        return self.index(tensor_index)

    def union(self, other: Batch) -> Batch:
        """Fields of both batches in one (``other`` wins on equal keys); lengths must agree."""
        if len(self) != len(other) and len(self) and len(other):
            raise ValueError(f"cannot merge batches of {len(self)} and {len(other)} samples")
        return Batch(
            tensors={**self.tensors, **other.tensors},
            non_tensors={**self.non_tensors, **other.non_tensors},
            meta={**self.meta, **other.meta},
        )

    def select(self, *keys: str) -> Batch:
        """A batch holding only the named fields (tensor or non-tensor)."""
        return Batch(
            tensors={key: value for key, value in self.tensors.items() if key in keys},
            non_tensors={key: value for key, value in self.non_tensors.items() if key in keys},
            meta=dict(self.meta),
        )

    def pop(self, *keys: str) -> Batch:
        """Remove the named fields and return them as a batch."""
        popped = self.select(*keys)
        for key in keys:
            self.tensors.pop(key, None)
            self.non_tensors.pop(key, None)
        return popped
