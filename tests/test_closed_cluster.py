"""A single-node job's processes accept no connection from another machine: while two workers hold a process group
on the tests' local Ray cluster (started as ``easyr1.main.init_ray`` starts one), every listening TCP socket of the
driver, GCS, the raylet, its agents and the workers is bound to loopback, or else is a Ray server that refuses a call
without the cluster's token; and Ray's servers ask for the token even on loopback. The cluster runs neither Ray's
autoscaler monitor nor its log monitor, and what a worker prints reaches the driver all the same."""

from __future__ import annotations

import ipaddress
import os
import time
import urllib.error
import urllib.request

import grpc
import psutil
import pytest
import torch
import torch.distributed as dist
from helpers import start_ray

from easyr1.distributed import Worker, WorkerGroup


pytestmark = pytest.mark.ray

# One call of each of Ray's gRPC services (GCS, raylet, object manager, core worker: the driver's and each worker's);
# a server answers the ones it does not serve with UNIMPLEMENTED
RAY_CALLS = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
)


class Rank(Worker):
    """A rank of the group: its process id, and a collective (gloo's connections between the ranks in use)."""

    def pid(self) -> int:
        return os.getpid()

    def say(self, text: str) -> None:
        print(text, flush=True)

    def all_reduce(self) -> float:
        total = torch.ones(1)
        dist.all_reduce(total)
        return float(total)


@pytest.fixture(scope="module")
def group():
    start_ray()
    workers = WorkerGroup(Rank, 1)
    yield workers
    workers.shutdown()


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1, a v4 address on a dual-stack socket
        ip = ip.ipv4_mapped
    return ip.is_loopback


def listening_sockets(processes: list[psutil.Process]) -> list[tuple[str, int, str, int]]:
    """(process name, pid, address, port) of every listening TCP socket of ``processes``."""
    found = []
    for process in processes:
        try:
            name = process.name()
            connections = process.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found += [(name, process.pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


def reachable_at(address: str) -> str:
    """The host to connect to for a socket listening on ``address`` (every interface: loopback will do)."""
    if address in ("::", "0.0.0.0"):
        return "127.0.0.1"
    return f"[{address}]" if ":" in address else address


def speaks_grpc(port: int, host: str = "127.0.0.1") -> bool:
    """Whether the server on ``host:port`` completes gRPC's handshake (gloo's and torch's store's listeners accept
    the connection but never answer it)."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
            return True
        except grpc.FutureTimeoutError:
            return False


def ray_call_results(port: int, token: str | None, host: str = "127.0.0.1") -> set[str]:
    """The status of each of Ray's calls (an empty request) on ``host:port``, with or without the token."""
    metadata = [("authorization", f"Bearer {token}")] if token else None
    results = set()
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        for method in RAY_CALLS:
            call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
            try:
                call(b"", timeout=10, metadata=metadata)
                results.add("OK")
            except grpc.RpcError as error:
                results.add(error.code().name)
    return results


def refuses_without_token(address: str, port: int) -> bool:
    """Whether the socket on ``address:port`` is one of Ray's servers that refuses a caller without the cluster's
    token: a gRPC server (Ray's calls are UNAUTHENTICATED) or the runtime-env agent's HTTP server (401)."""
    host = reachable_at(address)
    if speaks_grpc(port, host):
        results = ray_call_results(port, None, host)
        return "UNAUTHENTICATED" in results and "OK" not in results
    try:
        urllib.request.urlopen(f"http://{host}:{port}/", timeout=5)
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return False
    return False


def test_nothing_of_a_single_node_job_listens_beyond_loopback(group):
    assert group.run_all(Rank.all_reduce) == [1.0]  # the group is up: its store and gloo listen
    driver = psutil.Process()
    processes = [driver, *driver.children(recursive=True)]
    sockets = listening_sockets(processes)
    owners = {name for name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= owners, sockets
    worker_pids = group.run_all(Rank.pid)
    assert set(worker_pids) <= {pid for _, pid, *_ in sockets}, (worker_pids, sockets)
    assert driver.pid in {pid for _, pid, *_ in sockets}, sockets

    exposed = [entry for entry in sockets if not is_loopback(entry[2])]
    open_to_all = [entry for entry in exposed if not refuses_without_token(entry[2], entry[3])]
    assert open_to_all == [], f"reachable from the network without Ray's token: {open_to_all}"
    assert exposed == [], f"listening beyond loopback (each asks for Ray's token): {exposed}"


def test_ray_servers_ask_for_the_token_even_on_loopback(group):
    token = os.environ.get("RAY_AUTH_TOKEN")
    assert token, "the local cluster runs with a token of this process (easyr1.main.closed_local_cluster)"
    driver = psutil.Process()
    ray_processes = [p for p in driver.children(recursive=True) if p.name() in ("gcs_server", "raylet")]
    workers = [psutil.Process(pid) for pid in group.run_all(Rank.pid)]
    for process in [driver, *ray_processes, *workers]:
        servers = [entry for entry in listening_sockets([process]) if speaks_grpc(entry[3])]
        assert servers, f"no gRPC server in {process.name()} ({process.pid})"
        for name, _, address, port in servers:
            without = ray_call_results(port, token=None)
            assert "UNAUTHENTICATED" in without and "OK" not in without, (name, address, port, without)
            # the same call with the token is served: the refusal is the token's doing
            assert "OK" in ray_call_results(port, token), (name, address, port)


def test_no_monitor_process_runs_and_the_driver_prints_what_a_worker_prints(group, capsys):
    [pid] = group.run_all(Rank.pid)
    commands = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
    assert any("raylet" in command for command in commands), commands  # the listing sees the cluster's processes
    monitors = [c for c in commands if "log_monitor.py" in c or "autoscaler/_private/monitor.py" in c]
    assert monitors == []
    group.run_all(Rank.say, "a line the driver prints")
    expected = f"(Rank pid={pid}) a line the driver prints\n"
    printed = ""
    deadline = time.monotonic() + 20
    while expected not in printed and time.monotonic() < deadline:
        time.sleep(0.1)
        printed += capsys.readouterr().out
    assert expected in printed
