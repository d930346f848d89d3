"""Ulysses sequence parallelism against one process: log-probs, entropies and gradients of a family's tiny model.

``python -m easyr1.tools.check_sequence_parallel MODEL_DIR DATA_DIR`` (the model-family harness runs it as its
``ulysses`` cell): the mixed rows of the family (text, one image, three images, video where the family reads
videos), each prompt twice with different responses, scored in one micro-batch by the plain model in this process,
then by N gloo ranks forked from it (N = 2 and 4) that split the packed row (``distributed/sequence_parallel.py``),
padding-free and with shared prompts. Each rank computes the same loss from the combined values; the ranks' summed
gradients are compared with the single process's. fp32 throughout.
"""

from __future__ import annotations

import socket
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


SIZES = (2, 4)
LAYOUTS = ("padding_free", "share_prompt")


@dataclass
class Outputs:
    """What one layout's forward and backward give: (B, R) log-probs and entropies, and every parameter's gradient."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    gradients: dict[str, torch.Tensor]


def scored_batch(model_dir: Path, data_dir: Path):
    """The family's mixed rows, each prompt twice with its own random response (so that prompts can be shared)."""
    from easyr1.protocol import Batch
    from easyr1.tools.check_families import Case, random_responses

    case = Case.of(model_dir, data_dir)
    prompts = case.prompts()
    twice = Batch.concat([prompts, prompts]).index(
        [row for pair in zip(range(len(prompts)), range(len(prompts), 2 * len(prompts))) for row in pair]
    )
    return case, random_responses(twice, seed=1, pad_token_id=case.pad_token_id())


def _loss_weights(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def run_layout(model: torch.nn.Module, case, batch, layout: str) -> Outputs:
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
            banned_token_ids=case.banned,
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


def _rank(rank: int, world_size: int, port: int, model_dir: str, data_dir: str, out_dir: str) -> None:
    from easyr1.distributed import sequence_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        case, batch = scored_batch(Path(model_dir), Path(data_dir))
        model = case.model()
        group = sequence_parallel.SequenceParallelGroup(world_size)
        sequence_parallel.install(model, group)
        results = {}
        for layout in LAYOUTS:
            outputs = run_layout(model, case, batch, layout)
            for gradient in outputs.gradients.values():  # the whole gradient: the sum of every slice's part
                dist.all_reduce(gradient, group=group.process_group)
            results[layout] = outputs
        torch.save(results, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def split_outputs(model_dir: Path, data_dir: Path, size: int) -> list[dict[str, Outputs]]:
    """Every rank's outputs with ``size`` ranks forked from this process (which must not be in a process group)."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _rank, args=(size, _free_port(), str(model_dir), str(data_dir), out_dir), nprocs=size, start_method="fork"
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


def compare(model_dir: Path, data_dir: Path, sizes: tuple[int, ...] = SIZES) -> dict[tuple[int, str], float]:
    """The largest gap (log-prob, entropy or relative gradient) per (N, layout) over every rank."""
    case, batch = scored_batch(model_dir, data_dir)
    model = case.model()
    reference = {layout: run_layout(model, case, batch, layout) for layout in LAYOUTS}
    gaps = {}
    for size in sizes:
        ranks = split_outputs(model_dir, data_dir, size)
        for layout in LAYOUTS:
            gaps[(size, layout)] = max(max(largest_gaps(reference[layout], rank[layout]).values()) for rank in ranks)
    return gaps


def main(argv: list[str] | None = None) -> int:
    """Print the gaps; exit 1 past 1e-5."""
    model_dir, data_dir = (Path(arg) for arg in (argv if argv is not None else sys.argv[1:]))
    gaps = compare(model_dir, data_dir)
    for (size, layout), gap in gaps.items():
        print(f"N={size} {layout}: max gap {gap:.1e}")
    return 0 if max(gaps.values()) <= 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
