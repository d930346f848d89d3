"""A run's parts, built from its config and handed to the :class:`~easyr1.trainer.Trainer`, which only orders them.

:func:`read_inputs` reads the tokenizer, the data (or an agent's environment seeds) and the reward file (user code),
before anything starts: bad input fails there, cheaply. :func:`build_trainer` settles the config
(:meth:`~easyr1.config.PPOConfig.settle`: steps, device), opens the checkpoint directory and the trackers, starts the
worker group (Ray actors, or with ``trainer.single_process`` one worker in this process) and wires the rollout stage
to the workers and the reward scorer; a resumed run's state is read before anything is written. With
``async_training.placement=split`` it starts two groups, the trainers (the trainer's workers) and the generators (the
schedule's), and connects them for the weight push; ``async_training.schedule`` picks the stage.

Ray is imported only for a Ray run: with ``trainer.single_process`` this module, the trainer and the stages run where
Ray is not installed (the GPU check, ``tests/gpu``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from easyr1.checkpoint.manager import TRAINER_STATE_NAME, CheckpointDirectory
from easyr1.checkpoint.sharded import load_state_file
from easyr1.config import PPOConfig, redacted_keys, to_dict
from easyr1.data import RLDataset, collate_fn
from easyr1.data.sampler import PromptStream
from easyr1.distributed.local_group import LocalWorkerGroup
from easyr1.distributed.worker import device_type, pick_backend
from easyr1.engines import check_engine
from easyr1.envs import check_environment
from easyr1.errors import CheckpointError, UserError
from easyr1.logging import Tracker, build_trackers, startup
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.reward import LocalRewardScorer, RewardScorer, load_reward_function
from easyr1.reward.timed import timed_reward_function
from easyr1.reward_model.checks import check_reward_model_inputs
from easyr1.reward_model.client import RewardModelClient
from easyr1.reward_model.worker import RewardModelWorker
from easyr1.schedules.one_step_off import OneStepOffStage
from easyr1.schedules.partial_rollout import PartialRolloutStage
from easyr1.stages.multi_turn import EpisodeSeeds, MultiTurnStage
from easyr1.stages.single_turn import SingleTurnStage
from easyr1.trainer import Trainer
from easyr1.workers.hybrid_worker import GENERATOR, HYBRID, TRAINER, HybridWorker


# Torch threads of a GPU worker (its host-side work: data movement, small reductions).
GPU_WORKER_THREADS = 8


@dataclass
class RunInputs:
    """What a run reads before it starts anything: the tokenizer and processor, the model's config, the training
    prompts (or an agent's seeds) with the validation set, the reward function, and the run's length."""

    tokenizer: Any
    processor: Any
    model_config: Any
    prompts: Any
    val_dataset: RLDataset | None
    reward_fn: Any
    total_steps: int


def read_inputs(config: PPOConfig) -> RunInputs:
    """Read and check the run's inputs: the tokenizer, the reward file (user code) or the environment, every dataset
    row. Nothing starts (no Ray, no worker): bad input fails here, cheaply."""
    model = config.worker.actor.model
    tokenizer, processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
    model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
    round_size = config.data.mini_rollout_batch_size or config.data.rollout_batch_size
    if config.env.enabled:  # an agent run: environment seeds instead of prompts, rewards from the environment
        check_environment(config.env.name, config.env.env_class, dict(config.env.env_kwargs))
        prompts: Any = EpisodeSeeds(config.env.seed, config.env.num_seeds, round_size)
        if prompts.steps_per_epoch is None and not config.trainer.max_steps:
            raise UserError(
                "an agent run without env.num_seeds plays new seeds forever; set trainer.max_steps (or env.num_seeds "
                "to make an epoch)"
            )
        steps_per_epoch, val_dataset, reward_fn = prompts.steps_per_epoch, None, None
    else:
        reward = config.worker.reward
        reward_fn = load_reward_function(reward.reward_function, reward.reward_function_kwargs, reward.reward_type)
        prompts, val_dataset, steps_per_epoch = _prompts(config, tokenizer, processor, model_config, round_size)
        check_reward_model_inputs(
            config, tokenizer, val_dataset if val_dataset is not None else prompts.loader.dataset
        )  # worker.reward_model
    total_steps = config.trainer.max_steps or steps_per_epoch * config.trainer.total_epochs
    return RunInputs(tokenizer, processor, model_config, prompts, val_dataset, reward_fn, total_steps)


def start_trackers(config: PPOConfig, resume_step: int | None, total_steps: int) -> list[Tracker]:
    """The trackers of ``trainer.logger``, given the config with its secret-looking values redacted
    (:mod:`easyr1.config.redaction`); says once which keys were redacted (their names, never their values)."""
    hidden = redacted_keys(config)
    if hidden:
        print(
            f"easyr1: secret-looking config values kept out of the trackers and the checkpoints' config.yaml "
            f"(the run uses them as given): {', '.join(hidden)}",
            flush=True,
        )
    return build_trackers(
        list(config.trainer.logger),
        config.trainer.log_dir,
        resume_step=resume_step,
        project=config.trainer.project_name,
        experiment=config.trainer.experiment_name,
        config=to_dict(config, redacted=True),
        total_steps=total_steps,
    )


def build_trainer(config: PPOConfig, inputs: RunInputs | None = None) -> Trainer:
    """The trainer of ``config`` with its parts: workers started and their models loaded, resumed if a checkpoint
    says so. ``inputs``: what :func:`read_inputs` read (read here when not given). A Ray run needs a Ray cluster
    (``easyr1.main.init_ray``); ``trainer.single_process`` needs none."""
    inputs = inputs or read_inputs(config)
    tokenizer, prompts, total_steps = inputs.tokenizer, inputs.prompts, inputs.total_steps
    device = run_device(config)
    for notice in config.settle(total_steps, device):
        print(f"easyr1: {notice}", flush=True)
    check_engine(config, device)

    # Which checkpoint to continue from is settled (and its state read) before anything is written.
    checkpoints = CheckpointDirectory(config.trainer.save_checkpoint_path, config.trainer.save_limit)
    resume_from = checkpoints.resume_path(config.trainer.load_checkpoint_path, config.trainer.find_last_checkpoint)
    # read as plain data: a trainer_state.pt that holds anything else is refused before it runs (docs/security.md)
    driver_state = load_state_file(resume_from / TRAINER_STATE_NAME) if resume_from else None
    if driver_state is not None:
        check_resumed_schedule(config, driver_state, resume_from)
    for leftover in checkpoints.remove_leftovers():
        print(f"easyr1: removed {leftover}, a checkpoint write that was interrupted", flush=True)
    trackers = start_trackers(config, int(driver_state["global_step"]) if driver_state else None, total_steps)

    split = config.async_training.placement == "split"
    generators = None
    if split:  # the trainers first: the generators' group reserves its resources after theirs
        generator_count = config.async_training.generator_workers
        workers = start_workers(config, device, TRAINER, config.world_size - generator_count)
    else:
        workers = start_workers(config, device)
    scorer: RewardScorer | None = None
    reward_model: RewardModelClient | None = None
    try:
        if split:
            generators = start_workers(config, device, GENERATOR, generator_count)
        own_workers = start_reward_model_workers(config, device)  # worker.reward_model.placement=standalone
        if own_workers is not None:
            print(f"easyr1: reward model: {own_workers.describe()}", flush=True)
            reward_model = RewardModelClient(config, workers, own_workers)
        print(f"easyr1: {workers.describe()}", flush=True)
        startup.mark("workers")
        workers.check_shared_directory(config.trainer.save_checkpoint_path, "trainer.save_checkpoint_path")
        if generators is not None:
            print(f"easyr1: generators: {generators.describe()}", flush=True)
        # every group loads at once; then trainer rank 0 and the generators form the push group
        if generators is None and reward_model is None:
            workers.run_all(HybridWorker.init_models)
        else:
            loading = [(workers, workers.submit(HybridWorker.init_models))]
            if generators is not None:
                loading.append((generators, generators.submit(HybridWorker.init_models)))
            if reward_model is not None:
                own_workers = reward_model.own_workers
                loading.append((own_workers, own_workers.submit(RewardModelWorker.init_models)))
            collect_all(loading)
        startup.mark("models")
        if generators is not None:
            connect_weight_push(workers, generators)
        if config.env.enabled:
            stage: Any = MultiTurnStage(config, workers, tokenizer, inputs.processor, inputs.model_config)
        elif config.async_training.schedule == "partial_rollout":
            scorer = start_scorer(config, inputs.reward_fn)
            stage = PartialRolloutStage(config, workers, scorer, prompts, tokenizer, inputs.val_dataset, reward_model)
        elif config.async_training.schedule == "one_step_off":
            scorer = start_scorer(config, inputs.reward_fn)
            stage = OneStepOffStage(
                config, workers, generators, scorer, prompts, tokenizer, inputs.val_dataset, reward_model
            )
        else:
            scorer = start_scorer(config, inputs.reward_fn)
            stage = SingleTurnStage(config, workers, scorer, prompts, tokenizer, inputs.val_dataset, reward_model)
        trainer = Trainer(
            config,
            workers=workers,
            stage=stage,
            prompts=prompts,
            checkpoints=checkpoints,
            trackers=trackers,
            tokenizer=tokenizer,
            total_steps=total_steps,
            scorer=scorer,
        )
        if resume_from:
            trainer.load_checkpoint(resume_from, driver_state)
    except BaseException:
        workers.shutdown()  # release the workers (and their resources on the cluster) before the error surfaces
        if generators is not None:  # once the trainer is built, Trainer.shutdown closes them (through the stage)
            generators.shutdown()
        if scorer is not None:
            scorer.close()
        if reward_model is not None:  # once the trainer is built, Trainer.shutdown closes it (through the stage)
            reward_model.close()
        raise
    return trainer


def _prompts(
    config: PPOConfig, tokenizer: Any, processor: Any, model_config: Any, round_size: int
) -> tuple[PromptStream, RLDataset | None, int]:
    """The training prompt stream, the validation dataset (when the run validates) and the steps per epoch; every
    row checked."""
    data, trainer = config.data, config.trainer
    train_dataset = RLDataset.from_config(data, data.train_files, tokenizer, processor, model_config)
    prompts = PromptStream(train_dataset, round_size, data.shuffle, data.seed, collate_fn, data.dataloader_num_workers)
    val_dataset = None
    if trainer.val_freq > 0 or trainer.val_before_train or trainer.val_only:
        val_dataset = RLDataset.from_config(data, data.val_files, tokenizer, processor, model_config)
    steps_per_epoch = prompts.steps_per_epoch * round_size // data.rollout_batch_size
    if steps_per_epoch == 0:
        raise UserError(
            f"data.train_files ({data.train_files}) has {len(train_dataset)} usable rows, fewer than "
            f"data.rollout_batch_size={data.rollout_batch_size}; lower the batch size or add data"
        )
    return prompts, val_dataset, steps_per_epoch


def check_resumed_schedule(config: PPOConfig, driver_state: dict[str, Any], step_dir: Path) -> None:
    """A checkpoint resumes under the schedule that wrote it: the samples a schedule had in flight (saved with the
    step) would otherwise be dropped, or a schedule would start without the ones it expects.

    Raises:
        CheckpointError: naming both schedules and the key to set.
    """
    saved = driver_state.get("schedule", "sync")
    wanted = config.async_training.schedule
    if saved != wanted:
        raise CheckpointError(
            f"{step_dir} was written under async_training.schedule={saved} and this run asks for {wanted}: the "
            f"samples {saved} had in flight are part of that step. Resume it with async_training.schedule={saved} "
            "(or start a new run in another trainer.save_checkpoint_path)"
        )


def run_device(config: PPOConfig) -> str:
    """``trainer.device``, with ``auto`` resolved: by the Ray cluster's resources (the driver may sit on a GPU-less
    head node), or with ``trainer.single_process`` by this process's."""
    if config.trainer.single_process:
        return device_type(config.trainer.device)
    import ray

    from easyr1.distributed.placement import resolve_device

    return resolve_device(config.trainer.device, ray.cluster_resources())


def worker_threads(config: PPOConfig, device: str) -> int:
    """Torch threads of one worker: on CPU a node's workers share its cores (more threads than cores only adds
    contention), on GPU :data:`GPU_WORKER_THREADS`."""
    if device == "cpu":
        return max(1, (os.cpu_count() or 1) // config.trainer.n_gpus_per_node)
    return GPU_WORKER_THREADS


def start_workers(config: PPOConfig, device: str, role: str = HYBRID, num_workers: int | None = None) -> Any:
    """The worker group of :class:`HybridWorker` ranks (models not loaded yet): Ray actors placed by node, or one
    worker in this process (``trainer.single_process``). Each gets the settled config and ``role`` (a split
    placement's ``trainer`` or ``generator`` group of ``num_workers``; default: every worker, ``hybrid``)."""
    threads = worker_threads(config, device)
    if config.trainer.single_process:
        return LocalWorkerGroup(
            HybridWorker, init_args=(config,), threads_per_worker=threads, backend=pick_backend(device)
        )
    from easyr1.distributed.worker_group import WorkerGroup

    return WorkerGroup(
        HybridWorker,
        num_workers or config.world_size,
        nnodes=config.trainer.nnodes,
        init_args=(config, role),
        gpus_per_worker=1 if device == "cuda" else 0,
        threads_per_worker=threads,
        backend=pick_backend(device),
        cache_sample_tensors=config.trainer.cache_sample_tensors,
    )


def start_reward_model_workers(config: PPOConfig, device: str) -> Any:
    """``worker.reward_model.placement=standalone``: the reward model's own group of ``num_workers`` Ray actors on one
    node, a device each (models not loaded yet); None otherwise."""
    if not config.worker.reward_model.standalone:
        return None
    from easyr1.distributed.worker_group import WorkerGroup

    return WorkerGroup(
        RewardModelWorker,
        config.worker.reward_model.num_workers,
        init_args=(config,),
        gpus_per_worker=1 if device == "cuda" else 0,
        threads_per_worker=worker_threads(config, device),
        backend=pick_backend(device),
        cache_sample_tensors=False,
    )


def collect_all(calls: list[tuple[Any, Any]]) -> list[list[Any]]:
    """The results of calls submitted to several worker groups, watched together (a lost rank is reported at once)."""
    from easyr1.distributed.worker_group import collect_together

    return collect_together(calls)


def connect_weight_push(trainers: Any, generators: Any) -> None:
    """Form the push group of a split placement: trainer rank 0 (which serves its TCP store; on loopback when both
    groups are on one node) and every generator (``distributed/weight_push.py``)."""
    import ray

    from easyr1.distributed.placement import rendezvous_address

    address, port = ray.get(trainers.workers[0].node_address_and_free_port.remote())
    master = rendezvous_address([*trainers.node_ids, *generators.node_ids], address)
    size = 1 + generators.num_workers
    collect_all(
        [
            (trainers, trainers.submit(HybridWorker.init_weight_push, size, master, port, ranks=[0])),
            (generators, generators.submit(HybridWorker.init_weight_push, size, master, port)),
        ]
    )


def start_scorer(config: PPOConfig, reward_fn: Any) -> RewardScorer:
    """The reward scorer: served from this process when the function has a time limit (it then runs in a child
    process of this one, scored while the workers go on) or with ``trainer.single_process``; else (no limit, Ray) in
    a Ray actor on the driver's node, so that the function does not hold the driver's GIL.

    With a limit a Ray actor would only relay the calls to the same child: a process of ~130 MB, a Ray call per
    batch and an actor start saved."""
    reward = config.worker.reward
    if config.trainer.single_process or reward.timeout is not None:
        return LocalRewardScorer(timed_reward_function(reward_fn, reward.timeout, reward.timeout_score))
    from easyr1.reward.ray_scorer import RayRewardScorer

    return RayRewardScorer(
        reward.reward_function,
        reward.reward_function_kwargs,
        reward.reward_type,
        reward.num_cpus,
        timeout=reward.timeout,
        timeout_score=reward.timeout_score,
    )


def report_locations(config: PPOConfig) -> list[str]:
    """Where a run writes: its checkpoints, its metrics, and the command that renders its report."""
    trainer = config.trainer
    lines = [f"checkpoints: {trainer.save_checkpoint_path}"]
    if "file" in trainer.logger:
        lines.append(f"metrics: {Path(trainer.log_dir) / 'metrics.jsonl'}")
    lines.append(f"report: python -m easyr1.tools.report {trainer.log_dir}")
    return lines
