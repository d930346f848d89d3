"""Model states of the actor, the reference and the critic on one worker: parameters, gradients, optimizer states.

Each model is FSDP2-sharded over every worker, so a worker keeps ``1 / world`` of each state in its storage dtype
(:func:`easyr1.distributed.precision.resolve_precision`). Gradients and AdamW's two moments exist only for trainable
parameters (all, all but the vision tower when it is frozen, or only the LoRA adapters); ``adamw_bf16`` keeps the
moments in bf16. While a model computes, FSDP gathers one unit at a time in the compute dtype: the root unit (the
vision tower; tied embeddings too) for the whole pass, and two decoder layers (the current one and the prefetched
next) or the embeddings or an untied LM head (units of their own) with one layer; or the whole model with
``enable_full_shard=false``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from easyr1.distributed.precision import Precision, resolve_precision
from easyr1.plan.model_size import ModelSize


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype``."""
    return torch.finfo(dtype).bits // 8


@dataclass(frozen=True)
class ModelStates:
    """One role's model on one worker. Byte counts are per worker (``shards`` ways sharded).

    ``offload_params`` / ``offload_optimizer``: the states sit in host memory between the calls that use the model
    (``offload.*``, or FSDP's CPU offload policy on GPU, which keeps them there even while computing).
    """

    role: str
    parameters: int
    trainable: int
    precision: Precision
    optimizer_moment_bytes: int
    shards: int
    gathered_parameters: int
    offload_params: bool
    offload_optimizer: bool
    always_on_host: bool

    @property
    def param_bytes(self) -> int:
        """This worker's shard of the weights, in the storage dtype."""
        return self.parameters * dtype_bytes(self.precision.storage) // self.shards

    @property
    def grad_bytes(self) -> int:
        """This worker's shard of the gradients (trainable parameters, storage dtype)."""
        return self.trainable * dtype_bytes(self.precision.storage) // self.shards

    @property
    def optimizer_bytes(self) -> int:
        """This worker's shard of AdamW's two moments (trainable parameters)."""
        return self.trainable * 2 * self.optimizer_moment_bytes // self.shards

    @property
    def gathered_bytes(self) -> int:
        """Full (unsharded) weights held at once while the model computes, in the compute dtype."""
        return self.gathered_parameters * dtype_bytes(self.precision.compute)

    def resident_bytes(self, in_use: bool, training: bool) -> int:
        """Device bytes of the model's states: all of them while ``in_use`` (the optimizer's only when
        ``training``), else what offloading leaves on the device."""
        if self.always_on_host:
            return 0
        # gradients exist from the first backward to the optimizer step (zero_grad sets them to None)
        grads = self.grad_bytes if training else 0
        optimizer = self.optimizer_bytes
        if in_use:
            return self.param_bytes + grads + (optimizer if training or not self.offload_optimizer else 0)
        return (0 if self.offload_params else self.param_bytes) + (0 if self.offload_optimizer else optimizer)

    def host_bytes(self) -> int:
        """Host bytes the model's offloaded states take between calls."""
        if self.always_on_host:
            return self.param_bytes + self.grad_bytes + self.optimizer_bytes
        return (self.param_bytes if self.offload_params else 0) + (
            self.optimizer_bytes if self.offload_optimizer else 0
        )


def _gathered(size: ModelSize, parameters: int, full_shard: bool) -> int:
    """Parameters gathered at once at the peak: the root unit for the whole pass, plus the largest of two decoder
    layers (the current one and the prefetched next) or the embeddings or LM head with one layer beside them."""
    if not full_shard:
        return parameters
    per_layer = max(size.language - size.embeddings - size.lm_head, 0) // max(size.text.layers, 1)
    if size.lm_head:  # untied: the embeddings and the LM head are units of their own (distributed/fsdp.py)
        root = size.vision
        beside_root = max(2 * per_layer, max(size.embeddings, size.lm_head) + per_layer)
    else:  # one shared table, used by two modules: it stays in the root
        root = size.vision + size.embeddings
        beside_root = 2 * per_layer
    return min(root + beside_root, parameters)


def model_states(
    role: str, section: Any, size: ModelSize, device: str, world: int, trainable: int, parameters: int
) -> ModelStates:
    """States of ``role`` (``actor``, ``critic`` or ``ref``) from its config ``section`` (``worker.actor`` ...)."""
    precision = resolve_precision(section.fsdp, device, role)
    optim = getattr(section, "optim", None)
    moment = 2 if optim is not None and optim.strategy == "adamw_bf16" else dtype_bytes(precision.storage)
    policy_offload = device == "cuda" and section.fsdp.enable_cpu_offload
    return ModelStates(
        role=role,
        parameters=parameters,
        trainable=trainable if role != "ref" else 0,
        precision=precision,
        optimizer_moment_bytes=moment,
        shards=world,
        gathered_parameters=_gathered(size, parameters, section.fsdp.enable_full_shard),
        # offload moves states to host memory; on a CPU device that is where they already are
        offload_params=device == "cuda" and section.offload.offload_params,
        offload_optimizer=device == "cuda" and section.offload.offload_optimizer,
        always_on_host=policy_offload,
    )


def actor_trainable(size: ModelSize, model: Any) -> tuple[int, int]:
    """(parameters, trainable parameters) of the actor from ``worker.actor.model``: LoRA adds adapters and trains
    only them; a frozen vision tower trains everything else."""
    lora = model.lora
    if lora.rank > 0:
        adapters = size.lora_parameters(lora.rank, lora.target_modules, lora.exclude_modules)
        return size.total + adapters, adapters
    trainable = size.total - (size.vision if model.freeze_vision_tower else 0)
    return size.total, trainable


def critic_trainable(size: ModelSize, model: Any) -> tuple[int, int]:
    """(parameters, trainable parameters) of the critic: the backbone plus a ``hidden -> 1`` value head; with LoRA
    the adapters (the LM head has none to lose) and the head train."""
    head = size.text.hidden + 1
    parameters = size.backbone + head
    lora = model.lora
    if lora.rank > 0:
        adapters = size.lora_parameters(lora.rank, lora.target_modules, lora.exclude_modules)
        # the critic has no LM head, so no adapter on it either (all-linear already leaves it out)
        return parameters + adapters, adapters + head
    return parameters, parameters - (size.vision if model.freeze_vision_tower else 0)
