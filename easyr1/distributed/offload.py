"""Moving a sharded model's state between the device and host memory, and the bookkeeping of where it is.

While the rollout engine generates, the actor's shards, gradients and optimizer states only take device memory
the engine could use; EasyR1's ``offload.offload_params`` / ``offload.offload_optimizer`` keep them in host
memory between the phases that need them. :func:`move_model` and :func:`move_optimizer` do the moving (each
rank moves its own shards: FSDP2 re-registers the moved shards with ``model.to``); :class:`Residency` says
whether a model is to be kept off the device and brings it in for the duration of one phase.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def move_model(model: nn.Module, device: torch.device | str) -> None:
    """Move ``model``'s parameters (each rank's shards for an FSDP2 model), their gradients and its buffers."""
    model.to(device, non_blocking=torch.device(device).type == "cpu")
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()  # the host copies must be complete before the device memory is reused
        torch.cuda.empty_cache()


def move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor state of ``optimizer`` (e.g. AdamW's moments) to ``device``; ``step`` counters stay where
    the optimizer keeps them (on the host for the non-capturable AdamW)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def model_devices(model: nn.Module) -> set[torch.device]:
    """The devices holding ``model``'s parameters and gradients (local shards for DTensors)."""
    tensors = [*model.parameters(), *(param.grad for param in model.parameters() if param.grad is not None)]
    return {tensor.device for tensor in tensors}


def optimizer_devices(optimizer: torch.optim.Optimizer) -> set[torch.device]:
    """The devices holding ``optimizer``'s tensor states, ``step`` counters left out."""
    return {
        value.device
        for state in optimizer.state.values()
        for key, value in state.items()
        if key != "step" and isinstance(value, torch.Tensor)
    }


class Residency:
    """Where one model's parameters and optimizer states live between phases, and moving them in for a phase.

    With ``offload_params`` the parameters (and gradients) stay in host memory (``host``) except inside
    :meth:`on_device`; with ``offload_optimizer`` the same for the optimizer states (brought in only by
    ``on_device(optimizer=True)``). Nested uses share one move. ``params_on_device`` / ``optimizer_on_device``
    record where the state is; ``moves`` counts the transfers (for tests and logs).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device | str,
        *,
        offload_params: bool,
        offload_optimizer: bool,
        host: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.host = torch.device(host)
        self.offload_params = offload_params
        self.offload_optimizer = offload_optimizer and optimizer is not None
        self.params_on_device = True
        self.optimizer_on_device = True
        self.moves = 0
        self._depth = 0

    @classmethod
    def from_config(cls, model: nn.Module, optimizer: torch.optim.Optimizer | None, device, offload: Any) -> Residency:
        """The residency an ``offload`` config section (``offload_params``, ``offload_optimizer``) asks for."""
        return cls(
            model,
            optimizer,
            device,
            offload_params=offload.offload_params,
            offload_optimizer=offload.offload_optimizer,
        )

    def release(self) -> None:
        """Send what is to be offloaded to host memory (at start-up, and after each phase)."""
        if self.offload_params and self.params_on_device:
            move_model(self.model, self.host)
            self.params_on_device = False
            self.moves += 1
        if self.offload_optimizer and self.optimizer_on_device:
            move_optimizer(self.optimizer, self.host)
            self.optimizer_on_device = False
            self.moves += 1

    @contextmanager
    def on_device(self, *, optimizer: bool = False) -> Iterator[None]:
        """The parameters (and, with ``optimizer``, the optimizer states) on the device for the block; released
        again when the outermost block ends."""
        if not self.params_on_device:
            move_model(self.model, self.device)
            self.params_on_device = True
            self.moves += 1
        if optimizer and self.optimizer is not None and not self.optimizer_on_device:
            move_optimizer(self.optimizer, self.device)
            self.optimizer_on_device = True
            self.moves += 1
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.release()
