"""Base class of every Ray worker: one rank of a torch process group.

A worker learns its rank, the world size and the rendezvous address from the :class:`WorkerGroup`
and joins the process group (gloo on CPU; on GPU nccl for device tensors plus gloo for host tensors). When every
rank is on one node the group's sockets listen on loopback only (:func:`rendezvous_store`, :func:`bind_to_loopback`).
Subclasses add the actual work. Nothing here imports Ray at module level, so a worker can also be driven
in-process without it (:class:`~easyr1.distributed.local_group.LocalWorkerGroup`).

The driver names the worker methods it calls by reference (``group.run_split(HybridWorker.generate, batch, ...)``):
a reader and an IDE follow the call into the worker, and :func:`method_name` refuses anything that is not one of the
worker class's own methods before a call is made.
"""

import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from easyr1.distributed.sample_cache import SampleCache, SampleDelivery, unchanged_objects, without
from easyr1.distributed.tensor_pickling import install as install_tensor_pickling


def device_type(preference: str = "auto") -> str:
    """``cuda`` or ``cpu``: ``auto`` picks CUDA when it is usable (``trainer.device``)."""
    if preference == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return preference


# On GPU the group serves both kinds of tensor: model collectives (FSDP, gradient norms) on the device through
# nccl, and the small counts the workers agree on (loss normalisers, micro-batch counts) on the host through gloo.
GPU_BACKEND = "cpu:gloo,cuda:nccl"


def pick_backend(device: str = "auto") -> str:
    """The collective backend for a device: gloo for CPU; for CUDA nccl on device tensors and gloo on host ones."""
    return GPU_BACKEND if device_type(device) == "cuda" else "gloo"


def uses_cuda(backend: str) -> bool:
    """Whether a backend string (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``) puts collectives on CUDA devices."""
    return "nccl" in backend


# What a one-node group's collectives listen on: gloo's connections (and vLLM's gloo groups), NCCL's bootstrap and
# socket transport. An exported value wins (docs/multinode.md tells multi-node users to set these).
SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
IFF_LOOPBACK = 0x8  # linux/if.h: the interface flag /sys/class/net/<name>/flags carries for a loopback interface


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) names this machine's loopback."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def loopback_interface() -> str:
    """The name of this machine's loopback network interface (``lo`` on Linux)."""
    interfaces = Path("/sys/class/net")
    for name in sorted(os.listdir(interfaces)) if interfaces.is_dir() else []:
        try:
            flags = int((interfaces / name / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & IFF_LOOPBACK:
            return name
    return "lo"


def bind_to_loopback() -> None:
    """Make gloo's and NCCL's sockets in this process listen on the loopback interface (one node: every peer is
    here), unless the interface was chosen by an exported ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``."""
    interface = loopback_interface()
    for variable in SOCKET_INTERFACE_VARIABLES:
        os.environ.setdefault(variable, interface)


def rendezvous_store(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout: timedelta
) -> dist.TCPStore:
    """The group's TCP store (torch's rendezvous), served by rank 0 at ``master_addr:master_port``.

    torch's own ``tcp://`` rendezvous makes rank 0's store listen on every interface whatever ``MASTER_ADDR`` is;
    with a loopback ``master_addr`` (one node) rank 0 binds the listening socket to it itself and hands it to the
    store (``master_listen_fd``), so the store cannot be reached from another machine.
    """
    if rank != 0:
        return dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    if not is_loopback(master_addr):
        return dist.TCPStore(master_addr, master_port, world_size, is_master=True, timeout=timeout)
    listener = socket.socket(socket.AF_INET6 if ":" in master_addr else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((master_addr, master_port))
        listener.listen(world_size + 16)
    except OSError:
        listener.close()
        raise
    # the store owns the socket from here on (it closes it when it is destroyed)
    return dist.TCPStore(
        master_addr,
        master_port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )


def method_name(worker_cls: type, method: Callable[..., Any]) -> str:
    """The name of ``method``, a method of ``worker_cls`` passed by reference (``HybridWorker.generate``).

    Raises:
        TypeError: for a string, or a function that is not ``worker_cls``'s own attribute of that name.
    """
    name = getattr(method, "__name__", None)
    # defined by the class or one of its bases (a subclass's override is then what runs, as in a plain call)
    if not callable(method) or not any(vars(klass).get(name) is method for klass in worker_cls.__mro__):
        raise TypeError(
            f"{method!r} is not a method of {worker_cls.__name__}: pass the method itself, e.g. "
            f"{worker_cls.__name__}.{name if isinstance(name, str) else 'generate'}"
        )
    return name


class Worker:
    """One rank of a process group, in its own Ray actor process or (one rank) in the driver's."""

    rank: int = 0
    world_size: int = 1

    def node_address_and_free_port(self) -> tuple[str, int]:
        """This process's node address and a TCP port that was free a moment ago (for rank 0's rendezvous)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_distributed(
        self, rank: int, world_size: int, master_addr: str, master_port: int, num_threads: int, backend: str | None
    ) -> None:
        """Set the rank environment, the thread count, and join the process group; tensors this worker sends
        through Ray from now on are pickled compactly (``tensor_pickling``)."""
        # "Triton not available", once per worker on CPU: nothing here uses Triton
        logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
        install_tensor_pickling()
        self.rank, self.world_size = rank, world_size
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own device set, so the local device is always the first
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            OMP_NUM_THREADS=str(num_threads),
        )
        torch.set_num_threads(num_threads)
        backend = backend or pick_backend()
        if uses_cuda(backend):
            torch.cuda.set_device(0)
        if is_loopback(master_addr):
            bind_to_loopback()
        timeout = timedelta(minutes=30)
        dist.init_process_group(
            backend=backend,
            store=rendezvous_store(rank, world_size, master_addr, master_port, timeout),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )

    def close(self) -> None:
        """Leave the process group (called when the worker lives in the driver's process and the run ends)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def run_with_sample_cache(
        self, method: str, delivery: SampleDelivery, *args: Any, **kwargs: Any
    ) -> tuple[Any, list[str]]:
        """Call ``method`` on the complete batch of ``delivery`` (heavy fields filled from this step's cache).

        Returns the result without the object fields it passes through unchanged (the driver has them), and their
        names, so the driver can put its own copies back.
        """
        batch = self.sample_cache.complete(delivery, method)
        result = getattr(self, method)(batch, *args, **kwargs)
        echoed = unchanged_objects(batch, result)
        return (without(result, echoed) if echoed else result), echoed

    def clear_sample_cache(self) -> int:
        """Forget this step's cached sample fields; returns how many (sample, field) entries there were."""
        entries = len(self.sample_cache)
        self.sample_cache.clear()
        return entries

    @property
    def sample_cache(self) -> SampleCache:
        """This rank's per-step cache of sample fields (created on first use)."""
        cache = self.__dict__.get("_sample_cache")
        if cache is None:
            cache = self.__dict__["_sample_cache"] = SampleCache(self.rank)
        return cache

    def placement_report(self, device: str) -> dict[str, str | int]:
        """Where this worker runs (Ray node id and address, host name) and how many GPUs it sees.

        Raises a :class:`~easyr1.errors.UserError` when ``device`` is ``cuda`` and no GPU is visible here (a
        node that advertises GPUs to Ray without a usable driver, say), before any model is loaded.
        """
        import ray

        from easyr1.errors import UserError

        node_id = ray.get_runtime_context().get_node_id()
        address = ray.util.get_node_ip_address()
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        if device == "cuda" and gpus == 0:
            raise UserError(
                f"trainer.device=cuda, but the worker on node {node_id[:8]} ({address}, host {socket.gethostname()}) "
                f"sees no GPU (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda}): start that node's Ray with working GPUs, "
                "or set trainer.device=cpu"
            )
        return {"node_id": node_id, "address": address, "hostname": socket.gethostname(), "gpus": gpus}
