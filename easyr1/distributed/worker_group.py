"""A group of Ray actors that act as the ranks of one torch process group.

The driver calls worker methods, named by reference (``HybridWorker.generate``), on all workers at once, either
broadcasting the same arguments (:meth:`WorkerGroup.run_all`) or splitting a :class:`~easyr1.protocol.Batch` into
equal consecutive chunks, one per rank (:meth:`WorkerGroup.run_split`), and collects the results in rank order.
Between :meth:`WorkerGroup.open_step` and :meth:`WorkerGroup.finish_step`, split calls send each sample's heavy fields
to a rank once and the rank reuses them (``distributed/sample_cache.py``); every split call's bytes are counted.
A worker that dies is reported as :class:`~easyr1.errors.WorkerLost` (its rank, node and the call) as soon as it is
seen, without waiting for the ranks blocked in a collective with it.
:class:`~easyr1.distributed.local_group.LocalWorkerGroup` has the same surface with one worker in this process.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from easyr1.distributed.placement import (
    check_cluster_fits,
    check_ranks_grouped_by_node,
    describe_placement,
    node_bundle,
    nodes_from_ray,
    placement_timeout_message,
    rank_order_of_bundles,
    rendezvous_address,
)
from easyr1.distributed.sample_cache import SAMPLE_ID, SampleRouter, payload_bytes
from easyr1.distributed.tensor_pickling import install as install_tensor_pickling
from easyr1.distributed.worker import Worker, method_name
from easyr1.errors import UserError, WorkerLost
from easyr1.protocol import Batch


# How long to wait for resources the cluster has but that are taken, before giving up with a clear error.
PLACEMENT_TIMEOUT_S = 300.0
# how long a rank that failed in a collective waits for Ray to report the peer that died (the real error)
PEER_DEATH_WAIT_S = 20.0
# Ray CPUs reserved per worker: its torch threads are set by threads_per_worker; the reservation only places it.
CPUS_PER_WORKER = 1


@dataclass
class Transfer:
    """The bytes one split call moved, and per cached field how many rows it had to send (the rest were reused)."""

    method: str
    bytes_to_workers: int
    bytes_from_workers: int
    rows_sent: dict[str, int] = field(default_factory=dict)


@dataclass
class PendingCall:
    """A call started on ranks of a group and not collected yet (:meth:`WorkerGroup.submit`)."""

    method: str
    refs: list
    ranks: list[int]


class WorkerGroup:
    """``num_workers`` instances of ``worker_cls`` on ``nnodes`` nodes, ranks 0..N-1 ordered by node.

    Each node gets ``num_workers // nnodes`` workers (one node-sized placement bundle per node, spread over
    distinct nodes); the ranks of one node are consecutive. The cluster is checked first: a layout it cannot
    hold is a :class:`UserError` naming ``trainer.nnodes`` / ``trainer.n_gpus_per_node``, not a silent wait.
    """

    def __init__(
        self,
        worker_cls: type[Worker],
        num_workers: int,
        *,
        nnodes: int = 1,
        init_args: tuple = (),
        gpus_per_worker: float = 0,
        threads_per_worker: int = 1,
        backend: str | None = None,
        placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
        cache_sample_tensors: bool = True,
    ) -> None:
        if nnodes < 1 or num_workers % nnodes:
            raise ValueError(f"{num_workers} workers cannot be split evenly over {nnodes} nodes")
        install_tensor_pickling()  # what this driver sends; each worker installs it for its replies
        self.worker_cls = worker_cls
        self.num_workers = num_workers
        self.nnodes = nnodes
        # the per-step record of which rank holds which sample's heavy fields; None: every call sends everything
        self.router = SampleRouter() if cache_sample_tensors else None
        self.step_open = False
        self.bytes_to_workers = self.bytes_from_workers = 0
        self.transfers: list[Transfer] = []  # this step's split calls
        workers_per_node = num_workers // nnodes
        bundle = node_bundle(workers_per_node, CPUS_PER_WORKER, gpus_per_worker)
        nodes = nodes_from_ray(ray.nodes())
        check_cluster_fits(nodes, nnodes, workers_per_node, bundle)
        # one bundle per node, each on its own node (a bundle never spans nodes, so a node's ranks stay together)
        strategy = "STRICT_SPREAD" if nnodes > 1 else "PACK"
        self._placement = placement_group([dict(bundle) for _ in range(nnodes)], strategy=strategy)
        self.workers: list = []
        self.addresses: list[str] = []
        started = time.monotonic()
        if not self._placement.wait(placement_timeout_s):
            available = ray.available_resources()
            remove_placement_group(self._placement)
            raise UserError(
                placement_timeout_message(
                    nnodes, workers_per_node, bundle, available, round(time.monotonic() - started)
                )
            )
        bundle_nodes = placement_group_table(self._placement)["bundles_to_node_id"]
        bundle_order = rank_order_of_bundles(bundle_nodes, {node.node_id: node.address for node in nodes})
        env = {"OMP_NUM_THREADS": str(threads_per_worker)}
        remote_cls = ray.remote(worker_cls)
        self.workers = [
            remote_cls.options(
                num_cpus=CPUS_PER_WORKER,
                num_gpus=gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._placement, placement_group_bundle_index=bundle_order[rank // workers_per_node]
                ),
                runtime_env={"env_vars": env},
            ).remote(*init_args)
            for rank in range(num_workers)
        ]
        try:
            # each worker says where it is and checks that it can use the device it was given
            device = "cuda" if gpus_per_worker else "cpu"
            reports = ray.get([worker.placement_report.remote(device) for worker in self.workers])
            self.node_ids = [report["node_id"] for report in reports]
            self.addresses = [report["address"] for report in reports]
            check_ranks_grouped_by_node(self.node_ids, workers_per_node)
            rank0_address, master_port = ray.get(self.workers[0].node_address_and_free_port.remote())
            master_addr = rendezvous_address(self.node_ids, rank0_address)
            self.master_address = f"{master_addr}:{master_port}"
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

    def describe(self) -> str:
        """One line: which ranks run on which node, and the rendezvous address."""
        return describe_placement(self.node_ids, self.addresses, self.master_address)

    def check_shared_directory(self, directory: str | os.PathLike, key: str) -> None:
        """Raise a :class:`UserError` naming ``key`` unless every node of the group sees ``directory`` as the
        driver does (a file the driver writes there is visible from each node).

        Checkpoints need this: every rank writes its shards into one step directory, and the driver renames it.
        Only nodes other than the driver's are asked; when all the workers run beside the driver, nothing is.
        """
        nodes = sorted(set(self.node_ids) - {ray.get_runtime_context().get_node_id()})
        if not nodes:
            return
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / f".easyr1-shared-{uuid.uuid4().hex}"
        marker.write_text("written by the driver to check that every node sees this directory\n")
        try:
            seen = ray.get(
                [
                    _file_exists.options(
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                    ).remote(str(marker))
                    for node_id in nodes
                ]
            )
        finally:
            marker.unlink(missing_ok=True)
        blind = [node_id for node_id, visible in zip(nodes, seen) if not visible]
        if blind:
            addresses = dict(zip(self.node_ids, self.addresses))
            listing = ", ".join(f"{node_id[:8]} ({addresses[node_id]})" for node_id in blind)
            raise UserError(
                f"{key}={directory} is not the same directory on every node: a file written there by the driver is "
                f"missing on node(s) {listing}. Every rank writes its checkpoint shards there, so with several nodes "
                "it must be a shared filesystem (NFS, Lustre, ...) mounted at the same path on every node"
            )

    def run_all(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` (a method of the worker class) with the same arguments on every worker; results in rank
        order."""
        name = method_name(self.worker_cls, method)
        return self._gather([getattr(worker, name).remote(*args, **kwargs) for worker in self.workers], name)

    def run_split(self, method: Callable[..., Any], batch: Batch, *args: Any, pad: bool = False, **kwargs: Any) -> Any:
        """Give each worker one equal consecutive chunk of ``batch``; concatenate the returned batches in rank order.

        ``method`` is a method of the worker class, called with its chunk and ``args``. ``pad``: a batch whose size is
        not a multiple of the workers gets its first rows repeated up to one, and the results of those rows are
        dropped. Results that are not batches (metrics dicts, ...) come back as a list in rank order. Inside a step
        (see :meth:`open_step`) with the sample cache on and a ``sample_id`` field in ``batch``, each rank gets a
        row's heavy fields only if it does not hold them yet; the method still receives the complete chunk, and
        object fields it returns unchanged are not sent back (the driver's copies take their place).
        """
        name = method_name(self.worker_cls, method)
        size = len(batch)
        if pad and size % self.num_workers:
            batch = Batch.concat([batch, batch.index(list(range(self.num_workers - size % self.num_workers)))])
        if self.router is not None and self.step_open and SAMPLE_ID in batch:
            results, transfer = self._split_cached(name, batch, args, kwargs)
        else:
            results, transfer = self._split_plain(name, batch, args, kwargs)
        transfer.bytes_to_workers += payload_bytes(args, kwargs) * self.num_workers
        self.bytes_to_workers += transfer.bytes_to_workers
        self.bytes_from_workers += transfer.bytes_from_workers
        self.transfers.append(transfer)
        if all(isinstance(result, Batch) for result in results):
            merged = Batch.concat(results)
            return merged.index(slice(0, size)) if len(merged) != size else merged
        return results

    def submit(
        self, method: Callable[..., Any], *args: Any, ranks: list[int] | None = None, **kwargs: Any
    ) -> PendingCall:
        """Start ``method`` with the same arguments on every rank (or on ``ranks``) without waiting; :meth:`collect`
        gives the results. Calls on one rank run in the order they were made, so the group can be handed the next
        call while this one runs, and another group can work meanwhile (the driver overlaps the two groups of a
        split placement this way)."""
        name = method_name(self.worker_cls, method)
        ranks = list(range(self.num_workers)) if ranks is None else list(ranks)
        refs = [getattr(self.workers[rank], name).remote(*args, **kwargs) for rank in ranks]
        return PendingCall(name, refs, ranks)

    def collect(self, pending: PendingCall) -> list[Any]:
        """The results of a :meth:`submit` call, in the order of its ranks (waits for them)."""
        return self._gather(pending.refs, pending.method, pending.ranks)

    def _gather(self, refs: list[ray.ObjectRef], phase: str, ranks: list[int] | None = None) -> list[Any]:
        """The results of one call on every rank (or on ``ranks``, the ranks of ``refs``), in rank order.

        Waits for them one at a time, so that a rank that died is reported at once (:class:`WorkerLost`) rather than
        after the others time out in a collective it will never join; a user error raised by a rank is re-raised as
        it is (one message, no Ray traceback).
        """
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as error:
                raise self._lost(refs, ready[0], error, phase, ranks) from None
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, UserError):
                    raise error.cause from None
                # A rank whose peer died fails in the collective they shared (gloo: "Connection reset by peer"),
                # often before Ray reports the death: the dead rank is the news, so wait briefly for it.
                dead = self._first_dead(refs, pending)
                if dead is not None:
                    raise self._lost(refs, *dead, phase, ranks) from None
                raise
        return ray.get(refs)

    def _first_dead(
        self, refs: list[ray.ObjectRef], pending: list[ray.ObjectRef], timeout: float = PEER_DEATH_WAIT_S
    ) -> tuple[ray.ObjectRef, BaseException] | None:
        """The first call among ``pending`` whose rank died (with Ray's error), waiting up to ``timeout`` for them to
        settle; ``None`` when none did."""
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout) if pending else ([], [])
        for ref in sorted(ready, key=refs.index):
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as error:
                return ref, error
            except Exception:  # another rank's own failure: not a death
                continue
        return None

    def _lost(
        self, refs: list[ray.ObjectRef], ref: ray.ObjectRef, error: BaseException, phase: str, ranks: list[int] | None
    ) -> WorkerLost:
        """The :class:`WorkerLost` for the rank of ``ref``, which died during ``phase``."""
        rank = refs.index(ref)
        rank = ranks[rank] if ranks is not None else rank
        node = self.addresses[rank] if rank < len(self.addresses) else "?"
        return WorkerLost(rank, node, f"{self.worker_cls.__name__}.{phase}", type(error).__name__)

    def _split_plain(self, method: str, batch: Batch, args: tuple, kwargs: dict) -> tuple[list[Any], Transfer]:
        """Every rank gets its whole chunk (a slice; only its own rows travel, see ``tensor_pickling``)."""
        chunks = batch.chunk(self.num_workers)
        results = self._gather(
            [getattr(worker, method).remote(chunk, *args, **kwargs) for worker, chunk in zip(self.workers, chunks)],
            method,
        )
        sent = sum(payload_bytes(chunk) for chunk in chunks)
        return results, Transfer(method, sent, sum(payload_bytes(result) for result in results))

    def _split_cached(self, method: str, batch: Batch, args: tuple, kwargs: dict) -> tuple[list[Any], Transfer]:
        """Every rank gets its chunk's light fields and the heavy fields of the rows it does not hold yet."""
        deliveries = self.router.deliveries(batch, self.num_workers)
        replies = self._gather(
            [
                worker.run_with_sample_cache.remote(method, delivery, *args, **kwargs)
                for worker, delivery in zip(self.workers, deliveries)
            ],
            method,
        )
        rows_sent = {
            name: sum(len(delivery.sent[name][0]) for delivery in deliveries if name in delivery.sent)
            for name in deliveries[0].fields
        }
        transfer = Transfer(
            method,
            sum(payload_bytes(delivery) for delivery in deliveries),
            sum(payload_bytes(reply) for reply in replies),
            rows_sent,
        )
        size = len(batch) // self.num_workers
        results = []
        for rank, (result, echoed) in enumerate(replies):
            for name in echoed:  # the driver's own copy of what the worker passed through
                result[name] = batch[name][rank * size : (rank + 1) * size]
            results.append(result)
        return results, transfer

    def open_step(self) -> None:
        """Start a training step: clear the sample caches (driver record and workers; the workers only if something
        was sent since the last clear) and the byte counts."""
        self._clear_sample_caches()
        self.step_open = True
        self.bytes_to_workers = self.bytes_from_workers = 0
        self.transfers = []

    def finish_step(self) -> dict[str, float]:
        """End a training step: clear the sample caches (so that validation and the next step start empty); returns
        the step's ``perf/bytes_to_workers`` and ``perf/bytes_from_workers`` (split calls only)."""
        self._clear_sample_caches()
        self.step_open = False
        return {
            "perf/bytes_to_workers": float(self.bytes_to_workers),
            "perf/bytes_from_workers": float(self.bytes_from_workers),
        }

    def _clear_sample_caches(self) -> None:
        # A worker's cache holds only what the router recorded sending it: with no record (a step opening right after
        # the last one closed) there is nothing to clear, and the round trip to every worker is saved.
        if self.router is not None and self.router.holders:
            self.router.reset()
            self.run_all(Worker.clear_sample_cache)

    def shutdown(self) -> None:
        """Kill the actors and release their resources."""
        for worker in self.workers:
            ray.kill(worker)
        remove_placement_group(self._placement)


def collect_together(calls: list[tuple[WorkerGroup, PendingCall]]) -> list[list[Any]]:
    """The results of calls submitted to several groups that wait on each other (a weight push: trainer rank 0
    sends while the generators receive), each group's in rank order. Every rank of every call is watched at once,
    so a rank that dies is reported (:class:`WorkerLost`) while the others are still blocked waiting for it."""
    owner = {ref: (group, call, rank) for group, call in calls for ref, rank in zip(call.refs, call.ranks)}
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        group, call, rank = owner[ready[0]]
        group._gather(ready, call.method, [rank])  # raises for a lost rank or an error
    return [group.collect(call) for group, call in calls]


@ray.remote(num_cpus=0)
def _file_exists(path: str) -> bool:
    """Whether ``path`` exists on the node this task runs on."""
    return os.path.exists(path)
