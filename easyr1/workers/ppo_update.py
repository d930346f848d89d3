"""The PPO update loop the actor and the critic share.

``ppo_epochs`` passes over a worker's share of the batch, each in consecutive mini-batches (one clipped optimizer
step each), each mini-batch in micro-batches whose gradients accumulate. Losses are normalised by counts over the
*global* mini-batch (:func:`global_normalizers`), so the update does not depend on the micro-batch size or the number
of workers. The model-specific part, a micro-batch's loss and metrics, is the caller's :data:`MicroLoss`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from easyr1.algorithms import count_normalizers
from easyr1.distributed.fsdp import full_tensor
from easyr1.protocol import Batch
from easyr1.workers.placement import batch_to


# A mini-batch's micro-batches, each with the row indices (in the mini-batch) it holds.
MicroBatches = Callable[[Batch], Sequence[tuple[list[int], Batch]]]
# (rows, micro-batch on the device, the mini-batch's normalisers, the mini-batch's metric sums) -> the loss to
# back-propagate; it adds the micro-batch's share of every metric to the sums.
MicroLoss = Callable[[list[int], Batch, dict[str, float], dict[str, float]], torch.Tensor]


def global_normalizers(mask: torch.Tensor, world_size: int, sequence_parallel_size: int = 1) -> dict[str, float]:
    """The loss normalisers of a mini-batch: valid tokens and sequences summed over every worker's share.

    Passed to :func:`~easyr1.algorithms.aggregate_loss` with every micro-batch, they make the accumulated gradient
    independent of the micro-batch size and of the number of workers. Under sequence parallelism the members of a
    group hold the same pooled rows: the world's sum counts them ``sequence_parallel_size`` times (divided out, exact
    on counts), and the losses are shares of ``world_size / sequence_parallel_size`` data-parallel groups.
    """
    counts = torch.tensor(count_normalizers(mask), dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(counts)
    counts /= sequence_parallel_size
    return {
        "num_global_tokens": counts[0].item(),
        "num_global_seqs": counts[1].item(),
        "world_size": world_size // sequence_parallel_size,
        "loss_scale_factor": float(mask.shape[-1]),
    }


def clipped_optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip the global gradient norm, step unless it is not finite, clear the gradients; returns the norm."""
    grad_norm = full_tensor(nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)).item()
    if torch.isfinite(torch.tensor(grad_norm)):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def consecutive_micro_batches(size: int) -> MicroBatches:
    """Micro-batches of ``size`` consecutive rows (the last may be smaller)."""

    def split(batch: Batch) -> list[tuple[list[int], Batch]]:
        step = max(size, 1)
        starts = range(0, len(batch), step)
        return [(list(range(s, min(s + step, len(batch)))), batch.index(slice(s, s + step))) for s in starts]

    return split


class PPOUpdate:
    """One model's update loop: its optimizer, gradient clipping, device and how its mini-batches are cut.

    Args:
        model: the (sharded) model whose gradients the losses produce.
        optimizer: steps once per mini-batch.
        max_grad_norm: the global gradient norm is clipped to it before each step.
        device: each micro-batch is moved here before its loss.
        micro_batches: cuts a mini-batch into micro-batches.
        grad_norm_key: the metric name of the gradient norm (``actor/grad_norm``, ``critic/grad_norm``).
        sequence_parallel_size: ranks that split each sequence (``distributed/sequence_parallel.py``). Each member's
            gradients are its slice's part of its group's, and FSDP averages over the world: the loss is multiplied
            by the group size so that the average over data-parallel groups comes out.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float,
        device: torch.device,
        micro_batches: MicroBatches,
        grad_norm_key: str,
        sequence_parallel_size: int = 1,
    ) -> None:
        self.sequence_parallel_size = sequence_parallel_size
        self.model = model
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.device = device
        self.micro_batches = micro_batches
        self.grad_norm_key = grad_norm_key

    def run(self, batch: Batch, mini_batch_size: int, epochs: int, micro_loss: MicroLoss) -> dict[str, float]:
        """``epochs`` passes over ``batch`` in mini-batches of ``mini_batch_size`` samples, one optimizer step each;
        returns each metric averaged over the mini-batches."""
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.model.train()
        totals: dict[str, list[float]] = defaultdict(list)
        for _ in range(epochs):
            for mini_batch in batch.split(mini_batch_size):
                for key, value in self.step(mini_batch, micro_loss, world_size).items():
                    totals[key].append(value)
        return {key: sum(values) / len(values) for key, values in totals.items()}

    def step(self, mini_batch: Batch, micro_loss: MicroLoss, world_size: int) -> dict[str, float]:
        """Gradient accumulation over the micro-batches of ``mini_batch``, then one clipped optimizer step; returns
        the mini-batch's metrics (the micro-batches' sums and the gradient norm)."""
        norm = global_normalizers(mini_batch["response_mask"], world_size, self.sequence_parallel_size)
        sums: dict[str, float] = defaultdict(float)
        # the loss is a sum over micro-batches normalised by global counts, so their grouping does not matter
        for rows, micro in self.micro_batches(mini_batch):
            loss = micro_loss(rows, batch_to(micro, self.device), norm, sums)
            (loss * self.sequence_parallel_size if self.sequence_parallel_size > 1 else loss).backward()
        sums[self.grad_norm_key] = clipped_optimizer_step(self.model, self.optimizer, self.max_grad_norm)
        return dict(sums)
