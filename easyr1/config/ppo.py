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
from easyr1.config.checks import check_estimator_env, check_sizes, model_problems, read_model_config
from easyr1.config.data import DATA_RANGES, DataConfig, check_data_pairs
from easyr1.config.env import ENV_RANGES, EnvConfig, check_env_names
from easyr1.config.fields import get_key, iter_fields, mirror_source, section, set_key
from easyr1.config.paths import absolute, resolve_dataset, resolve_function, resolve_path
from easyr1.config.reward import REWARD_RANGES, RewardConfig, check_reward_function, check_reward_names
from easyr1.config.rollout import ROLLOUT_RANGES, RolloutConfig, check_rollout_names, check_val_override
from easyr1.config.rules import check_ranges, prefixed
from easyr1.config.trainer import TRAINER_RANGES, TrainerConfig, check_trainer_names
from easyr1.errors import ConfigError


@dataclass
class WorkerConfig:
    """Everything that runs on the workers."""

    actor: ActorConfig = section(ActorConfig, "the policy being trained")
    critic: CriticConfig = section(CriticConfig, "the value model (PPO with GAE only)")
    ref: RefConfig = section(RefConfig, "the reference policy")
    rollout: RolloutConfig = section(RolloutConfig, "the generation engine")
    reward: RewardConfig = section(RewardConfig, "the reward function")


@dataclass
class PPOConfig:
    """The whole configuration of a training run."""

    data: DataConfig = section(DataConfig, "the prompts")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "the RL algorithm")
    worker: WorkerConfig = section(WorkerConfig, "actor, reference, rollout and reward")
    trainer: TrainerConfig = section(TrainerConfig, "the training loop")
    env: EnvConfig = section(EnvConfig, "the environment of a multi-turn agent run (unset: single-turn prompts)")

    def __post_init__(self) -> None:
        self.fill_derived()

    @property
    def world_size(self) -> int:
        """The number of workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

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

    def validate(self, num_workers: int | None = None) -> None:
        """Check the values and their combinations; raise :class:`ConfigError` listing every problem found.

        ``num_workers`` replaces ``trainer.nnodes * trainer.n_gpus_per_node`` when the caller knows the real count.
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
    **prefixed("trainer", TRAINER_RANGES),
    **prefixed("env", ENV_RANGES),
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
    world = num_workers if num_workers is not None else config.trainer.nnodes * config.trainer.n_gpus_per_node
    for key, fsdp in fsdp_sections:
        if fsdp.fsdp_size not in (-1, world):
            problems.append(
                f"{key}.fsdp_size={fsdp.fsdp_size}: every model is sharded over all {world} workers (hybrid sharding "
                f"over smaller groups is not implemented); set {key}.fsdp_size=-1 (or {world})"
            )
    check_reward_names(worker.reward, problems)
    check_trainer_names(config.trainer, problems)
    check_val_override(worker.rollout, problems)
    if config.env.enabled:
        check_env_names(config.env, problems)
    check_estimator_env(config.algorithm, config.env, config.data, problems)
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


def check_against_model(config: PPOConfig, model_config: Mapping[str, Any] | None = None) -> None:
    """Check the config against the model's ``config.json``; no weights are read.

    ``model_config`` is that file as a dict; when it is omitted, ``<model_path>/config.json`` is read if the model is
    a local directory (a hub id is skipped: nothing can be checked before download). Raises :class:`ConfigError`
    when the sequence lengths exceed ``max_position_embeddings``, when the tensor-parallel size does not divide the
    attention heads, or when a vision setting is used with a text-only model.
    """
    model = config.worker.actor.model
    if model_config is None:
        model_config = read_model_config(model.model_path)
        if model_config is None:
            return
    problems = model_problems(config.data, model, config.worker.rollout, model_config)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("configuration does not fit the model:\n" + "\n".join(f"  - {p}" for p in problems))
