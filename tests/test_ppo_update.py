"""The PPO update loop shared by the actor and the critic, on a small linear model against a written-out loop."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from easyr1.protocol import Batch
from easyr1.workers.ppo_update import PPOUpdate, consecutive_micro_batches


def make_batch(rows: int = 8, seed: int = 0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, 5, generator=generator) > 0.3).long()
    mask[:, 0] = 1
    return Batch(
        tensors={
            "x": torch.randn(rows, 5, 3, generator=generator),
            "target": torch.randn(rows, 5, generator=generator),
            "response_mask": mask,
        }
    )


def squared_error(model: nn.Module, micro: Batch, num_global_tokens: float) -> torch.Tensor:
    error = (model(micro["x"]).squeeze(-1) - micro["target"]).square() * micro["response_mask"]
    return error.sum() / num_global_tokens


def micro_loss_of(model: nn.Module):
    def micro_loss(rows, micro, norm, sums):
        loss = squared_error(model, micro, norm["num_global_tokens"])
        sums["m/loss"] += loss.item()
        sums["m/rows"] += float(len(rows))
        return loss

    return micro_loss


def reference_update(model, optimizer, batch, mini, micro, epochs, max_grad_norm):
    """Epochs x consecutive mini-batches (one clipped step each) x consecutive micro-batches, written out."""
    per_step = []
    for _ in range(epochs):
        for start in range(0, len(batch), mini):
            mini_batch = batch.index(slice(start, start + mini))
            tokens = float(mini_batch["response_mask"].sum())
            loss_sum, rows = 0.0, 0.0
            for micro_start in range(0, len(mini_batch), micro):
                part = mini_batch.index(slice(micro_start, micro_start + micro))
                loss = squared_error(model, part, tokens)
                loss.backward()
                loss_sum += loss.item()
                rows += len(part)
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            per_step.append({"m/loss": loss_sum, "m/rows": rows, "m/grad_norm": grad_norm})
    return {key: sum(step[key] for step in per_step) / len(per_step) for key in per_step[0]}


@pytest.mark.parametrize(("mini", "micro", "epochs"), [(4, 3, 2), (8, 8, 1), (3, 2, 1)])
def test_shared_loop_equals_the_written_out_loop(mini: int, micro: int, epochs: int) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    reference_model = copy.deepcopy(model)
    batch = make_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference_model.parameters(), lr=0.1)

    loop = PPOUpdate(model, optimizer, 0.5, torch.device("cpu"), consecutive_micro_batches(micro), "m/grad_norm")
    metrics = loop.run(batch, mini, epochs, micro_loss_of(model))
    expected = reference_update(reference_model, reference_optimizer, batch, mini, micro, epochs, 0.5)

    assert metrics == expected  # bit for bit: same operations in the same order
    for parameter, reference in zip(model.parameters(), reference_model.parameters(), strict=True):
        assert torch.equal(parameter, reference)
        assert parameter.grad is None  # cleared after every step


def test_micro_batch_size_does_not_change_the_update() -> None:
    """Gradients accumulate over micro-batches with the mini-batch's token count: any split gives the same step."""
    torch.manual_seed(1)
    base = nn.Linear(3, 1)
    batch = make_batch(seed=2)
    results = []
    for micro in (1, 3, 8):
        model = copy.deepcopy(base)
        loop = PPOUpdate(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            10.0,
            torch.device("cpu"),
            consecutive_micro_batches(micro),
            "m/grad_norm",
        )
        metrics = loop.run(batch, 8, 1, micro_loss_of(model))
        results.append((metrics["m/loss"], metrics["m/grad_norm"], [p.detach().clone() for p in model.parameters()]))
    for loss, grad_norm, parameters in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        assert grad_norm == pytest.approx(results[0][1], rel=1e-6)
        for parameter, first in zip(parameters, results[0][2], strict=True):
            torch.testing.assert_close(parameter, first, rtol=0, atol=1e-7)


def test_a_non_finite_gradient_skips_the_step() -> None:
    model = nn.Linear(3, 1)
    before = [p.detach().clone() for p in model.parameters()]
    loop = PPOUpdate(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1.0,
        torch.device("cpu"),
        consecutive_micro_batches(4),
        "m/grad_norm",
    )

    def infinite_loss(rows, micro, norm, sums):
        return squared_error(model, micro, norm["num_global_tokens"]) * float("inf")

    metrics = loop.run(make_batch(), 8, 1, infinite_loss)
    assert not math.isfinite(metrics["m/grad_norm"])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
