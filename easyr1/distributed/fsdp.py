"""FSDP2 sharding applied from outside the model: every repeated block, the embeddings, then the root.

The blocks to shard are the classes a Hugging Face model lists in ``_no_split_modules`` (decoder
layers and vision blocks for Qwen-VL), so any HF model is sharded the same way without per-model code; the input
embeddings and an untied LM head are units of their own.
Also here: filling the shards of a model built on the meta device from rank 0's full weights
(:func:`broadcast_full_weights`), and the full weights one FSDP group at a time for the weight sync
(:func:`gathered_parameters`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from easyr1.errors import ConfigError
from easyr1.models.families import family_of


_cpu_offload_notice_printed = False


def data_parallel_mesh(device_type: str) -> DeviceMesh:
    """A 1-d mesh over every rank of the default process group."""
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("fsdp",))


def check_fsdp_size(key: str, fsdp_size: int, world_size: int) -> None:
    """``fsdp.fsdp_size`` must describe the one mesh there is: every rank in one shard group.

    Hybrid sharding (shard groups of ``fsdp_size`` ranks, replicated across groups) is not built, so any other
    size is a :class:`ConfigError` naming ``key`` rather than a setting that silently does nothing.
    """
    if fsdp_size not in (-1, world_size):
        raise ConfigError(
            f"{key}={fsdp_size}: every model is sharded over all {world_size} workers (hybrid sharding over "
            f"smaller groups is not implemented); set {key}=-1 (or {world_size})"
        )


def reshard(model: nn.Module) -> None:
    """Free every unsharded parameter of ``model``'s FSDP groups (a no-op for groups that are sharded).

    Groups built with ``reshard_after_forward=False`` keep their parameters unsharded from the forward until the
    backward reshards them; a forward without a backward (log-probs, values) would leave them so. Calling this
    after such a pass hands the memory back before the next phase (rollout, offload, checkpoint).
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _cpu_offload_policy(mesh: DeviceMesh) -> CPUOffloadPolicy | None:
    """FSDP's CPU offload on an accelerator; on a CPU device ``None`` (everything already lives in host memory,
    and the policy's pinned memory needs an accelerator), with one notice per process."""
    global _cpu_offload_notice_printed
    if mesh.device_type != "cpu":
        return CPUOffloadPolicy()
    if not _cpu_offload_notice_printed:
        _cpu_offload_notice_printed = True
        print("easyr1: fsdp.enable_cpu_offload is a no-op on a CPU device: the weights already live in host memory")
    return None


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply ``fully_shard`` to each decoder block named in ``model._no_split_modules``, then to the whole model.

    ``mp_policy`` enables mixed precision (see :mod:`easyr1.distributed.precision`). ``reshard_after_forward=False``
    (``fsdp.enable_full_shard=false``) keeps each block's parameters gathered from its forward until its backward,
    trading memory for one all-gather per block less in the backward (FSDP1's ``SHARD_GRAD_OP``, ZeRO-2); gradients
    and optimizer states stay sharded either way. The model may be on the CPU
    or on the meta device: FSDP2 moves each rank's shards to the mesh's device (the host with ``cpu_offload``),
    so the whole model is never on the device at once.
    """
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    offload_policy = _cpu_offload_policy(mesh) if cpu_offload else None
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    # The vision tower stays in the root unit: gathered once per forward however often it runs (a Qwen-VL forward
    # runs it once for images, once for videos, not at all for text), so ranks with different mixes of rows issue
    # the same collectives. See models/vision_tower.py for the other half (every vision weight gets a gradient).
    family = family_of(model.config)
    blocks = [
        module
        for name, module in model.named_modules()
        if type(module).__name__ in block_names and not family.is_vision_module(name)
    ]
    if not blocks:
        raise ValueError(f"{type(model).__name__} lists no shardable blocks in _no_split_modules")
    for block in blocks:
        fully_shard(block, **kwargs)
    # The input embeddings and the LM head run exactly once per forward on every rank: units of their own, so the
    # root (gathered for the whole forward and backward, its gradients reduced in one full-size buffer at the end)
    # holds only the vision tower and the small pieces. A tied pair is one parameter shared by two modules, which
    # FSDP cannot split between units: it stays in the root.
    for module in embedding_units(model):
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def embedding_units(model: nn.Module) -> list[nn.Module]:
    """The input embedding and (untied) output projection modules of ``model`` that :func:`shard_model` makes units
    of their own; none when they share their weight."""
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    outputs = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weights = [getattr(module, "weight", None) for module in (inputs, outputs) if module is not None]
    if len(weights) == 2 and weights[0] is weights[1]:
        return []
    return [module for module in (inputs, outputs) if isinstance(module, nn.Module) and module is not model]


def broadcast_full_weights(
    model: nn.Module, full_state_dict: dict[str, torch.Tensor] | None, device: torch.device | str
) -> None:
    """Fill a sharded model's shards from rank 0's full state dict; collective over every rank.

    Rank 0 passes the state dict of its loaded (unsharded) model, taken before sharding; the other ranks pass
    ``None`` and may hold a model built on the meta device, whose shards and buffers are allocated on ``device``
    here (the mesh's device, where ``fully_shard`` put rank 0's buffers; with FSDP's CPU offload policy the
    shards then move to pinned host memory as FSDP re-registers them).
    Buffers outside the state dict (non-persistent ones such as rotary ``inv_freq``) are copied from rank 0
    as well, so every rank ends up with exactly rank 0's tensors.
    """
    rank = dist.get_rank()
    if rank != 0 and full_state_dict:
        raise ValueError("only rank 0 passes the full state dict")
    if any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    set_model_state_dict(
        model,
        full_state_dict if rank == 0 else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    persistent = set(model.state_dict().keys())
    # in name order: registration order can differ between rank 0's loaded model and the others' meta-built ones, and
    # broadcasts paired out of order would mismatch sizes or hang (GPU audit N6)
    for name, buffer in sorted(model.named_buffers(), key=lambda item: item[0]):
        if name not in persistent:
            dist.broadcast(buffer, src=0)


def _groups_and_their_parameters(model: nn.Module) -> list[tuple[FSDPModule, list[tuple[str, nn.Module, str]]]]:
    """Every FSDP group of ``model`` with the parameters it manages (those not inside a nested group), as
    ``(name in model.named_parameters(), owning module, attribute name)``; groups in the order their first
    parameter appears. The attribute is read when needed: unsharding registers new parameter objects."""
    owners: dict[str, FSDPModule | None] = {}  # module name -> the FSDP group that manages its own parameters
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            owners[name] = module
        else:
            owners[name] = owners.get(name.rpartition(".")[0]) if name else None
    grouped: dict[int, tuple[FSDPModule, list[tuple[str, nn.Module, str]]]] = {}
    seen: set[int] = set()  # a tied parameter keeps its first name, as in named_parameters()
    for module_name, module in model.named_modules():
        group = owners[module_name]
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            if group is None:
                raise ValueError(f"parameter {full_name} is in no FSDP group: shard the model first")
            grouped.setdefault(id(group), (group, []))[1].append((full_name, module, param_name))
    return list(grouped.values())


def _compute_dtype(group: FSDPModule) -> torch.dtype | None:
    """The group's mixed-precision compute dtype (None: no policy, or one FSDP does not expose here)."""
    policy = getattr(group._get_fsdp_state(), "_mp_policy", None)
    return getattr(policy, "param_dtype", None)


def _whole_local_values(
    group: FSDPModule, parameters: list[tuple[str, nn.Module, str]]
) -> list[tuple[str, torch.Tensor]] | None:
    """Each parameter's full value without an unshard, when every shard already is the whole parameter: a
    one-rank mesh, shards on the mesh's device (not offloaded to the host by FSDP). Otherwise ``None``.

    The values are the stored tensors themselves (no copy) or, under a compute dtype other than the storage
    dtype, their cast: exactly what an unshard would produce, without its copy-in, all-gather and copy-out.
    """
    values = []
    compute = _compute_dtype(group)
    for name, module, attr in parameters:
        param = getattr(module, attr)
        if not isinstance(param, DTensor) or param.device_mesh.size() != 1:
            return None
        local = param.to_local().detach()
        if local.device.type != param.device_mesh.device_type or local.shape != param.shape:
            return None
        cast = compute is not None and local.is_floating_point() and local.dtype != compute
        values.append((name, local.to(compute) if cast else local))
    return values


def _full_parameters(model: nn.Module, master_weights: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for group, parameters in _groups_and_their_parameters(model):
        if master_weights:  # the sharded (storage-dtype) values, gathered parameter by parameter
            yield from [(name, full_tensor(getattr(module, attr).detach())) for name, module, attr in parameters]
            continue
        whole = _whole_local_values(group, parameters)
        if whole is not None:  # one rank: the shards are the parameters
            yield from whole
            continue
        group.unshard()
        try:
            # copies: resharding frees the unsharded storage that the parameters are views of
            unsharded = [(name, getattr(module, attr).detach().clone()) for name, module, attr in parameters]
        finally:
            group.reshard()
        yield from unsharded


@contextmanager
def gathered_parameters(
    model: nn.Module, *, master_weights: bool = False
) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's full parameters, one FSDP group at a time: unshard a group, copy its own parameters, reshard.

    Yields an iterator of ``(name, tensor)`` with Hugging Face parameter names (every rank iterates it to the
    end: each group's unshard is a collective). The values are in the compute dtype of the model's mixed
    precision policy (the storage dtype without one); with ``master_weights`` they are the stored master
    weights, gathered parameter by parameter (e.g. fp32 to fold LoRA adapters before casting). At most one
    group is gathered at a time, so the peak is one group's full weights plus what the consumer keeps, never
    the whole model at once. On a one-rank mesh nothing is gathered: the values are the stored parameters (or
    their cast to the compute dtype), which the consumer must only read.
    """
    yield _full_parameters(model, master_weights)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The global value of a possibly sharded tensor (DTensors are gathered)."""
    return value.full_tensor() if isinstance(value, DTensor) else value
