"""Command line entry point: ``python -m easyr1.main config=FILE.yaml key=value ...``.

Loads the typed config (defaults < YAML < dot-list overrides), checks it and the data and reward
files before any model is loaded, starts Ray, and trains. User errors are printed as one clear
message with exit code 2, without a traceback.
"""

from __future__ import annotations

import os
import sys

from easyr1.errors import UserError


# the tasks whose events GCS keeps (Ray's default: 100,000); they serve Ray's state API and dashboard, which the
# cluster init_ray starts does not run
TASK_EVENTS_KEPT = 1000


def local_cluster_settings() -> dict[str, object]:
    """Ray system settings for a cluster this process starts itself (a cluster started with ``ray start`` keeps
    its own)."""
    # Ray would start one worker process per logical CPU, ready for tasks; this trainer's work runs in actors,
    # each started on demand, so those sit idle (~80 MB resident each)
    settings: dict[str, object] = {"prestart_worker_first_driver": False}
    # GCS keeps every task's events, ~3.4 KB each, and a step makes a few tasks per worker: at Ray's default a run's
    # GCS grew by ~17 KB a step for its first 20,000 steps or so (1 worker). An exported
    # RAY_task_events_max_num_task_in_gcs (a dashboard started by hand, say) keeps more.
    if "RAY_task_events_max_num_task_in_gcs" not in os.environ:
        settings["task_events_max_num_task_in_gcs"] = TASK_EVENTS_KEPT
    return settings


def init_ray(num_workers: int, nnodes: int = 1) -> None:
    """Start (or join, when ``RAY_ADDRESS`` is set) a Ray cluster with quiet, CPU-friendly settings.

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
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 would otherwise create and demand a token
    env_vars = {
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_AUTH_MODE": "disabled",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error"),
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
        # torch's C++ warnings (the CPU NUMA-binding notice, once per worker)
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }
    if os.environ.get("RAY_ADDRESS"):
        # the cluster's nodes bring their own resources; only the workers' environment is passed along
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env_vars}, logging_level="WARNING")
        return
    import torch

    on_gpu = torch.cuda.is_available()
    ray.init(
        # Logical CPUs: one per worker plus one for the reward actor, even on a 2-core machine.
        num_cpus=max(os.cpu_count() or 1, num_workers + 1),
        object_store_memory=None if on_gpu else 512 * 1024**2,
        include_dashboard=False,
        runtime_env={"env_vars": env_vars},
        logging_level="WARNING",
        _system_config=local_cluster_settings(),
    )


def read_model_config(model_path: str) -> dict:
    """The model's ``config.json`` as a dict (no weights are read)."""
    from transformers import AutoConfig

    from easyr1.errors import ConfigError

    try:
        return AutoConfig.from_pretrained(model_path).to_dict()
    except OSError as error:
        raise ConfigError(
            f"worker.actor.model.model_path={model_path!r}: cannot read the model's config.json ({error}); "
            "point it at a local model directory or a hub model id"
        ) from None


def run(argv: list[str]) -> list[dict[str, float]]:
    """Load the config from ``argv`` and train; returns ``[last step's metrics]`` (all steps': the trackers)."""
    from easyr1.config import check_against_model, compatibility_only_settings, load_config
    from easyr1.plan.check import check_plan_fits
    from easyr1.seeding import seed_everything
    from easyr1.tools.demo_assets import prepare_demo_assets

    config = load_config(argv)
    seed_everything(config.trainer.seed)  # the driver's generators; each worker seeds its own
    ignored = compatibility_only_settings(config)
    if ignored:
        notice = f"easyr1: notice: accepted for EasyR1 compatibility, no effect here: {', '.join(ignored)}"
        print(notice, file=sys.stderr)
    prepare_demo_assets(config)
    check_against_model(config, read_model_config(config.worker.actor.model.model_path))
    # memory and step-time plan from config.json alone: a run that cannot fit stops here, before Ray or any model
    print(check_plan_fits(config), flush=True)
    init_ray(config.trainer.nnodes * config.trainer.n_gpus_per_node, config.trainer.nnodes)
    from easyr1.trainer import Trainer

    trainer = Trainer(config)
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def main(argv: list[str] | None = None) -> int:
    """CLI wrapper around :func:`run` that turns user errors into one message and exit code 2."""
    import ray

    try:
        run(sys.argv[1:] if argv is None else argv)
    except UserError as error:
        print(f"easyr1: error: {error}", file=sys.stderr)
        return 2
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, UserError):
            print(f"easyr1: error: {error.cause}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
