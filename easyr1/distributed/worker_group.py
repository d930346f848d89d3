"""A group of Ray actors that act as the ranks of one torch process group.

The driver calls methods on all workers at once, either broadcasting the same arguments
(:meth:`WorkerGroup.run_all`) or splitting a :class:`~easyr1.protocol.Batch` into equal consecutive
chunks, one per rank (:meth:`WorkerGroup.run_split`), and collects the results in rank order.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from easyr1.distributed.worker import Worker
from easyr1.protocol import Batch


class WorkerGroup:
    """``num_workers`` instances of ``worker_cls`` placed by a Ray placement group, ranks 0..N-1."""

    def __init__(
        self,
        worker_cls: type[Worker],
        num_workers: int,
        *,
        init_args: tuple = (),
        init_kwargs: dict[str, Any] | None = None,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 0,
        threads_per_worker: int = 1,
        env_vars: dict[str, str] | None = None,
        backend: str | None = None,
    ) -> None:
        self.num_workers = num_workers
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self._placement = placement_group([dict(bundle) for _ in range(num_workers)], strategy="PACK")
        ray.get(self._placement.ready())
        env = {"OMP_NUM_THREADS": str(threads_per_worker), **(env_vars or {})}
        remote_cls = ray.remote(worker_cls)
        self.workers = [
            remote_cls.options(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._placement, placement_group_bundle_index=rank
                ),
                runtime_env={"env_vars": env},
            ).remote(*init_args, **(init_kwargs or {}))
            for rank in range(num_workers)
        ]
        try:
            addresses = ray.get([worker.node_address_and_free_port.remote() for worker in self.workers])
            master_addr, master_port = addresses[0]
            if len({address for address, _ in addresses}) == 1:
                master_addr = "127.0.0.1"  # one node: loopback, since Ray may report an address gloo cannot bind
            ray.get(
                [
                    worker.init_distributed.remote(
                        rank, num_workers, master_addr, master_port, threads_per_worker, backend
                    )
                    for rank, worker in enumerate(self.workers)
                ]
            )
        except Exception:
            self.shutdown()  # release the reserved resources, or the next group would wait for them forever
            raise

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every worker; results in rank order."""
        return ray.get([getattr(worker, method).remote(*args, **kwargs) for worker in self.workers])

    def run_split(self, method: str, batch: Batch, *args: Any, **kwargs: Any) -> Any:
        """Give each worker one equal consecutive chunk of ``batch``; concatenate the returned batches in rank order.

        Results that are not batches (metrics dicts, ...) come back as a list in rank order.
        """
        chunks = batch.chunk(self.num_workers)
        results = ray.get(
            [getattr(worker, method).remote(chunk, *args, **kwargs) for worker, chunk in zip(self.workers, chunks)]
        )
        if all(isinstance(result, Batch) for result in results):
            return Batch.concat(results)
        return results

    def shutdown(self) -> None:
        """Kill the actors and release their resources."""
        for worker in self.workers:
            ray.kill(worker)
        remove_placement_group(self._placement)
