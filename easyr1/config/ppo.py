"""The whole configuration of a run: :class:`PPOConfig` (data, algorithm, worker, trainer) and its derived fields.

Mirror fields (``worker.actor.kl_coef``, ``worker.rollout.prompt_length``, ...) are declared with
:func:`~easyr1.config.fields.mirror` in their sections; :data:`MIRRORS` collects them, and
:meth:`PPOConfig.fill_derived` copies each from its source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from easyr1.config.actor import ActorConfig, CriticConfig, RefConfig, resolve_loss_aliases
from easyr1.config.algorithm import AlgorithmConfig
from easyr1.config.checks import validation_problems
from easyr1.config.data import DataConfig
from easyr1.config.fields import get_key, iter_fields, mirror_source, section, set_key
from easyr1.config.paths import absolute, resolve_dataset, resolve_function, resolve_path
from easyr1.config.reward import RewardConfig
from easyr1.config.rollout import RolloutConfig
from easyr1.config.trainer import TrainerConfig
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
