"""Each sample's heavy fields reach a worker once per step and are reused there.

Without this, every per-sample call of a step (generate, old log-probs, reference, values, updates) ships its rows'
processed vision tensors (``multi_modal_inputs``) and token tensors through Ray again. With it:

- the driver's :class:`SampleRouter` records, per step, which rank already holds which sample's copy of each heavy
  field (keyed by the row's ``sample_id``, unique within a step), and for each call sends a rank only the rows it
  does not hold yet (rows that balancing moved to another rank are sent there once);
- the worker's :class:`SampleCache` keeps what it received, keyed the same way, and rebuilds the complete batch
  before the method runs, so the methods see exactly the batch they would have seen without the cache. A row whose
  field this rank never received is a :class:`SampleCacheMiss`, never a silently wrong tensor;
- fields the method returns unchanged (the prompt's objects that ``generate`` passes through) are not sent back:
  the driver puts its own copy back in their place.

The cache lives for one step: the driver clears both sides when a step starts and when it ends (the workers only
when its record says it sent them something since the last clear), so validation
(which runs between steps) neither reads nor fills it, and memory does not grow over steps. Byte counts
(:func:`payload_bytes`) are what pickling moves: a host tensor counts the elements it shows (``tensor_pickling``;
a tensor torch pickles itself, its whole storage), an object shared by several rows counts once per message (pickle
memoises it), a PIL image counts width * height * channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from easyr1.distributed.tensor_pickling import is_plain_host_tensor, message_bytes
from easyr1.protocol import Batch


# The key of a row in the cache: unique among the rows of one step (the driver numbers every sample it generates).
SAMPLE_ID = "sample_id"
# Heavy per-row fields a prompt brings to generation (the processed vision tensors; vLLM gets the images instead).
PROMPT_FIELDS = ("multi_modal_inputs",)
# Token tensors of a generated sample, identical in every pass after generation (the prompt-only tensors that
# ``generate`` gets under the same names are different values, so they are cached only once responses exist).
RESPONSE_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
_ABSENT = object()


class SampleCacheMiss(RuntimeError):
    """A worker was asked to reuse a sample's field it never received this step."""


def cached_fields(batch: Batch) -> tuple[str, ...]:
    """The fields of ``batch`` that travel once per step: the vision tensors, plus the token tensors once the batch
    holds responses (a post-generation pass)."""
    names = PROMPT_FIELDS + (RESPONSE_FIELDS if "responses" in batch else ())
    return tuple(name for name in names if name in batch)


def _count(value: Any, seen: set[int]) -> int:
    """Bytes ``value`` puts into one pickled message (see the module docstring), skipping objects in ``seen``."""
    if isinstance(value, torch.Tensor):
        if is_plain_host_tensor(value):  # its own elements (tensor_pickling), once per object (pickle's memo)
            key = id(value)
        else:  # torch's pickling: its whole storage, once per storage
            storage = value.untyped_storage()
            key = storage.data_ptr() or id(storage)
        if key in seen:
            return 0
        seen.add(key)
        return message_bytes(value)
    if value is None:
        return 0
    if isinstance(value, (bool, int, float)):
        return 8
    if isinstance(value, (str, bytes)):
        return len(value)
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.nbytes
    if isinstance(value, Batch):
        return sum(_count(part, seen) for part in (*value.tensors.values(), *value.non_tensors.values()))
    if isinstance(value, dict):
        return sum(_count(item, seen) for item in value.values())
    if isinstance(value, (list, tuple, np.ndarray)):
        return sum(_count(item, seen) for item in value)
    if isinstance(value, SampleDelivery):
        return _count(value.batch, seen) + sum(_count(values, seen) for _, values in value.sent.values())
    size = getattr(value, "size", None)  # a PIL image: width, height and the bands of its mode
    bands = getattr(value, "getbands", None)
    if isinstance(size, tuple) and len(size) == 2 and callable(bands):
        return size[0] * size[1] * len(bands())
    return 0


def payload_bytes(*values: Any) -> int:
    """Estimated bytes of one message holding ``values`` (host tensors by their elements, others by storage,
    shared objects once, images by pixels); metric dicts and other small python values count 8 bytes per number."""
    seen: set[int] = set()
    return sum(_count(value, seen) for value in values)


@dataclass
class SampleDelivery:
    """What one rank gets for one call: the rows' light fields, and each heavy field for the rows it lacks.

    ``sent[name]`` is (positions in the batch, the field's values at those positions). ``order`` keeps the field
    order of the complete batch so the rebuilt batch equals it key for key.
    """

    batch: Batch
    fields: tuple[str, ...]
    sent: dict[str, tuple[list[int], Any]] = field(default_factory=dict)
    order: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))


class SampleRouter:
    """The driver's record of which rank holds which sample's heavy fields during the current step."""

    def __init__(self) -> None:
        self.holders: dict[tuple[int, str], set[int]] = {}

    def reset(self) -> None:
        """Forget every holding (a new step: the workers clear their caches at the same time)."""
        self.holders.clear()

    def deliveries(self, batch: Batch, num_ranks: int) -> list[SampleDelivery]:
        """One delivery per rank for equal consecutive chunks of ``batch``, sending each heavy field of a row only
        to a rank that does not hold it yet, and recording that the rank now does."""
        if len(batch) % num_ranks:
            raise ValueError(f"cannot split a batch of {len(batch)} samples into {num_ranks} equal parts")
        if SAMPLE_ID not in batch:
            raise ValueError(f"the sample cache needs a {SAMPLE_ID!r} field to key the rows; the batch has none")
        fields = cached_fields(batch)
        light = [name for name in (*batch.tensors, *batch.non_tensors) if name not in fields]
        order = (list(batch.tensors), list(batch.non_tensors))
        size = len(batch) // num_ranks
        ids = batch[SAMPLE_ID].tolist()
        deliveries = []
        for rank in range(num_ranks):
            rows = list(range(rank * size, (rank + 1) * size))
            # a list index copies the rows (a sliced view of a tensor torch pickles itself carries its whole storage)
            chunk = batch.select(*light).index(rows)
            sent = {}
            for name in fields:
                missing = [pos for pos, row in enumerate(rows) if rank not in self.holders.get((ids[row], name), ())]
                if missing:
                    values = batch[name]
                    picked = [rows[pos] for pos in missing]
                    sent[name] = (missing, values[torch.tensor(picked)] if torch.is_tensor(values) else values[picked])
                for row in rows:
                    self.holders.setdefault((ids[row], name), set()).add(rank)
            deliveries.append(SampleDelivery(chunk, fields, sent, order))
        return deliveries


class SampleCache:
    """A worker's heavy fields of the current step's samples, keyed by (sample id, field)."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.rows: dict[tuple[int, str], Any] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        """Drop everything (start and end of a step)."""
        self.rows.clear()

    def complete(self, delivery: SampleDelivery, method: str) -> Batch:
        """The full batch of ``delivery``: sent rows are stored, the others filled from the cache."""
        batch = delivery.batch
        ids = batch[SAMPLE_ID].tolist()
        filled: dict[str, Any] = {}
        for name in delivery.fields:
            positions, values = delivery.sent.get(name, ([], []))
            for position, value in zip(positions, values):
                self.rows[(ids[position], name)] = value
            column = []
            for sample_id in ids:
                value = self.rows.get((sample_id, name), _ABSENT)
                if value is _ABSENT:
                    raise SampleCacheMiss(
                        f"rank {self.rank} was asked to reuse field {name!r} of sample {sample_id} in {method}, but "
                        "the driver never sent it this step (the cache was cleared, or the driver's record and this "
                        "worker disagree); set trainer.cache_sample_tensors=false to send every call's tensors"
                    )
                column.append(value)
            filled[name] = torch.stack(column) if torch.is_tensor(column[0]) else column
        tensor_order, object_order = delivery.order
        merged = {**batch.tensors, **batch.non_tensors, **filled}
        return Batch(
            tensors={name: merged[name] for name in tensor_order},
            non_tensors={name: merged[name] for name in object_order},
            meta=batch.meta,
        )


def unchanged_objects(sent: Batch, result: Any) -> list[str]:
    """The object fields that ``result`` (a method's return) passes through unchanged from ``sent``: the same python
    object in every row, in the same order. The driver already has them, so they need not travel back."""
    if not isinstance(result, Batch) or len(result) != len(sent):
        return []
    return [
        name
        for name, values in result.non_tensors.items()
        if name in sent.non_tensors and all(a is b for a, b in zip(values, sent.non_tensors[name]))
    ]


def without(batch: Batch, names: Sequence[str]) -> Batch:
    """``batch`` minus the named fields (a shallow copy)."""
    kept = [name for name in (*batch.tensors, *batch.non_tensors) if name not in names]
    return batch.select(*kept)
