"""Shared-memory segments of vLLM's CPU tensor-parallel communicator: unique per engine, gone once attached.

With ``tensor_parallel_size > 1`` on CPU, vLLM's ``CpuCommunicator`` exchanges tensors through POSIX shared
memory named ``{VLLM_DIST_IDENT}-{group name}-[{ranks}]-cpushm_{i}``
(``vllm/distributed/device_communicators/cpu_communicator.py: _CPUSHMDistributed.make_group_name``). Its CPU
worker derives ``VLLM_DIST_IDENT`` from the distributed init method, which under ``external_launcher`` is always
``env://``, so every run on a machine uses the same names. The segments are created exclusively and never
unlinked: the first run leaves them in ``/dev/shm`` and every later run fails with ``create shm in SHMManager
failed. errno: 17`` (EEXIST).

Here each engine gets a fresh tag that all ranks agree on (:func:`agree_on_tag`); :class:`TaggedShmCPUWorker`
makes vLLM use it as ``VLLM_DIST_IDENT``. Once every rank has attached (the engine is built), the names are
unlinked (:func:`unlink_segments`): the mappings live on until the processes end, nothing is left behind even
by a run that is killed, and a leftover from an older run cannot collide with a new name.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import torch.distributed as dist
from vllm.v1.worker.cpu_worker import CPUWorker


TAG_VARIABLE = "EASYR1_VLLM_SHM_TAG"
SHM_ROOT = Path("/dev/shm")


def agree_on_tag() -> str:
    """A tag made by rank 0 and broadcast to every rank (collective over the default CPU process group)."""
    message = [f"easyr1.{os.getpid()}.{secrets.token_hex(6)}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def segments(tag: str, root: Path = SHM_ROOT) -> list[Path]:
    """The shared-memory files vLLM made for the engine tagged ``tag``."""
    return sorted(path for path in root.glob(f"{tag}-*") if "cpushm" in path.name)


def unlink_segments(tag: str, root: Path = SHM_ROOT) -> None:
    """Remove the names of the engine's segments (mapped memory stays valid until every process unmaps it)."""
    for path in segments(tag, root):
        path.unlink(missing_ok=True)  # another rank of the group may have removed it first


class TaggedShmCPUWorker(CPUWorker):
    """vLLM's CPU worker, naming its shared memory after ``$EASYR1_VLLM_SHM_TAG``.

    ``CPUWorker.init_device`` sets ``VLLM_DIST_IDENT`` to the base name of a ``file://`` init method. Under
    ``external_launcher`` the process group already exists, so vLLM does not use the init method to connect;
    giving it ``file://<tag>`` only changes the identifier in the segment names.
    """

    def init_device(self) -> None:
        """Set the tag as the init method's name, then initialise as vLLM does."""
        tag = os.environ.get(TAG_VARIABLE)
        if tag:
            self.distributed_init_method = f"file://{tag}"
        super().init_device()
