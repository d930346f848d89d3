"""Ray worker groups: placement, rank environment, process-group set-up and dispatch of calls.

``WorkerGroup`` needs Ray and is imported on first use, so the rest of the package (FSDP helpers, the
``Worker`` base, batch balancing) imports without Ray: a worker can then be driven in-process
(``tests/gpu/inprocess.py`` on machines that have torch but not Ray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from easyr1.distributed.worker import Worker


if TYPE_CHECKING:
    from easyr1.distributed.worker_group import WorkerGroup


__all__ = ["Worker", "WorkerGroup"]


def __getattr__(name: str) -> Any:
    if name == "WorkerGroup":
        from easyr1.distributed.worker_group import WorkerGroup

        return WorkerGroup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
