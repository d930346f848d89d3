"""Compact pickling of host tensors for Ray's messages between the driver and the workers.

Ray pickles a torch tensor with torch's own reduction, which has two costs here: it writes the tensor's whole
storage (a slice of a batch carries the whole batch, to every rank that gets a slice), and it goes through
``torch.save``'s legacy format, ~0.25 ms a tensor whatever its size (a step's calls move dozens of small tensors).
:func:`install` registers, in the calling process, a reduction for plain host tensors that sends only the elements
the tensor shows, as a NumPy byte array (which Ray's pickle-5 path sends out of band, as it does NumPy arrays), with
the dtype and the shape. Everything else keeps torch's own reduction: tensors that require grad, live on a device,
are sparse or quantized, carry a conjugate or negative bit or dimension names, and every subclass
(``nn.Parameter``, ``DTensor``).

The receiver sees what it saw before: each tensor with storage of its own (two views of one storage arrive as two
tensors, as with torch's pickling; the same tensor object twice arrives as one object, pickle memoises it), writable
(:func:`rebuild` copies out of Ray's read-only buffer). The sending process needs this installed; the receiving one
rebuilds with :func:`rebuild`, found by import.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def is_plain_host_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` travels as its bytes (see the module docstring); ``False``: torch's own pickling."""
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.requires_grad
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
        and all(name is None for name in getattr(tensor, "names", ()))  # named tensors: gone from recent torch
    )


def rebuild(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor from its bytes: a writable tensor with storage of its own."""
    if data.size == 0:  # (an empty byte array cannot be viewed as a wider dtype)
        return torch.empty(shape, dtype=dtype)
    # Ray hands out-of-band buffers over read-only (a view of the received message or the object store)
    return torch.from_numpy(np.array(data, copy=True)).view(dtype).reshape(shape)


def reduce_tensor(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    """Pickle's reduction of a tensor: its shown bytes for a plain host tensor, else torch's own."""
    if not is_plain_host_tensor(tensor):
        return tensor.__reduce_ex__(5)
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    return rebuild, (data, tensor.dtype, tuple(tensor.shape))


def install() -> None:
    """Use :func:`reduce_tensor` for every ``torch.Tensor`` this process sends through Ray (idempotent); where Ray is
    not installed nothing is sent through it (a worker in the driver's process on a machine without Ray)."""
    try:
        import ray.cloudpickle
    except ImportError:
        return

    # the dispatch table Ray's serialization context fills (ray.util.register_serializer); keyed by exact type,
    # so subclasses keep their own reduction
    ray.cloudpickle.CloudPickler.dispatch[torch.Tensor] = reduce_tensor


def message_bytes(tensor: torch.Tensor) -> int:
    """Bytes ``tensor`` puts into a message once :func:`install` is in place."""
    if is_plain_host_tensor(tensor):
        return tensor.numel() * tensor.element_size()
    return tensor.untyped_storage().nbytes()
