"""Two Ray nodes on this machine, joined as on a real cluster (``ray start --head``, then ``ray start --address``,
with Ray's token authentication as docs/multinode.md sets it up), and a 2-step CLI run with ``trainer.nnodes=2``: one
worker per node, ranks ordered by node, rendezvous on rank 0's node address (not loopback), checkpoint shards written
by both nodes."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import REPO
from test_cli import base_args, run_cli


pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.e2e]

RAY = str(Path(sys.executable).with_name("ray"))
# Each node: one worker, plus room for the reward actor on either node.
CPUS_PER_NODE = 2
PLACEMENT_LINE = re.compile(
    r"^easyr1: (\d+) workers on (\d+) node\(s\), rendezvous ([^:]+):(\d+): (.*)$", re.MULTILINE
)
NODE_PART = re.compile(r"node (\S+) \(([^)]*)\) ranks (\d+)-(\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    """End a ``ray start --block`` and the Ray processes it started (its own process group), politely first."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the head's GCS can outlive the SIGTERM
    except ProcessLookupError:
        pass
    process.wait()


def alive_node_ids(address: str, env: dict[str, str], count: int, timeout: float = 60) -> list[str]:
    """Wait until the cluster at ``address`` has ``count`` live nodes; their ids (asked from a separate process,
    so that this test process keeps no connection to the cluster)."""
    script = (
        "import json, time, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        f"deadline = time.monotonic() + {timeout}\n"
        "while True:\n"
        "    ids = [node['NodeID'] for node in ray.nodes() if node['Alive']]\n"
        f"    if len(ids) >= {count} or time.monotonic() > deadline:\n"
        "        break\n"
        "    time.sleep(0.5)\n"
        "print(json.dumps(ids))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout + 60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@contextmanager
def two_node_cluster(log_dir: Path, token: str) -> Iterator[tuple[str, list[str]]]:
    """``(address, node ids)`` of a head node plus one joined node, each with its own CPUs, asking for ``token``;
    the output of the two ``ray start`` commands goes to ``log_dir``."""
    # A private temp dir keeps this cluster out of /tmp/ray/ray_current_cluster, where a plain ray.init() in
    # another process would find it and join it; short, since Ray's socket paths must fit in 107 characters.
    temp_dir = tempfile.mkdtemp(prefix="r2n", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),  # the nodes' workers import this checkout's easyr1
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    common = [
        "--block",
        f"--num-cpus={CPUS_PER_NODE}",
        f"--object-store-memory={192 * 1024**2}",
        "--disable-usage-stats",
    ]
    processes = []
    head_log, node_log = (log_dir / "ray_head.log").open("w"), (log_dir / "ray_node.log").open("w")
    try:
        head = subprocess.Popen(
            [RAY, "start", "--head", f"--port={free_port()}", f"--temp-dir={temp_dir}", "--include-dashboard=false"]
            + [f"--dashboard-agent-listen-port={free_port()}"]  # not Ray's fixed default: other clusters may use it
            + common,
            env=env,
            stdout=head_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(head)
        address_file = Path(temp_dir) / "ray_current_cluster"
        deadline = time.monotonic() + 90
        while not (address_file.exists() and address_file.read_text().strip()):
            assert head.poll() is None and time.monotonic() < deadline, f"the Ray head did not start: {log_dir}"
            time.sleep(0.5)
        address = address_file.read_text().strip()
        node = subprocess.Popen(
            [RAY, "start", f"--address={address}", f"--dashboard-agent-listen-port={free_port()}"] + common,
            env=env,
            stdout=node_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(node)
        node_ids = alive_node_ids(address, env, count=2)
        assert len(node_ids) == 2, node_ids
        yield address, node_ids
    finally:
        for process in reversed(processes):
            stop(process)
        head_log.close()
        node_log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_node_run(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    token = secrets.token_hex(32)
    with two_node_cluster(tmp_path, token) as (address, node_ids):
        monkeypatch.setenv("RAY_ADDRESS", address)
        # the driver joins with the cluster's token (docs/multinode.md: the same token on every node and the driver's)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
        start = time.monotonic()
        result = run_cli(
            [
                *base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir),
                "trainer.nnodes=2",
                "trainer.n_gpus_per_node=1",
                "trainer.max_steps=2",
                "data.rollout_batch_size=8",
                "worker.actor.global_batch_size=8",
                "worker.rollout.n=4",
                f"trainer.save_checkpoint_path={run_dir}",
            ],
            timeout=400,
        )
        seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-4000:]
    # the workers say where they ran: one on each node of the cluster, ranks in node order
    placement = PLACEMENT_LINE.search(result.stdout)
    assert placement, result.stdout[-3000:]
    print(f"2-node CLI run: {seconds:.1f} s; {placement.group(0)}")
    workers, nodes, master_host, _port, parts = placement.groups()
    assert (workers, nodes) == ("2", "2")
    ranks = [NODE_PART.fullmatch(part.strip()).groups() for part in parts.split(";")]
    assert [(first, last) for _node, _address, first, last in ranks] == [("0", "0"), ("1", "1")]
    placed_on = [node for node, _address, _first, _last in ranks]
    assert sorted(placed_on) == sorted(node_ids)
    rank0_address = ranks[0][1]
    if ranks[0][1] == ranks[1][1]:  # both "nodes" share this machine's address: ordered by node id
        assert placed_on == sorted(placed_on)
    # across nodes the rendezvous is rank 0's node address, which gloo bound and both ranks reached
    assert master_host == rank0_address != "127.0.0.1"

    assert not list(run_dir.glob(".easyr1-shared-*"))  # the shared-directory check cleaned up after itself
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    # every rank wrote its shards into the one checkpoint (a filesystem both "nodes" share, as a cluster's must)
    actor_dir = run_dir / "global_step_2" / "actor"
    assert sorted(path.name for path in actor_dir.glob("extra_state_rank_*.pt")) == [
        "extra_state_rank_0.pt",
        "extra_state_rank_1.pt",
    ]
