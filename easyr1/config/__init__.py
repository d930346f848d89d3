"""The typed configuration of a training run, and its loading from YAML files and command-line overrides.

A run is described by one :class:`PPOConfig`: a tree of dataclasses (data, algorithm, worker, trainer) whose key
names and defaults follow EasyR1, so an EasyR1 YAML file loads as it is. Every field has a default, a type hint and
a one-line help text; :func:`describe` prints them all. One module per section holds its dataclasses and the checks
of its fields:

- ``data.py``, ``algorithm.py``, ``actor.py`` (actor, reference, critic and the model, optimizer, FSDP, offload and
  LoRA sections they share), ``rollout.py``, ``reward.py``, ``trainer.py``, ``env.py``, ``schedule.py``
  (``async_training``: asynchronous schedules): the sections;
- ``ppo.py``: :class:`PPOConfig`, the worker section, the derived (mirror) fields, and the entry points of the
  checks (:meth:`PPOConfig.validate`, :func:`check_against_model`);
- ``loading.py``: :func:`load_config` (YAML + dot-list overrides, renamed keys, suggestions), :func:`describe`,
  :func:`to_yaml`, :func:`to_dict` (both optionally redacted), :func:`redacted_keys`;
- ``redaction.py``: which values are secret-looking (key names, ``${oc.env:...}``) and their redaction;
- ``checks.py``: the checks across sections (batch sizes, parallel sizes, lengths; the model's ``config.json``);
- ``fields.py`` (field helpers, the compatibility-only marker, walking the tree), ``rules.py`` (value rules),
  ``paths.py`` (local paths made absolute).

Names (advantage estimators, policy losses, KL estimators, loss aggregation modes, KL controllers, rollout engines,
reward types, loggers) are checked against the registries that define them, never against a copy.
"""

from easyr1.config.actor import (
    LOSS_AVG_MODE_ALIASES,
    LOSS_TYPE_ALIASES,
    ActorConfig,
    CriticConfig,
    FSDPConfig,
    LoraConfig,
    ModelConfig,
    OffloadConfig,
    OptimConfig,
    RefConfig,
)
from easyr1.config.algorithm import AlgorithmConfig
from easyr1.config.data import DataConfig
from easyr1.config.fields import compatibility_only_keys, compatibility_only_settings
from easyr1.config.loading import describe, load_config, redacted_keys, to_dict, to_yaml
from easyr1.config.ppo import MIRRORS, PPOConfig, WorkerConfig, check_against_model
from easyr1.config.reward import RewardConfig
from easyr1.config.rollout import RolloutConfig
from easyr1.config.rules import DTYPE_NAMES
from easyr1.config.schedule import AsyncConfig
from easyr1.config.trainer import TrainerConfig


__all__ = [
    "DTYPE_NAMES",
    "LOSS_AVG_MODE_ALIASES",
    "LOSS_TYPE_ALIASES",
    "MIRRORS",
    "ActorConfig",
    "AsyncConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "DataConfig",
    "FSDPConfig",
    "LoraConfig",
    "ModelConfig",
    "OffloadConfig",
    "OptimConfig",
    "PPOConfig",
    "RefConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainerConfig",
    "WorkerConfig",
    "check_against_model",
    "compatibility_only_keys",
    "compatibility_only_settings",
    "describe",
    "load_config",
    "redacted_keys",
    "to_dict",
    "to_yaml",
]
