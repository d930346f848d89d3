"""The optimizers behind ``optim.strategy``: ``adamw`` (torch's AdamW) and ``adamw_bf16``.

``adamw`` runs the kernels ``optim.implementation`` names. torch picks its per-parameter for-loop for host tensors
(and foreach for GPU ones); on FSDP2's DTensors every op of that loop goes through DTensor's dispatch, so on a CPU
worker the step of a 0.64 M-parameter model took 25-37 ms in the loop, 7.5-9 ms with foreach (the same result bit
for bit) and 5 ms fused (``bench/bench_optimizer.py``). Fused is also what Hugging Face's Trainer uses by default.

``adamw_bf16`` is AdamW whose two moment estimates are stored in bf16 (half the optimizer memory of fp32
states) while the parameters it updates stay in their own dtype (fp32 master weights): each step reads the
moments into fp32, updates them with the fp32 gradient, computes the update from the fp32 values and only
then stores the moments back in bf16. bf16 has fp32's exponent range, so squared gradients do not underflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


STATE_DTYPE = torch.bfloat16
# optim.implementation -> torch.optim.AdamW's arguments
ADAMW_KERNELS: dict[str, dict[str, bool]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "for-loop": {"foreach": False},
}


class AdamWBf16(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments) with bf16 moment states."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"invalid AdamW settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One AdamW step for every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    # a tensor, like torch's AdamW, so checkpoints (DCP) treat the two alike
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, dtype=STATE_DTYPE)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=STATE_DTYPE)
                state["step"] += 1
                step = state["step"].item()
                grad = param.grad.float()
                exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                denominator = (exp_avg_sq / bias_correction2).sqrt_().add_(eps)
                update = (exp_avg / bias_correction1).div_(denominator)
                param.mul_(1 - lr * weight_decay)
                param.add_(update.to(param.dtype), alpha=-lr)
        return loss


def build_optimizer(parameters: Iterable[torch.nn.Parameter], optim: Any) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.strategy`` over ``parameters`` (``optim``: an ``OptimConfig``)."""
    settings = {"lr": optim.lr, "betas": tuple(optim.betas), "weight_decay": optim.weight_decay}
    parameters = list(parameters)
    if optim.strategy == "adamw":
        kernels = ADAMW_KERNELS.get(optim.implementation)
        if kernels is None:
            raise ValueError(f"unknown optim.implementation {optim.implementation!r}; use {', '.join(ADAMW_KERNELS)}")
        return torch.optim.AdamW(parameters, **settings, **kernels)
    if optim.strategy == "adamw_bf16":
        return AdamWBf16(parameters, **settings)
    raise ValueError(f"unknown optim.strategy {optim.strategy!r}; use adamw or adamw_bf16")


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio`` over ``optim.training_steps``."""
    total = max(int(optim.training_steps), 1)
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps is not None else int(optim.lr_warmup_ratio * total)
    min_ratio = optim.min_lr_ratio if optim.min_lr_ratio is not None else 0.0

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if optim.lr_scheduler_type == "cosine":
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
