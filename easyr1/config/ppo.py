"""The whole configuration of a run: :class:`PPOConfig` (data, algorithm, worker, trainer), its derived fields,
and the two entry points of its checks (:meth:`PPOConfig.validate`, :func:`check_against_model`).

Mirror fields (``worker.actor.kl_coef``, ``worker.rollout.prompt_length``, ...) are declared with
:func:`~easyr1.config.fields.mirror` in their sections; :data:`MIRRORS` collects them, and
:meth:`PPOConfig.fill_derived` copies each from its source. Validation runs the checks that live beside each
section's fields, then the cross-section ones of :mod:`easyr1.config.checks`, always in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from easyr1.config.actor import (
    ACTOR_RANGES,
    ActorConfig,
    CriticConfig,
    RefConfig,
    check_fsdp_dtypes,
    check_model_names,
    resolve_loss_aliases,
)
from easyr1.config.algorithm import ALGORITHM_RANGES, AlgorithmConfig, check_algorithm_names, check_algorithm_pairs
from easyr1.config.checks import check_estimator_env, check_sizes, known_estimator_needs, model_problems
from easyr1.config.data import DATA_RANGES, DataConfig, check_data_pairs
from easyr1.config.env import ENV_RANGES, EnvConfig, check_env_names
from easyr1.config.fields import get_key, iter_fields, mirror_source, option, section, set_key
from easyr1.config.paths import absolute, resolve_dataset, resolve_function, resolve_path
from easyr1.config.reward import (
    REWARD_RANGES,
    RewardConfig,
    check_reward_function,
    check_reward_names,
    join_reward_function_name,
)
from easyr1.config.reward_model import (
    REWARD_MODEL_RANGES,
    RewardModelConfig,
    check_reward_model,
    fill_reward_model_paths,
)
from easyr1.config.rollout import ROLLOUT_RANGES, RolloutConfig, check_rollout_names, check_val_override
from easyr1.config.rules import check_ranges, prefixed
from easyr1.config.schedule import ASYNC_RANGES, AsyncConfig, check_schedule
from easyr1.config.trainer import TRAINER_RANGES, TrainerConfig, check_trainer_names
from easyr1.errors import ConfigError


@dataclass
class WorkerConfig:
    """Everything that runs on the workers."""

    hybrid_engine: bool = option(
        True,
        "EasyR1's actor, rollout and reference in one worker group (it implements nothing else); always so here",
        compatibility_only=True,
    )
    actor: ActorConfig = section(ActorConfig, "the policy being trained")
    critic: CriticConfig = section(CriticConfig, "the value model (PPO with GAE only)")
    ref: RefConfig = section(RefConfig, "the reference policy")
    rollout: RolloutConfig = section(RolloutConfig, "the generation engine")
    reward: RewardConfig = section(RewardConfig, "the reward function")
    reward_model: RewardModelConfig = section(
        RewardModelConfig, "a reward model or generative judge that sees the images (default: none)"
    )


@dataclass
class PPOConfig:
    """The whole configuration of a training run."""

    data: DataConfig = section(DataConfig, "the prompts")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "the RL algorithm")
    worker: WorkerConfig = section(WorkerConfig, "actor, reference, rollout and reward")
    trainer: TrainerConfig = section(TrainerConfig, "the training loop")
    env: EnvConfig = section(EnvConfig, "the environment of a multi-turn agent run (unset: single-turn prompts)")
    async_training: AsyncConfig = section(
        AsyncConfig, "asynchronous schedules: generation overlapped with training (default: sync, no overlap)"
    )

    def __post_init__(self) -> None:
        self.fill_derived()

    @property
    def world_size(self) -> int:
        """The number of workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
        return self.trainer.world_size

    def fill_derived(self) -> None:
        """Fill the derived fields: mirrors, aliases, default names and absolute local paths.

        Runs when the config is built; call it again after changing fields in code. It is idempotent.
        """
        actor = self.worker.actor
        resolve_loss_aliases(actor)

        for derived, source in MIRRORS.items():
            set_key(self, derived, get_key(self, source))

        data, model, reward, trainer = self.data, actor.model, self.worker.reward, self.trainer
        data.train_files = resolve_dataset(data.train_files)
        data.val_files = resolve_dataset(data.val_files)
        data.format_prompt = resolve_path(data.format_prompt)
        data.override_chat_template = resolve_path(data.override_chat_template)
        data.image_dir = absolute(data.image_dir)
        model.model_path = resolve_path(model.model_path)
        model.tokenizer_path = resolve_path(model.tokenizer_path) if model.tokenizer_path else model.model_path
        join_reward_function_name(reward)  # EasyR1's dumps split 'file.py:name' into two keys
        fill_reward_model_paths(self)  # without a reward file, the reward model's score is the reward
        reward.reward_function = resolve_function(reward.reward_function)
        self.env.env_class = resolve_function(self.env.env_class)
        if self.worker.critic.global_batch_size is None:
            self.worker.critic.global_batch_size = actor.global_batch_size
        critic_model = self.worker.critic.model
        critic_model.model_path = (
            resolve_path(critic_model.model_path) if critic_model.model_path else model.model_path
        )
        critic_model.tokenizer_path = critic_model.tokenizer_path or model.tokenizer_path
        if trainer.save_checkpoint_path is None:
            trainer.save_checkpoint_path = os.path.join("checkpoints", trainer.project_name, trainer.experiment_name)
        trainer.save_checkpoint_path = absolute(trainer.save_checkpoint_path)
        trainer.load_checkpoint_path = absolute(trainer.load_checkpoint_path)
        trainer.log_dir = absolute(trainer.log_dir) if trainer.log_dir else trainer.save_checkpoint_path

    def settle(self, training_steps: int, device: str) -> list[str]:
        """Fill in what is known only once the data is read and the cluster joined, before any worker starts.

        ``worker.actor.optim.training_steps`` and the critic's become the run's steps, ``trainer.device``
        the device ``auto`` resolved to; an agent run with ``env.context=full`` turns ``worker.actor.share_prompt`` off
        (a trajectory's images sit in its response region too, which a prompt shared by a group cannot carry). The
        builder calls this once: the config every worker gets, the trackers record and each checkpoint saves is the
        settled one. Returns a notice for each setting it turned off.
        """
        notices = []
        self.trainer.device = device
        self.worker.actor.optim.training_steps = training_steps
        self.worker.critic.optim.training_steps = training_steps  # the critic is updated in the same steps
        if self.env.enabled and self.env.context == "full" and self.worker.actor.share_prompt:
            self.worker.actor.share_prompt = False
            notices.append(
                "worker.actor.share_prompt is off for agent runs with env.context=full (observations hold images)"
            )
        self.fill_derived()
        return notices

    def validate(self, num_workers: int | None = None) -> None:
        """Check the values and their combinations; raise :class:`ConfigError` listing every problem found.

        ``num_workers`` replaces :attr:`world_size` when the caller knows the real count.
        """
        problems = validation_problems(self, num_workers)
        if len(problems) == 1:
            raise ConfigError(problems[0])
        if problems:
            raise ConfigError("invalid configuration:\n" + "\n".join(f"  - {problem}" for problem in problems))


# Derived key -> the key it is copied from, in the order of the tree.
MIRRORS: dict[str, str] = {
    key: mirror_source(item) for key, item, _ in iter_fields(PPOConfig) if mirror_source(item) is not None
}


# Every single-key rule by its full key. trainer.peak_flops_per_device keeps its place at the front of the
# table (a repeated key keeps its first position), so problems are listed in the order they always were.
_RANGES = {
    "trainer.peak_flops_per_device": TRAINER_RANGES["peak_flops_per_device"],
    **prefixed("data", DATA_RANGES),
    **prefixed("algorithm", ALGORITHM_RANGES),
    **prefixed("worker.actor", ACTOR_RANGES),
    **prefixed("worker.rollout", ROLLOUT_RANGES),
    **prefixed("worker.reward", REWARD_RANGES),
    **prefixed("worker.reward_model", REWARD_MODEL_RANGES),
    **prefixed("trainer", TRAINER_RANGES),
    **prefixed("env", ENV_RANGES),
    **prefixed("async_training", ASYNC_RANGES),
}


def validation_problems(config: PPOConfig, num_workers: int | None) -> list[str]:
    """Every problem of the config, as messages naming the keys and values involved."""
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    problems: list[str] = []
    worker = config.worker
    if worker.actor.model.model_path is None:
        problems.append("worker.actor.model.model_path is not set; pass worker.actor.model.model_path=PATH_OR_HUB_ID")
    if not config.env.enabled:  # an agent's rewards come from its environment
        check_reward_function(worker.reward, problems)
    check_ranges(config, _RANGES, problems)
    check_data_pairs(config.data, problems)
    check_algorithm_pairs(config.algorithm, problems)
    check_algorithm_names(config.algorithm, problems)
    check_model_names(worker.actor, worker.ref, worker.critic, problems)
    check_rollout_names(worker.rollout, problems)
    fsdp_sections = [
        ("worker.actor.fsdp", worker.actor.fsdp),
        ("worker.ref.fsdp", worker.ref.fsdp),
        ("worker.critic.fsdp", worker.critic.fsdp),
    ]
    check_fsdp_dtypes(fsdp_sections, problems)
    world = num_workers if num_workers is not None else config.world_size
    if config.trainer.single_process and world != 1:
        problems.append(
            f"trainer.single_process=true runs one worker in this process, but trainer.nnodes * "
            f"trainer.n_gpus_per_node = {world}; set trainer.n_gpus_per_node=1 and trainer.nnodes=1"
        )
    for key, fsdp in fsdp_sections:
        if fsdp.fsdp_size not in (-1, world):
            problems.append(
                f"{key}.fsdp_size={fsdp.fsdp_size}: every model is sharded over all {world} workers (hybrid sharding "
                f"over smaller groups is not implemented); set {key}.fsdp_size=-1 (or {world})"
            )
    check_reward_names(worker.reward, problems)
    check_reward_model(config, problems)
    check_trainer_names(config.trainer, problems)
    check_val_override(worker.rollout, problems)
    if config.env.enabled:
        check_env_names(config.env, problems)
    check_estimator_env(config.algorithm, config.env, config.data, problems)
    check_schedule(config, world, problems)
    check_sizes(
        config.data,
        config.algorithm,
        worker.actor,
        worker.critic,
        worker.rollout,
        config.trainer,
        num_workers,
        problems,
    )
    return problems


def check_against_model(config: PPOConfig, model_config: Mapping[str, Any]) -> None:
    """Check the config against the model's ``config.json`` (``model_config``, as a dict: the CLI reads it with
    :func:`easyr1.models.loading.load_model_config`, as the workers do); no weights are read.

    Raises :class:`ConfigError` when the model's type is not a supported family (naming it and the families), when
    the sequence lengths exceed ``max_position_embeddings``, when the
    tensor-parallel size does not divide the attention heads, or when a vision setting is used with a text-only model.
    """
    model = config.worker.actor.model
    sequence_parallel = {"worker.actor.ulysses_size": config.worker.actor.ulysses_size}
    if known_estimator_needs(config.algorithm.adv_estimator).critic:
        sequence_parallel["worker.critic.ulysses_size"] = config.worker.critic.ulysses_size
    problems = model_problems(config.data, model, config.worker.rollout, model_config, sequence_parallel)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("configuration does not fit the model:\n" + "\n".join(f"  - {p}" for p in problems))
