"""Ray worker groups: placement, rank environment, process-group set-up and dispatch of calls."""

from easyr1.distributed.worker import Worker
from easyr1.distributed.worker_group import WorkerGroup


__all__ = ["Worker", "WorkerGroup"]
