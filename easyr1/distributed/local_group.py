"""One worker in the driver's process, behind :class:`~easyr1.distributed.worker_group.WorkerGroup`'s surface.

``trainer.single_process=true`` (one worker) runs the whole loop in one Python process: the worker is rank 0 of a
one-rank process group (gloo on CPU, ``cpu:gloo,cuda:nccl`` on GPU, as Ray workers create it), its methods are
plain calls, and no Ray process starts. A breakpoint in ``Trainer.train_step`` or in ``HybridWorker.update_actor``
stops the same process. The worker's code is the one Ray runs; only the dispatch differs: no per-step sample cache
and no serialization (each call gets a shallow copy of its batch, so that fields the worker sets never appear in the
driver's batch).
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Callable
from typing import Any

from easyr1.distributed.worker import Worker, method_name
from easyr1.protocol import Batch


def loopback_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago (the one-rank group's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalWorkerGroup:
    """One instance of ``worker_cls`` in this process: rank 0 of a one-rank process group."""

    num_workers = 1

    def __init__(
        self, worker_cls: type[Worker], *, init_args: tuple = (), threads_per_worker: int = 1, backend: str = "gloo"
    ) -> None:
        self.worker_cls = worker_cls
        self.worker = worker_cls(*init_args)
        self.worker.init_distributed(0, 1, "127.0.0.1", loopback_port(), threads_per_worker, backend)

    def describe(self) -> str:
        """One line: where the worker runs."""
        return "1 worker in this process (trainer.single_process: no Ray)"

    def check_shared_directory(self, directory: Any, key: str) -> None:
        """Nothing to check: the driver and its one worker see the same files."""

    def run_all(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` (a method of the worker class) on the worker; its result in a one-element list."""
        return [getattr(self.worker, method_name(self.worker_cls, method))(*args, **kwargs)]

    def run_split(self, method: Callable[..., Any], batch: Batch, *args: Any, pad: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` on the whole batch (one worker's chunk is all of it); a batch result comes back as it is,
        anything else in a one-element list (as :class:`~easyr1.distributed.worker_group.WorkerGroup` returns it).
        ``pad`` has nothing to pad with one worker."""
        name = method_name(self.worker_cls, method)
        own = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        result = getattr(self.worker, name)(own, *args, **kwargs)
        return result if isinstance(result, Batch) else [result]

    def open_step(self) -> None:
        """Start a training step (no per-step cache in one process)."""

    def finish_step(self) -> dict[str, float]:
        """End a training step: nothing crossed a process boundary."""
        return {"perf/bytes_to_workers": 0.0, "perf/bytes_from_workers": 0.0}

    def shutdown(self) -> None:
        """Close the worker (its engine's state, the process group) and drop it with its models."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        gc.collect()
