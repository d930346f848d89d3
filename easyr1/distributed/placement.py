"""Where a worker group runs: pure decisions made from what the Ray cluster reports.

A :class:`~easyr1.distributed.worker_group.WorkerGroup` of ``nnodes * workers_per_node`` ranks reserves one
node-sized bundle per node (``STRICT_SPREAD`` when there are several nodes, so each bundle gets its own node),
orders the bundles by node address so that ranks ``[k * workers_per_node, (k + 1) * workers_per_node)`` all
live on node ``k`` (a tensor-parallel group of consecutive ranks never straddles two nodes), and picks the
rendezvous address of rank 0. The device of the whole run is decided here too, from the cluster's resources
rather than from whatever the driver process happens to see.

Nothing here talks to Ray, so every rule is testable without a cluster.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from easyr1.errors import UserError


# One node: the loopback address always binds, where the address Ray reports for the node may not.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClusterNode:
    """One live node of the Ray cluster: its id, its address and its total resources."""

    node_id: str
    address: str
    resources: Mapping[str, float]


def nodes_from_ray(ray_nodes: Sequence[Mapping]) -> list[ClusterNode]:
    """The live nodes in the records ``ray.nodes()`` returns."""
    return [
        ClusterNode(node["NodeID"], node["NodeManagerAddress"], dict(node["Resources"]))
        for node in ray_nodes
        if node.get("Alive", False)
    ]


def resolve_device(preference: str, cluster_resources: Mapping[str, float]) -> str:
    """The device of the run (``trainer.device``): ``auto`` means ``cuda`` when the Ray cluster has GPUs, else
    ``cpu``. The cluster decides, not the driver: the driver may run on a head node without a GPU."""
    if preference != "auto":
        return preference
    return "cuda" if cluster_resources.get("GPU", 0) > 0 else "cpu"


def node_bundle(workers_per_node: int, cpus_per_worker: float, gpus_per_worker: float) -> dict[str, float]:
    """The resources one node must give: ``workers_per_node`` workers' worth of CPUs (and GPUs)."""
    bundle = {"CPU": workers_per_node * cpus_per_worker}
    if gpus_per_worker:
        bundle["GPU"] = workers_per_node * gpus_per_worker
    return bundle


def format_resources(resources: Mapping[str, float], keys: Sequence[str] = ("CPU", "GPU")) -> str:
    """``CPU 8, GPU 4``: the resources that matter for placement, in a stable order."""
    return ", ".join(f"{key} {resources.get(key, 0):g}" for key in keys)


def _layout(nnodes: int, workers_per_node: int) -> str:
    return f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={workers_per_node}"


def check_cluster_fits(
    nodes: Sequence[ClusterNode], nnodes: int, workers_per_node: int, bundle: Mapping[str, float]
) -> None:
    """Raise a :class:`UserError` unless ``nnodes`` distinct nodes each have ``bundle`` in total resources.

    Checked before the placement group is requested: Ray would otherwise wait forever for resources that do
    not exist. The message names the config keys and lists every node's resources.
    """
    fitting = [node for node in nodes if all(node.resources.get(key, 0) >= need for key, need in bundle.items())]
    if len(fitting) >= nnodes:
        return
    listing = "; ".join(
        f"node {node.node_id[:8]} ({node.address}): {format_resources(node.resources)}" for node in nodes
    )
    hint = (
        "start more nodes and join them with `ray start --address=HEAD:6379` (docs/multinode.md), "
        "or lower trainer.nnodes"
        if len(nodes) < nnodes
        else "lower trainer.n_gpus_per_node to what each node has, or start the nodes with more resources"
    )
    raise UserError(
        f"{_layout(nnodes, workers_per_node)} needs {nnodes} node(s) with {format_resources(bundle)} each, "
        f"but only {len(fitting)} of the Ray cluster's {len(nodes)} node(s) have that: {listing or 'no live nodes'}. "
        f"{hint}"
    )


def placement_timeout_message(
    nnodes: int, workers_per_node: int, bundle: Mapping[str, float], available: Mapping[str, float], waited_s: float
) -> str:
    """The error when the cluster has the resources in total but they stayed taken (by other jobs or actors)."""
    return (
        f"{_layout(nnodes, workers_per_node)}: waited {waited_s:g} s for {nnodes} node(s) with "
        f"{format_resources(bundle)} free each; the Ray cluster has {format_resources(available)} free in all. "
        "Another job or actor holds the resources: stop it, or lower trainer.nnodes / trainer.n_gpus_per_node"
    )


def _address_key(address: str) -> tuple:
    """Numeric order for IP addresses (10.0.0.9 before 10.0.0.10), host names after them."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return (1, 0, address)
    return (0, parsed.version, int(parsed))


def rank_order_of_bundles(bundle_nodes: Mapping[int, str], node_addresses: Mapping[str, str]) -> list[int]:
    """The bundle indices in rank order: by the address of the node each bundle was placed on, then node id.

    ``bundle_nodes`` maps bundle index -> node id (Ray's ``placement_group_table(pg)["bundles_to_node_id"]``),
    ``node_addresses`` node id -> address. The order is the same whichever order Ray placed the bundles in.
    """

    def key(index: int) -> tuple:
        node_id = bundle_nodes[index]
        return _address_key(node_addresses.get(node_id, "")), node_id

    return sorted(bundle_nodes, key=key)


def check_ranks_grouped_by_node(node_id_of_rank: Sequence[str], workers_per_node: int) -> None:
    """Raise ``RuntimeError`` unless each run of ``workers_per_node`` consecutive ranks shares one node and
    different runs are on different nodes (what the placement promises; checked against where the workers are)."""
    runs = [
        node_id_of_rank[start : start + workers_per_node] for start in range(0, len(node_id_of_rank), workers_per_node)
    ]
    for index, run in enumerate(runs):
        if len(set(run)) != 1:
            raise RuntimeError(f"ranks of node slot {index} were placed on several nodes: {list(run)}")
    firsts = [run[0] for run in runs]
    if len(set(firsts)) != len(firsts):
        raise RuntimeError(f"two node slots were placed on the same node: {firsts}")


def rendezvous_address(node_id_of_rank: Sequence[str], rank0_address: str) -> str:
    """``MASTER_ADDR``: loopback when every rank is on one node, else the address of rank 0's node."""
    return LOOPBACK if len(set(node_id_of_rank)) == 1 else rank0_address


def describe_placement(node_id_of_rank: Sequence[str], address_of_rank: Sequence[str], master: str) -> str:
    """One line saying which ranks run on which node, e.g. for the driver's log::

    2 workers on 2 nodes, rendezvous 10.0.0.1:29500: node <id> (10.0.0.1) ranks 0-0; node <id> (10.0.0.2) ranks 1-1
    """
    parts, start = [], 0
    for rank in range(1, len(node_id_of_rank) + 1):
        if rank == len(node_id_of_rank) or node_id_of_rank[rank] != node_id_of_rank[start]:
            parts.append(f"node {node_id_of_rank[start]} ({address_of_rank[start]}) ranks {start}-{rank - 1}")
            start = rank
    nodes = len(set(node_id_of_rank))
    return f"{len(node_id_of_rank)} workers on {nodes} node(s), rendezvous {master}: " + "; ".join(parts)
