"""Ulysses sequence parallelism against one process: log-probs, entropies and gradients of one micro-batch.

:func:`compare` scores a batch as one micro-batch with the plain model in this process, then with N gloo ranks forked
from it (N = 2 and 4) that split the packed row (``distributed/sequence_parallel.py``), padding-free and with shared
prompts; each rank computes the same loss from the combined values (plus the router's load-balancing loss for a
mixture of experts), and the ranks' summed gradients are compared with the single process's. fp32 throughout. The
model-family harness runs it as its ``ulysses`` cell on each family's mixed rows
(``make check-families``, ``tools/check_families.py``).
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyr1.distributed.local_group import loopback_port
from easyr1.protocol import Batch


SIZES = (2, 4)
LAYOUTS = ("padding_free", "share_prompt")


@dataclass
class Outputs:
    """What one layout's forward and backward give: (B, R) log-probs and entropies, and every parameter's gradient."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    gradients: dict[str, torch.Tensor]


def _loss_weights(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def run_layout(model: torch.nn.Module, batch: Batch, banned: list[int], layout: str) -> Outputs:
    """One forward of the whole batch as one micro-batch in ``layout``, and the gradients of a fixed random mix of its
    log-probs and entropies."""
    from easyr1.distributed import sequence_parallel
    from easyr1.models.moe import load_balancing_loss, moe_settings, recorded_router_logits, router_recorder
    from easyr1.workers.actor import computed_tokens, response_log_probs, shares_prompts

    model.zero_grad(set_to_none=True)
    routed = router_recorder(model) is not None
    with recorded_router_logits(model) if routed else nullcontext() as router_logits:
        log_probs, entropy = response_log_probs(
            model,
            batch,
            1.0,
            with_entropy=True,
            banned_token_ids=banned,
            padding_free=layout == "padding_free",
            share_prompt=layout == "share_prompt",
        )
    mask = batch["response_mask"].float()
    first, second = _loss_weights(tuple(mask.shape))
    loss = (log_probs * first * mask).sum() + (entropy * second * mask).sum()
    if routed:  # a mixture of experts: the router's load-balancing loss too, over the whole row
        group = sequence_parallel.of(model)
        if group is None:
            loss = loss + load_balancing_loss(router_logits, *moe_settings(model))
        else:
            tokens = computed_tokens(batch, shares_prompts(model, layout == "share_prompt"))
            token_mask = sequence_parallel.local_token_mask(group, tokens, log_probs.device)
            loss = loss + load_balancing_loss(
                router_logits,
                *moe_settings(model),
                token_mask,
                lambda value: sequence_parallel.group_sum(value, group),
            )
    loss.backward()
    gradients = {
        name: param.grad.detach().clone() for name, param in model.named_parameters() if param.grad is not None
    }
    return Outputs(log_probs.detach() * mask, entropy.detach() * mask, gradients)


def _rank(
    rank: int, world_size: int, port: int, model_dir: str, batch: Batch, banned: list[int], out_dir: str
) -> None:
    from easyr1.distributed import sequence_parallel
    from easyr1.models.loading import load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        model = load_model(model_dir, torch.float32)
        group = sequence_parallel.SequenceParallelGroup(world_size)
        sequence_parallel.install(model, group)
        results = {}
        for layout in LAYOUTS:
            outputs = run_layout(model, batch, banned, layout)
            for gradient in outputs.gradients.values():  # the whole gradient: the sum of every slice's part
                dist.all_reduce(gradient, group=group.process_group)
            results[layout] = outputs
        torch.save(results, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def split_outputs(model_dir: Path, batch: Batch, banned: list[int], size: int) -> list[dict[str, Outputs]]:
    """Every rank's outputs with ``size`` ranks forked from this process (which must not be in a process group);
    the forked ranks find ``batch`` in the memory they share with it."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _rank,
            args=(size, loopback_port(), str(model_dir), batch, banned, out_dir),
            nprocs=size,
            start_method="fork",
        )
        return [torch.load(Path(out_dir) / f"{rank}.pt", weights_only=False) for rank in range(size)]


def largest_gaps(reference: Outputs, split: Outputs) -> dict[str, float]:
    """Largest |Δ| of log-probs and entropies, and of gradients relative to each gradient's largest value."""
    if split.gradients.keys() != reference.gradients.keys():
        missing = sorted(split.gradients.keys() ^ reference.gradients.keys())
        raise AssertionError(f"other parameters got gradients: {missing[:4]}")
    return {
        "log_probs": float((split.log_probs - reference.log_probs).abs().max()),
        "entropy": float((split.entropy - reference.entropy).abs().max()),
        "gradients": max(
            float((split.gradients[name] - grad).abs().max()) / max(1.0, float(grad.abs().max()))
            for name, grad in reference.gradients.items()
        ),
    }


def compare(
    model_dir: Path, batch: Batch, banned: list[int], sizes: tuple[int, ...] = SIZES
) -> dict[tuple[int, str], float]:
    """The largest gap (log-prob, entropy or relative gradient) per (N, layout) over every rank, for ``model_dir``'s
    model (fp32) scoring ``batch`` as one micro-batch with ``banned`` placeholder ids."""
    from easyr1.models.loading import load_model

    model = load_model(str(model_dir), torch.float32)
    reference = {layout: run_layout(model, batch, banned, layout) for layout in LAYOUTS}
    gaps = {}
    for size in sizes:
        ranks = split_outputs(model_dir, batch, banned, size)
        for layout in LAYOUTS:
            gaps[(size, layout)] = max(max(largest_gaps(reference[layout], rank[layout]).values()) for rank in ranks)
    return gaps
