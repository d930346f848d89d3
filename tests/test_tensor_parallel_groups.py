"""TP groups: numbered as vLLM numbers them, and ``gather_rows`` against a single-process reference (4 gloo ranks).

The ranks are forked from the test's process (helpers.fork_ranks).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import fork_ranks

from easyr1.distributed.tensor_parallel import TensorParallelGroup, tensor_parallel_groups
from easyr1.protocol import Batch


def test_groups_are_consecutive_blocks_of_ranks():
    assert tensor_parallel_groups(4, 2) == [[0, 1], [2, 3]]
    assert tensor_parallel_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tensor_parallel_groups(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="divide the world size 4"):
        tensor_parallel_groups(4, 3)


def rank_rows(rank: int) -> Batch:
    """Rank ``rank``'s share: ``rank + 1`` rows (members hold different counts), tensors and Python objects."""
    count = rank + 1
    return Batch(
        tensors={"sample_seed": torch.arange(count) + 10 * rank, "input_ids": torch.full((count, 3), rank)},
        non_tensors={"uid": [f"rank{rank}-row{row}" for row in range(count)]},
    )


def _gather_on_rank(rank: int, world_size: int, port: int, tensor_parallel_size: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    group = TensorParallelGroup(tensor_parallel_size)
    pooled, own = group.gather_rows(rank_rows(rank))
    torch.save({"ranks": group.ranks, "pooled": pooled, "own": pooled.index(own)}, Path(out_dir) / f"{rank}.pt")
    dist.destroy_process_group()


def test_gather_rows_pools_the_group_and_returns_each_rank_its_own(tmp_path):
    world_size, tensor_parallel_size = 4, 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fork_ranks(_gather_on_rank, (world_size, port, tensor_parallel_size, str(tmp_path)), world_size)
    for rank in range(world_size):
        result = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        members = [0, 1] if rank < 2 else [2, 3]
        assert result["ranks"] == members
        # single-process reference: the members' shares concatenated in rank order
        expected = Batch.concat([rank_rows(member) for member in members])
        assert torch.equal(result["pooled"]["sample_seed"], expected["sample_seed"])
        assert torch.equal(result["pooled"]["input_ids"], expected["input_ids"])
        assert list(result["pooled"]["uid"]) == list(expected["uid"])
        mine = rank_rows(rank)
        assert torch.equal(result["own"]["sample_seed"], mine["sample_seed"])
        assert list(result["own"]["uid"]) == list(mine["uid"])
