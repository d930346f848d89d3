"""A resumable stream of prompt batches: the sample order is a function of (seed, epoch) alone.

The trainer records how many batches it has taken in the current epoch; a resumed run rebuilds the same
epoch order and skips what was taken, so no sample is seen twice in an epoch and the batches after the
resume point are the ones the uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class EpochSampler(Sampler[int]):
    """Indices of one epoch (shuffled by ``seed + epoch``, or in order), from position ``start`` on."""

    def __init__(self, size: int, shuffle: bool, seed: int) -> None:
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.epoch, self.start = 0, 0

    def order(self, epoch: int) -> list[int]:
        """The full index order of ``epoch``."""
        if not self.shuffle:
            return list(range(self.size))
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch)[self.start :])

    def __len__(self) -> int:
        return self.size - self.start


class PromptStream:
    """Batches of prompts, epoch after epoch, with a position that can be saved and restored."""

    def __init__(
        self, dataset: Dataset, batch_size: int, shuffle: bool, seed: int, collate_fn: Any, num_workers: int = 0
    ) -> None:
        self.batch_size = batch_size
        self.sampler = EpochSampler(len(dataset), shuffle, seed)
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=True,
            collate_fn=collate_fn,
            num_workers=num_workers,
        )
        self.steps_per_epoch = len(dataset) // batch_size
        self.epoch, self.batches_taken = 0, 0
        self._iterator: Iterator | None = None

    def next(self) -> Any:
        """The next batch (a new epoch starts when the current one is used up)."""
        if self.steps_per_epoch == 0:
            raise ValueError("the dataset holds fewer rows than one batch")
        if self.batches_taken >= self.steps_per_epoch:
            self.epoch, self.batches_taken, self._iterator = self.epoch + 1, 0, None
        if self._iterator is None:
            self.sampler.epoch, self.sampler.start = self.epoch, self.batches_taken * self.batch_size
            self._iterator = iter(self.loader)
        batch = next(self._iterator)
        self.batches_taken += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        """The position: epoch and batches taken in it."""
        return {"epoch": self.epoch, "batches_taken": self.batches_taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position saved by :meth:`state_dict`."""
        self.epoch, self.batches_taken, self._iterator = int(state["epoch"]), int(state["batches_taken"]), None
