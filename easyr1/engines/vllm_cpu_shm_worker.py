"""vLLM's CPU worker with shared-memory names unique to one engine (see :mod:`easyr1.engines.vllm_shm`).

Imported by vLLM, by name, through ``LLM(worker_cls=...)``, and only on CPU.
"""

from __future__ import annotations

import os

from vllm.v1.worker.cpu_worker import CPUWorker

from easyr1.engines.vllm_shm import TAG_VARIABLE


class TaggedShmCPUWorker(CPUWorker):
    """vLLM's CPU worker, naming its communicator's shared memory after ``$EASYR1_VLLM_SHM_TAG``.

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
