"""Which dtypes a sharded model keeps, computes in and reduces gradients in, per role and device.

EasyR1's policy on a GPU: the actor and the critic keep fp32 master weights (so AdamW's states are fp32 and
updates at lr 1e-6 are not rounded away), compute in bf16 and reduce gradients in fp32 (FSDP2
``MixedPrecisionPolicy``); the reference model is stored and run in bf16. On a CPU everything defaults to fp32:
bf16 matmuls are slow on most CPUs, and the CPU tests compare the rollout engine and the trainer in fp32.

Each ``fsdp`` section sets the policy with the keys ``torch_dtype`` (storage), ``mp_param_dtype`` (compute) and
``mp_reduce_dtype`` (gradient reduction); ``null`` means the device default above. Explicit values act on any
device (FSDP2 mixed precision runs on gloo too). ``mp_buffer_dtype`` has no FSDP2 counterpart: FSDP2 does not
shard or cast buffers, and the floating buffers of the supported models (rotary ``inv_freq``) are computed in
fp32 whatever the weights' dtype, so the key accepts fp32 only (checked in ``config/actor.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from easyr1.models.loading import resolve_dtype


TRAINED_ROLES = ("actor", "critic")
ROLES = (*TRAINED_ROLES, "ref")


@dataclass(frozen=True)
class Precision:
    """The dtypes of one model: ``storage`` (sharded master weights, gradients, optimizer states), ``compute``
    (weights and activations in forward and backward) and ``reduce`` (gradient reduce-scatter)."""

    storage: torch.dtype
    compute: torch.dtype
    reduce: torch.dtype

    def mixed_precision_policy(self) -> MixedPrecisionPolicy | None:
        """FSDP2's policy for these dtypes, or ``None`` when everything happens in the storage dtype."""
        if self.compute == self.storage and self.reduce == self.storage:
            return None
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=self.reduce)


def resolve_precision(fsdp: Any, device: str, role: str) -> Precision:
    """The precision of ``role`` (actor, critic or ref) from its ``fsdp`` config section, on ``device``.

    ``torch_dtype`` null: fp32 for the trained models; for the reference bf16 on GPU and fp32 on CPU.
    ``mp_param_dtype`` null: bf16 on GPU, the storage dtype on CPU. ``mp_reduce_dtype`` null: fp32 for the
    trained models (the reference computes no gradients; its reduce dtype is its storage dtype).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {ROLES}")
    on_gpu = device == "cuda"
    if fsdp.torch_dtype is not None:
        storage = resolve_dtype(fsdp.torch_dtype, device)
    elif role in TRAINED_ROLES:
        storage = torch.float32
    else:
        storage = torch.bfloat16 if on_gpu else torch.float32
    if fsdp.mp_param_dtype is not None:
        compute = resolve_dtype(fsdp.mp_param_dtype, device)
    else:
        compute = torch.bfloat16 if on_gpu else storage
    if role not in TRAINED_ROLES:
        reduce = storage
    elif fsdp.mp_reduce_dtype is not None:
        reduce = resolve_dtype(fsdp.mp_reduce_dtype, device)
    else:
        reduce = torch.float32
    return Precision(storage=storage, compute=compute, reduce=reduce)
