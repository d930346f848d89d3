"""Placement of the worker group: rank order by node, cluster checks, rendezvous address and the run's device.

The rules are tested as pure functions first; then a local Ray cluster that claims one GPU (this machine has
none) checks the real thing: layouts the cluster cannot hold fail at once with a clear error, and a worker
given a GPU it cannot see refuses to start.
"""

from __future__ import annotations

import itertools
import os
import time

import pytest
from helpers import demo_config, start_ray
from test_cli import base_args, run_main

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.placement import (
    LOOPBACK,
    ClusterNode,
    check_cluster_fits,
    check_ranks_grouped_by_node,
    describe_placement,
    node_bundle,
    nodes_from_ray,
    rank_order_of_bundles,
    rendezvous_address,
    resolve_device,
)
from easyr1.errors import ConfigError, UserError


# ------------------------------------------------------------------------------------------- pure rules
@pytest.mark.parametrize(
    ("preference", "resources", "expected"),
    [
        ("auto", {"CPU": 64.0, "GPU": 8.0}, "cuda"),
        ("auto", {"CPU": 64.0}, "cpu"),
        ("auto", {"CPU": 64.0, "GPU": 0.0}, "cpu"),
        ("cpu", {"CPU": 64.0, "GPU": 8.0}, "cpu"),
        ("cuda", {"CPU": 64.0}, "cuda"),  # the cluster check then says no node has the GPUs
    ],
)
def test_device_comes_from_the_cluster(preference, resources, expected):
    assert resolve_device(preference, resources) == expected


def test_node_bundle_holds_one_nodes_workers():
    assert node_bundle(8, 1, 1) == {"CPU": 8, "GPU": 8}
    assert node_bundle(2, 1, 0) == {"CPU": 2}
    assert node_bundle(4, 2, 0.5) == {"CPU": 8, "GPU": 2.0}


def gpu_node(name: str, gpus: float, cpus: float = 64) -> ClusterNode:
    return ClusterNode(name * 7, f"10.0.0.{ord(name) - 96}", {"CPU": cpus, "GPU": gpus})


def test_cluster_that_fits_passes():
    check_cluster_fits([gpu_node("a", 8), gpu_node("b", 8)], 2, 8, node_bundle(8, 1, 1))
    check_cluster_fits([gpu_node("a", 8), gpu_node("b", 4)], 1, 8, node_bundle(8, 1, 1))


def test_too_few_nodes_is_a_user_error_naming_the_keys_and_the_cluster():
    with pytest.raises(UserError) as error:
        check_cluster_fits([gpu_node("a", 8)], 2, 8, node_bundle(8, 1, 1))
    message = str(error.value)
    assert "trainer.nnodes=2" in message and "trainer.n_gpus_per_node=8" in message
    assert "node aaaaaaa (10.0.0.1): CPU 64, GPU 8" in message
    assert "only 1 of the Ray cluster's 1 node(s)" in message
    assert "ray start --address" in message


def test_a_node_too_small_is_a_user_error_pointing_at_the_per_node_count():
    # two nodes, but one has 4 GPUs: 2 x 8 does not fit, though the cluster has 12 GPUs in all
    with pytest.raises(UserError) as error:
        check_cluster_fits([gpu_node("a", 8), gpu_node("b", 4)], 2, 8, node_bundle(8, 1, 1))
    message = str(error.value)
    assert "only 1 of the Ray cluster's 2 node(s)" in message
    assert "node bbbbbbb (10.0.0.2): CPU 64, GPU 4" in message
    assert "lower trainer.n_gpus_per_node" in message


def test_nodes_from_ray_keeps_live_nodes():
    records = [
        {"NodeID": "n1", "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}, "Alive": True},
        {"NodeID": "n2", "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 4.0}, "Alive": False},
    ]
    assert nodes_from_ray(records) == [ClusterNode("n1", "10.0.0.1", {"CPU": 4.0})]


def test_bundles_are_ranked_by_node_address_whatever_order_ray_placed_them_in():
    addresses = {"n-x": "10.0.0.10", "n-y": "10.0.0.9", "n-z": "10.0.0.2", "n-h": "gpu-host"}
    # numeric, not text order (10.0.0.9 before 10.0.0.10); host names after addresses
    expected_nodes = ["n-z", "n-y", "n-x", "n-h"]
    for placed in itertools.permutations(expected_nodes):
        bundle_nodes = dict(enumerate(placed))
        order = rank_order_of_bundles(bundle_nodes, addresses)
        assert [bundle_nodes[index] for index in order] == expected_nodes


def test_ranks_on_one_address_are_ordered_by_node_id():
    bundle_nodes = {0: "node-b", 1: "node-a"}
    assert rank_order_of_bundles(bundle_nodes, {"node-a": "10.0.0.1", "node-b": "10.0.0.1"}) == [1, 0]


def test_ranks_must_be_grouped_by_node():
    check_ranks_grouped_by_node(["a", "a", "b", "b"], 2)
    check_ranks_grouped_by_node(["a", "a", "a", "a"], 4)
    with pytest.raises(RuntimeError, match="several nodes"):
        check_ranks_grouped_by_node(["a", "b", "a", "b"], 2)  # a TP group of 2 would straddle the nodes
    with pytest.raises(RuntimeError, match="same node"):
        check_ranks_grouped_by_node(["a", "a", "a", "a"], 2)


def test_rendezvous_is_loopback_on_one_node_and_rank_zeros_address_across_nodes():
    assert rendezvous_address(["a", "a"], "10.0.0.1") == LOOPBACK
    assert rendezvous_address(["a", "a", "b", "b"], "10.0.0.1") == "10.0.0.1"


def test_describe_placement_lists_each_nodes_ranks():
    line = describe_placement(["a", "a", "b", "b"], ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], "10.0.0.1:29500")
    assert line == (
        "4 workers on 2 node(s), rendezvous 10.0.0.1:29500: node a (10.0.0.1) ranks 0-1; node b (10.0.0.2) ranks 2-3"
    )


def test_several_nodes_without_a_cluster_address_is_a_config_error(
    capsys, monkeypatch, tiny_qwen2_5_vl_dir, tiny_dataset_dir
):
    import ray

    if ray.is_initialized():  # a cluster left by another test module would be joined instead
        ray.shutdown()
    capsys.readouterr()  # that cluster's actors' last log lines, flushed at shutdown
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    err = run_main(capsys, [*base_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir), "trainer.nnodes=2"])
    assert "trainer.nnodes=2" in err and "RAY_ADDRESS" in err and "ray start --head" in err
    assert not ray.is_initialized()  # refused before starting a one-node cluster


def test_tensor_parallel_group_must_fit_in_a_node(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    layout = ["trainer.nnodes=2", "data.rollout_batch_size=12", "worker.actor.global_batch_size=12"]
    # 2 x 3 = 6 workers split into TP groups of 2 evenly, yet ranks 2-3 would straddle the nodes
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 does not divide trainer.n_gpus_per_node=3"):
        demo_config(
            tiny_qwen2_5_vl_dir,
            tiny_dataset_dir,
            *layout,
            "trainer.n_gpus_per_node=3",
            "worker.rollout.tensor_parallel_size=2",
        )
    config = demo_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        *layout,
        "trainer.n_gpus_per_node=2",
        "worker.rollout.tensor_parallel_size=2",
    )
    assert config.world_size == 4


# ------------------------------------------------------------------------------- a real (one-node) cluster
CLUSTER_CPUS = 3


@pytest.fixture(scope="module")
def ray_with_a_claimed_gpu():
    """A local Ray node that advertises one GPU this machine does not have."""
    import ray

    start_ray(CLUSTER_CPUS, num_gpus=1)
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_more_nodes_than_the_cluster_has_fails_at_once(ray_with_a_claimed_gpu):
    start = time.monotonic()
    with pytest.raises(UserError) as error:
        WorkerGroup(Worker, 2, nnodes=2)
    assert time.monotonic() - start < 30  # Ray alone would wait for the second node forever
    message = str(error.value)
    assert "trainer.nnodes=2" in message and f"CPU {CLUSTER_CPUS}, GPU 1" in message


@pytest.mark.ray
def test_more_workers_per_node_than_the_node_has_fails_at_once(ray_with_a_claimed_gpu):
    with pytest.raises(UserError) as error:
        WorkerGroup(Worker, CLUSTER_CPUS + 1)
    message = str(error.value)
    assert f"trainer.n_gpus_per_node={CLUSTER_CPUS + 1}" in message and "lower trainer.n_gpus_per_node" in message


@pytest.mark.ray
def test_resources_held_by_someone_else_time_out_with_a_clear_error(ray_with_a_claimed_gpu):
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    ray = ray_with_a_claimed_gpu
    holder = placement_group([{"CPU": CLUSTER_CPUS}])  # another job's reservation: every CPU of the node
    assert holder.wait(30)
    try:
        before = set(placement_group_table())
        with pytest.raises(UserError) as error:
            WorkerGroup(Worker, 1, placement_timeout_s=1)
        message = str(error.value)
        assert "waited 1 s" in message and "CPU 0, GPU 1 free" in message and "trainer.n_gpus_per_node" in message
        # the group's own request was withdrawn, not left queued to grab the CPUs later
        new = [pg for pg_id, pg in placement_group_table().items() if pg_id not in before]
        assert [pg["state"] for pg in new] == ["REMOVED"]
    finally:
        remove_placement_group(holder)
    deadline = time.monotonic() + 30  # removal is asynchronous; the next test needs the CPUs back
    while ray.available_resources().get("CPU", 0) < CLUSTER_CPUS and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.ray
def test_worker_given_a_gpu_it_cannot_see_refuses_then_the_resources_are_free_again(ray_with_a_claimed_gpu):
    ray = ray_with_a_claimed_gpu
    assert resolve_device("auto", ray.cluster_resources()) == "cuda"
    with pytest.raises(UserError) as error:
        WorkerGroup(Worker, 1, gpus_per_worker=1)
    message = str(error.value)
    assert "trainer.device=cuda" in message and "sees no GPU" in message and "trainer.device=cpu" in message

    # the failed group gave its reservation back: a group using every CPU starts
    group = WorkerGroup(Worker, CLUSTER_CPUS)
    try:
        here = ray.get_runtime_context().get_node_id()
        assert group.node_ids == [here] * CLUSTER_CPUS
        assert group.master_address.startswith(f"{LOOPBACK}:")
        ranks = ray.get([worker.__ray_call__.remote(lambda self: self.rank) for worker in group.workers])
        assert ranks == list(range(CLUSTER_CPUS))
        assert f"ranks 0-{CLUSTER_CPUS - 1}" in group.describe()
        # every worker beside the driver: nothing to ask, nothing written
        group.check_shared_directory("/nonexistent/here", "trainer.save_checkpoint_path")
        assert not os.path.exists("/nonexistent")
    finally:
        group.shutdown()
