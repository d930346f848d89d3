"""vLLM's shared memory in the hybrid engine: names unique per engine, and unlinked once every rank attached.

Two kinds of POSIX shared memory outlive a run whose workers are killed (Ray ends actors without running
destructors), 24 MiB or more each time:

- **vLLM-CPU's tensor-parallel communicator** names its segments ``{VLLM_DIST_IDENT}-{group}-[{ranks}]-cpushm_{i}``
  (``vllm/distributed/device_communicators/cpu_communicator.py: _CPUSHMDistributed.make_group_name``). Its CPU
  worker derives ``VLLM_DIST_IDENT`` from the distributed init method, always ``env://`` under
  ``external_launcher``, so every run on a machine uses the same names; they are created exclusively and never
  unlinked, and every later run fails with ``create shm in SHMManager failed. errno: 17`` (EEXIST). Each engine
  here gets a fresh tag (:func:`agree_on_tag`) that :class:`~easyr1.engines.vllm_cpu_shm_worker.TaggedShmCPUWorker`
  makes vLLM use as ``VLLM_DIST_IDENT``.
- **The message queue** a multi-rank group uses to broadcast Python objects
  (``vllm/distributed/device_communicators/shm_broadcast.py``, ``psm_*``; CPU and GPU alike) is unlinked only by
  its creator's destructor.

Once the engine is built on every rank, all of them have attached, so the names can go
(:func:`release_names`): the mappings stay valid until the processes end, and nothing is left behind even by a
run that is killed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import torch.distributed as dist


TAG_VARIABLE = "EASYR1_VLLM_SHM_TAG"
SHM_ROOT = Path("/dev/shm")
# vLLM's process-group coordinators (vllm.distributed.parallel_state), any of which may own a message queue
_COORDINATORS = ("_WORLD", "_INNER_DP_WORLD", "_TP", "_ETP", "_DCP", "_PP", "_DP", "_EP", "_EPLB", "_PCP")


def agree_on_tag() -> str:
    """A tag made by rank 0 and broadcast to every rank (collective over the default CPU process group)."""
    message = [f"easyr1.{os.getpid()}.{secrets.token_hex(6)}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def cpu_segments(tag: str, root: Path = SHM_ROOT) -> list[Path]:
    """The shared-memory files vLLM-CPU's communicator made for the engine tagged ``tag``."""
    return sorted(path for path in root.glob(f"{tag}-*") if "cpushm" in path.name)


def unlink_message_queues() -> list[str]:
    """Unlink the shared memory of the message queues this rank created; returns their names."""
    from vllm.distributed import parallel_state

    names = []
    for attribute in _COORDINATORS:
        coordinator = getattr(parallel_state, attribute, None)
        queue = getattr(coordinator, "mq_broadcaster", None)
        buffer = getattr(queue, "buffer", None)
        if buffer is not None and buffer.is_creator:
            names.append(buffer.shared_memory.name)
            buffer.shared_memory.unlink()  # also tells Python's resource tracker it is gone
            buffer.is_creator = False  # so that the destructor only closes it
    return names


def release_names(tag: str | None) -> None:
    """Unlink the names of the engine's shared memory. Collective: call on every rank once the engine is built."""
    dist.barrier()  # every rank has attached to every segment and queue
    if tag is not None:
        for path in cpu_segments(tag):
            path.unlink(missing_ok=True)  # another rank of the group may have removed it first
    unlink_message_queues()
