"""FSDP2 sharding applied from outside the model: every repeated block, then the root.

The blocks to shard are the classes a Hugging Face model lists in ``_no_split_modules`` (decoder
layers and vision blocks for Qwen-VL), so any HF model is sharded the same way without per-model code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def data_parallel_mesh(device_type: str) -> DeviceMesh:
    """A 1-d mesh over every rank of the default process group."""
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("fsdp",))


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply ``fully_shard`` to each decoder block named in ``model._no_split_modules``, then to the whole model.

    ``param_dtype`` enables mixed precision (compute in that dtype, keep fp32 master weights); leave it
    ``None`` to compute in the parameters' own dtype.
    """
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    # The vision tower stays in the root unit: gathered once per forward however often it runs (a Qwen-VL forward
    # runs it once for images, once for videos, not at all for text), so ranks with different mixes of rows issue
    # the same collectives. See models/vision_tower.py for the other half (every vision weight gets a gradient).
    blocks = [
        module
        for name, module in model.named_modules()
        if type(module).__name__ in block_names and "visual" not in name.split(".")
    ]
    if not blocks:
        raise ValueError(f"{type(model).__name__} lists no shardable blocks in _no_split_modules")
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


@contextmanager
def gathered_parameters(model: nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's full parameters, gathered with one all-gather per FSDP group, resharded on exit.

    Yields an iterator of ``(name, tensor)`` with Hugging Face parameter names. Much cheaper than gathering the
    state dict tensor by tensor (one collective per parameter).
    """
    groups = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for group in groups:
        group.unshard()
    try:
        yield ((name, param.detach()) for name, param in model.named_parameters())
    finally:
        for group in groups:
            group.reshard()


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The global value of a possibly sharded tensor (DTensors are gathered)."""
    return value.full_tensor() if isinstance(value, DTensor) else value
