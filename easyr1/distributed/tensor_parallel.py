"""The rollout engine's tensor-parallel groups, and the prompt exchange inside them.

vLLM's ``external_launcher`` runs one engine per rank and builds its tensor-parallel (TP) groups out of
consecutive ranks of the torch world: with TP size ``t`` the groups are ``[0..t-1], [t..2t-1], ...``
(``vllm.distributed.parallel_state.initialize_model_parallel``, layout ExternalDP x DP x PP x PCP x TP with
DP = PP = PCP = 1). Every member of a group must submit the same requests, since they compute one model
together. The driver, however, gives each rank its own chunk of the batch. So before generating, the members
gather their chunks, all generate the concatenation, and each keeps the rows of its own chunk.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from easyr1.protocol import Batch


def tensor_parallel_groups(world_size: int, tensor_parallel_size: int) -> list[list[int]]:
    """The ranks of every TP group, numbered as vLLM numbers them: consecutive blocks of the world."""
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} must be at least 1 and divide the world size {world_size}"
        )
    return [list(range(start, start + tensor_parallel_size)) for start in range(0, world_size, tensor_parallel_size)]


class TensorParallelGroup:
    """This rank's TP group. Constructing it is collective: every rank of the world must construct one,
    in the same order relative to other group creations, because ``dist.new_group`` is."""

    def __init__(self, tensor_parallel_size: int) -> None:
        world_size, rank = dist.get_world_size(), dist.get_rank()
        groups = tensor_parallel_groups(world_size, tensor_parallel_size)
        self.ranks = groups[rank // tensor_parallel_size]
        self.index = self.ranks.index(rank)
        self.process_group: Any = None
        if tensor_parallel_size > 1:
            # gloo: the exchanged prompts are pickled Python objects on the host, whatever the device
            self.process_group, _ = dist.new_subgroups_by_enumeration(groups, backend="gloo")

    @property
    def size(self) -> int:
        """How many ranks share one engine."""
        return len(self.ranks)

    def gather_rows(self, rows: Batch) -> tuple[Batch, list[int]]:
        """All members' rows in rank order, and the positions of this rank's own rows among them.

        Collective over the group. Members may hold different numbers of rows. The positions are a list, not
        a slice, so that ``batch.index(positions)`` copies: a sliced view would pickle the whole pooled storage.
        """
        return pool_rows(rows, self.process_group, self.index, self.size)


def pool_rows(rows: Batch, process_group: Any, index: int, size: int) -> tuple[Batch, list[int]]:
    """The rows of every member of a group of ``size`` ranks in rank order, and the positions of this member's
    (``index``) own rows among them; collective over ``process_group`` (gloo: the rows travel pickled). Members may
    hold different numbers of rows. The positions are a list, not a slice, so that ``batch.index(positions)`` copies:
    a sliced view would pickle the whole pooled storage."""
    if size == 1:
        return rows, list(range(len(rows)))
    parts: list[Batch | None] = [None] * size
    dist.all_gather_object(parts, rows, group=process_group)
    start = sum(len(part) for part in parts[:index])
    return Batch.concat(parts), list(range(start, start + len(rows)))
