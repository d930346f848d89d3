"""Command line entry point: ``python -m easyr1.main config=FILE.yaml key=value ...`` (``--help`` lists every key).

Loads the typed config (defaults < YAML < dot-list overrides), checks it against the model and the memory plan,
starts Ray (not with ``trainer.single_process``), builds the run's parts (:func:`easyr1.build.build_trainer`: the data
and reward files are checked there, before any model loads) and trains. User errors are printed as one clear message
with exit code 2, without a traceback; a worker that dies stops the run with exit code 1 and says which checkpoint to
resume from, and how.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import secrets
import shlex
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from easyr1.errors import UserError, WorkerLost


if TYPE_CHECKING:
    from easyr1.distributed.worker_logs import WorkerLogForwarder

# the tasks whose events GCS keeps (Ray's default: 100,000); they serve Ray's state API and dashboard, which the
# cluster init_ray starts does not run
TASK_EVENTS_KEPT = 1000


def local_cluster_settings(timeline: bool = False) -> dict[str, object]:
    """Ray system settings for a cluster this process starts itself (a cluster started with ``ray start`` keeps
    its own); ``timeline``: the run writes Ray's timeline (``trainer.ray_timeline``), so every task's events are
    kept."""
    # Ray would start one worker process per logical CPU, ready for tasks; this trainer's work runs in actors,
    # each started on demand, so those sit idle (~80 MB resident each)
    settings: dict[str, object] = {"prestart_worker_first_driver": False}
    # GCS keeps every task's events, ~3.4 KB each, and a step makes a few tasks per worker: at Ray's default a run's
    # GCS grew by ~17 KB a step for its first 20,000 steps or so (1 worker). An exported
    # RAY_task_events_max_num_task_in_gcs (a dashboard started by hand, say) keeps more.
    if "RAY_task_events_max_num_task_in_gcs" not in os.environ and not timeline:
        settings["task_events_max_num_task_in_gcs"] = TASK_EVENTS_KEPT
    return settings


# The address a cluster init_ray starts gives its node: Ray then binds every server of the node to it.
LOOPBACK = "127.0.0.1"
# Ray's notice that it turned token authentication on, which tells how to turn it off: here it is always on
_RAY_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


@contextmanager
def closed_local_cluster() -> Iterator[None]:
    """Around a ``ray.init`` that starts a cluster of this machine alone (``tests/helpers.start_ray`` too).

    The cluster's only client is this process, so nothing of it needs to be reachable from elsewhere:

    - its node's address is 127.0.0.1, and Ray 2.60 then binds every server of the node to loopback: GCS, the
      raylet and its object manager, the core-worker server of the driver and of each worker, the runtime-env agent
      (with an address reachable from the network, all but the last listen on every interface);
    - Ray's token authentication stays on (Ray's default for a new cluster; an exported ``RAY_AUTH_MODE=disabled``
      is overridden), so even on loopback a call without the token is refused. The token is made for this process
      and kept in its environment (``RAY_AUTH_TOKEN``), which Ray's processes inherit, unless one is exported
      (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``); nothing is written to ``~/.ray``.

    Nor does it start Ray's autoscaler monitor or log monitor (:func:`without_node_monitors`): the driver prints
    the workers' output itself (:mod:`easyr1.distributed.worker_logs`).

    docs/security.md lists what listens and where.
    """
    from ray._private import ray_constants

    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        # Ray turns token mode on for a new local cluster when the variable is unset, and re-reads its own config
        # as it does so; a mode set in the environment is read once, when Ray is imported
        os.environ.pop("RAY_AUTH_MODE", None)
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # 256 bits, as Ray's own generator makes them
    notice = logging.getLogger(_RAY_AUTH_NOTICE_LOGGER)
    notice_level = notice.level
    notice.setLevel(logging.ERROR)
    # Ray gives a node loopback as its address only where it runs without clusters (ray_constants says where: macOS
    # and Windows by default); elsewhere ray.init replaces 127.0.0.1 with the machine's routable address
    clusters = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with without_node_monitors() as started:
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = clusters
        notice.setLevel(notice_level)
    import ray

    if ray.is_initialized() and started.nodes:
        forward_worker_logs(ray._private.worker._global_node.get_logs_dir_path())
    if ray.is_initialized() and ray.util.get_node_ip_address() != LOOPBACK:
        print(
            f"easyr1: notice: the local Ray cluster's node address is {ray.util.get_node_ip_address()}, not "
            f"{LOOPBACK}: its servers listen on every interface (each asks for the cluster's token)",
            file=sys.stderr,
        )


@dataclass
class StartedNodes:
    """How many nodes a ``ray.init`` inside :func:`without_node_monitors` started (0: it joined a cluster)."""

    nodes: int = 0


@contextmanager
def without_node_monitors() -> Iterator[StartedNodes]:
    """A node that ``ray.init`` starts inside starts neither Ray's autoscaler monitor nor its log monitor, two Python
    processes of ~90 MB each (``ray start``'s ``--no-monitor`` and ``--include-log-monitor=false``, which
    ``ray.init`` does not take). A cluster of this machine alone, started for this process, has nothing to autoscale,
    and its driver reads the workers' log files itself (:func:`forward_worker_logs`). A Ray whose ``RayParams``
    lacks either setting starts its node as usual, monitors included."""
    from ray._private import parameter

    started = StartedNodes()
    ray_params = parameter.RayParams
    if not {"no_monitor", "include_log_monitor"} <= set(inspect.signature(ray_params).parameters):
        yield started
        return

    class NodeWithoutMonitors(ray_params):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "no_monitor": True, "include_log_monitor": False})
            started.nodes += 1

    parameter.RayParams = NodeWithoutMonitors  # ray.init looks it up there when it starts a node
    try:
        yield started
    finally:
        parameter.RayParams = ray_params


_log_forwarder: WorkerLogForwarder | None = None


def forward_worker_logs(logs_dir: str) -> None:
    """Print the workers' output of the node whose logs are in ``logs_dir`` from now on, until this process exits
    (then what is left of it: a worker's last lines); a forwarder of an earlier cluster of this process stops."""
    global _log_forwarder
    from easyr1.distributed.worker_logs import WorkerLogForwarder

    if _log_forwarder is not None:
        _log_forwarder.stop()
    else:
        # registered after the first ray.init's own exit handler, so it runs before that ray.shutdown stops the
        # workers; their files stay, so what a later cluster's workers wrote is read either way
        atexit.register(stop_forwarding_worker_logs)
    _log_forwarder = WorkerLogForwarder(logs_dir).start()


def stop_forwarding_worker_logs() -> None:
    """Print the workers' last output and stop forwarding (at this process's exit)."""
    global _log_forwarder
    if _log_forwarder is not None:
        _log_forwarder.stop()
        _log_forwarder = None


def worker_environment() -> dict[str, str]:
    """The environment the workers run in: quiet libraries (an exported value wins)."""
    return {
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error"),
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
        # torch's C++ warnings (the CPU NUMA-binding notice, once per worker)
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }


def init_ray(num_workers: int, nnodes: int = 1, timeline: bool = False) -> None:
    """Start (or join, when ``RAY_ADDRESS`` is set) a Ray cluster with quiet, CPU-friendly settings; a cluster it
    starts listens on loopback only and asks for a token (:func:`closed_local_cluster`).

    Several nodes need a cluster started beforehand (``ray start``, docs/multinode.md): without ``RAY_ADDRESS``
    this is a :class:`ConfigError`, before Ray starts a one-node cluster that could never hold the workers.
    """
    import ray

    from easyr1.errors import ConfigError

    if ray.is_initialized():
        return
    if nnodes > 1 and not os.environ.get("RAY_ADDRESS"):
        raise ConfigError(
            f"trainer.nnodes={nnodes} needs a Ray cluster of {nnodes} nodes: start one with `ray start --head` on "
            "the first node and `ray start --address=HEAD:6379` on the others, then run with RAY_ADDRESS=HEAD:6379 "
            "(docs/multinode.md); or set trainer.nnodes=1"
        )
    env_vars = worker_environment()
    if os.environ.get("RAY_ADDRESS"):
        # the cluster's nodes bring their own resources (and its authentication: the driver's RAY_AUTH_MODE and
        # token must match the cluster's, docs/multinode.md); only the workers' environment is passed along
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env_vars}, logging_level="WARNING")
        return
    import torch

    on_gpu = torch.cuda.is_available()
    with closed_local_cluster():
        ray.init(
            # Logical CPUs: one per worker plus one for the reward actor, even on a 2-core machine.
            num_cpus=max(os.cpu_count() or 1, num_workers + 1),
            object_store_memory=None if on_gpu else 512 * 1024**2,
            include_dashboard=False,
            runtime_env={"env_vars": env_vars},
            logging_level="WARNING",
            _system_config=local_cluster_settings(timeline),
        )


def read_model_config(model: Any) -> dict:
    """The model's ``config.json`` as a dict, read as the workers will read it (``trust_remote_code``); no weights."""
    from easyr1.errors import ConfigError
    from easyr1.models.loading import load_model_config

    try:
        return load_model_config(model.model_path, model.trust_remote_code).to_dict()
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"worker.actor.model.model_path={model.model_path!r}: cannot read the model's config.json ({error}); "
            "point it at a local model directory or a hub model id (examples/config_cpu.yaml's tiny model and data "
            "are built by `python -m easyr1.tools.demo_assets`)"
        ) from None


def run(argv: list[str]) -> list[dict[str, float]]:
    """Load the config from ``argv`` and train; returns ``[last step's metrics]`` (all steps': the trackers)."""
    from easyr1.config import check_against_model, compatibility_only_settings, load_config
    from easyr1.plan.check import check_plan_fits
    from easyr1.seeding import seed_everything

    config = load_config(argv)
    if config.trainer.single_process:  # the worker is this process: the environment a Ray worker gets, before the
        os.environ.update(worker_environment())  # libraries that read it (transformers, vLLM) are imported
        if os.environ["PYTHONWARNINGS"] == "ignore":
            warnings.simplefilter("ignore")  # as PYTHONWARNINGS does for a Ray worker (read at interpreter start)
    seed_everything(config.trainer.seed)  # the driver's generators; each worker seeds its own
    ignored = compatibility_only_settings(config)
    if ignored:
        notice = f"easyr1: notice: accepted for EasyR1 compatibility, no effect here: {', '.join(ignored)}"
        print(notice, file=sys.stderr)
    from easyr1.build import build_trainer, read_inputs, report_locations
    from easyr1.logging import startup

    startup.begin()

    for line in report_locations(config):
        print(f"easyr1: {line}", flush=True)
    check_against_model(config, read_model_config(config.worker.actor.model))
    startup.mark("imports_and_config")
    # memory and step-time plan from config.json alone: a run that cannot fit stops here, before Ray or any model
    print(check_plan_fits(config), flush=True)
    inputs = read_inputs(config)  # the tokenizer, the reward file and every dataset row, before anything starts
    startup.mark("plan_and_data")
    if not config.trainer.single_process:
        init_ray(config.world_size, config.trainer.nnodes, timeline=bool(config.trainer.ray_timeline))
        startup.mark("ray")
    try:
        trainer = build_trainer(config, inputs)
        try:
            return trainer.fit()
        finally:
            trainer.shutdown()
            if config.trainer.ray_timeline and not config.trainer.single_process:
                write_ray_timeline(config.trainer.ray_timeline)
    except WorkerLost as lost:
        lost.checkpoints = config.trainer.save_checkpoint_path
        raise


def write_ray_timeline(path: str) -> None:
    """Ray's timeline of this run's tasks (``trainer.ray_timeline``: open it in chrome://tracing or Perfetto)."""
    import ray

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=path)
    print(f"easyr1: Ray timeline: {path}", flush=True)


def resume_advice(lost: WorkerLost, argv: list[str]) -> str:
    """The last intact checkpoint of the run a lost worker stopped, and the command that continues from it."""
    from easyr1.checkpoint.manager import CheckpointDirectory, step_damage

    checkpoints = CheckpointDirectory(lost.checkpoints) if lost.checkpoints else None
    steps = checkpoints.complete_steps() if checkpoints else []
    # the newest committed step whose files are whole (the one a resume would choose)
    intact = next((step for step in reversed(steps) if step_damage(checkpoints.step_dir(step)) is None), None)
    command = shlex.join([Path(sys.executable).name, "-m", "easyr1.main", *argv])
    if intact is None:
        written = "no checkpoint was written before it" if not steps else "no checkpoint of the run is intact"
        return f"{written}; start the run again with:\n  {command}"
    last = checkpoints.step_dir(intact)
    return (
        f"the last intact checkpoint is {last} (step {intact}); continue from it with:\n"
        f"  {command} {shlex.quote(f'trainer.load_checkpoint_path={last}')}"
    )


USAGE = """usage: python -m easyr1.main config=FILE.yaml [key=value ...]

Trains with the config FILE.yaml (EasyR1's format), each key=value overriding it (dataclass defaults < YAML < the
command line). Every key, with its type, default and help:
"""


def main(argv: list[str] | None = None) -> int:
    """CLI wrapper around :func:`run`: ``--help``; user errors as one message and exit code 2; a lost worker as one
    message with the checkpoint to resume from and exit code 1."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        from easyr1.config import describe

        print(USAGE + describe())
        return 0
    try:
        run(argv)
    except UserError as error:
        print(f"easyr1: error: {error}", file=sys.stderr)
        return 2
    except WorkerLost as lost:
        print(f"easyr1: error: {lost}\neasyr1: {resume_advice(lost, argv)}", file=sys.stderr)
        return 1
    except Exception as error:
        cause = getattr(error, "cause", None)  # a Ray task's error (ray.exceptions.RayTaskError) carries the user's
        if isinstance(cause, UserError):
            print(f"easyr1: error: {cause}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
