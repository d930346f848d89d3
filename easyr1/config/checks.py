"""Checks of the config that involve several sections: required keys, batch sizes against workers and
micro-batches, parallel group sizes, lengths, and the checks against the model's ``config.json``.

The checks of single fields live beside the fields, in the section modules; :func:`validation_problems` runs
them all in one fixed order, so a config with several problems lists them in that order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from easyr1.algorithms.advantage import ADV_ESTIMATORS, EstimatorNeeds, estimator_needs
from easyr1.config.actor import ACTOR_RANGES, check_fsdp_dtypes, check_model_names
from easyr1.config.algorithm import ALGORITHM_RANGES, check_algorithm_names, check_algorithm_pairs
from easyr1.config.data import DATA_RANGES, check_data_pairs
from easyr1.config.fields import get_key
from easyr1.config.reward import REWARD_RANGES, check_reward_function, check_reward_names
from easyr1.config.rollout import ROLLOUT_RANGES, check_rollout_names, check_val_override
from easyr1.config.rules import check_ranges, prefixed
from easyr1.config.trainer import TRAINER_RANGES, check_trainer_names
from easyr1.errors import ConfigError
from easyr1.workers.rollout import ROLLOUT_ENGINES, supports_tensor_parallel


if TYPE_CHECKING:
    from easyr1.config.ppo import PPOConfig


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
}


def validation_problems(config: PPOConfig, num_workers: int | None) -> list[str]:
    """Every problem of the config, as messages naming the keys and values involved."""
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    problems: list[str] = []
    worker = config.worker
    if worker.actor.model.model_path is None:
        problems.append("worker.actor.model.model_path is not set; pass worker.actor.model.model_path=PATH_OR_HUB_ID")
    check_reward_function(worker.reward, problems)
    check_ranges(config, _RANGES, problems)
    check_data_pairs(config.data, problems)
    check_algorithm_pairs(config.algorithm, problems)
    check_algorithm_names(config.algorithm, problems)
    check_model_names(worker.actor, worker.ref, problems)
    check_rollout_names(worker.rollout, problems)
    fsdp_sections = [
        ("worker.actor.fsdp", worker.actor.fsdp),
        ("worker.ref.fsdp", worker.ref.fsdp),
        ("worker.critic.fsdp", worker.critic.fsdp),
    ]
    check_fsdp_dtypes(fsdp_sections, problems)
    check_reward_names(worker.reward, problems)
    check_trainer_names(config.trainer, problems)
    check_val_override(worker.rollout, problems)
    _check_sizes(config, num_workers, problems)
    return problems


def _largest_divisor_up_to(number: int, limit: int) -> int:
    """The largest divisor of ``number`` that is at most ``limit`` (used to suggest a batch size)."""
    return max(d for d in range(1, max(1, min(number, limit)) + 1) if number % d == 0)


def _estimator_needs(name: str) -> EstimatorNeeds:
    """The registered estimator's needs; none for an unknown name (reported by the name check)."""
    return estimator_needs(name) if name in ADV_ESTIMATORS else EstimatorNeeds()


def _tensor_parallel(engine: str) -> bool:
    """Whether the named engine runs over a tensor-parallel group; False for an unknown name (reported apart)."""
    return engine in ROLLOUT_ENGINES and supports_tensor_parallel(engine)


def _check_sizes(config: PPOConfig, num_workers: int | None, problems: list[str]) -> None:
    """Batch sizes that must split evenly over workers and micro-batches; parallel group sizes; lengths."""
    data, actor, rollout = config.data, config.worker.actor, config.worker.rollout
    if num_workers is None:
        workers = config.world_size
        trainer = config.trainer
        who = f"the {workers} workers (trainer.nnodes={trainer.nnodes} * trainer.n_gpus_per_node="
        who += f"{trainer.n_gpus_per_node})"
    else:
        workers, who = num_workers, f"the {num_workers} workers"
    n, rollout_size, global_size = rollout.n, data.rollout_batch_size, actor.global_batch_size
    if min(workers, n, rollout_size, global_size) < 1:
        return  # already reported as out of range; the arithmetic below would be meaningless

    if global_size > rollout_size:
        problems.append(
            f"worker.actor.global_batch_size={global_size} is larger than data.rollout_batch_size={rollout_size}: "
            f"an update cannot use more prompts than one step generates; set global_batch_size <= {rollout_size}"
        )
    elif rollout_size % global_size:
        problems.append(
            f"data.rollout_batch_size={rollout_size} is not a multiple of worker.actor.global_batch_size="
            f"{global_size}: each step is split into whole updates; use a global_batch_size that divides "
            f"{rollout_size} (e.g. {_largest_divisor_up_to(rollout_size, global_size)})"
        )

    per_batch = [
        ("data.rollout_batch_size", rollout_size, "worker.actor.micro_batch_size_per_device_for_experience"),
        ("worker.actor.global_batch_size", global_size, "worker.actor.micro_batch_size_per_device_for_update"),
    ]
    if data.mini_rollout_batch_size is not None and data.mini_rollout_batch_size >= 1:
        per_batch.append(("data.mini_rollout_batch_size", data.mini_rollout_batch_size, None))
        if rollout_size % data.mini_rollout_batch_size:
            problems.append(
                f"data.mini_rollout_batch_size={data.mini_rollout_batch_size} must divide data.rollout_batch_size="
                f"{rollout_size}: a step's prompts are drawn in whole generation rounds"
            )
    needs = _estimator_needs(config.algorithm.adv_estimator)
    if needs.critic:
        critic = config.worker.critic
        if critic.global_batch_size > rollout_size or rollout_size % max(critic.global_batch_size, 1):
            problems.append(
                f"worker.critic.global_batch_size={critic.global_batch_size} must divide "
                f"data.rollout_batch_size={rollout_size}"
            )
        per_batch.append(
            (
                "worker.critic.global_batch_size",
                critic.global_batch_size,
                "worker.critic.micro_batch_size_per_device_for_update",
            )
        )
    for key, prompts, micro_key in per_batch:
        samples = prompts * n
        if samples % workers:
            problems.append(
                f"{key} * worker.rollout.n = {prompts} * {n} = {samples} samples cannot be split evenly across "
                f"{who}; make {key} * n a multiple of {workers}"
            )
            continue
        micro = get_key(config, micro_key) if micro_key else 1
        per_worker = samples // workers
        if 1 <= micro < per_worker and per_worker % micro:  # a micro-batch may hold a worker's whole share
            problems.append(
                f"each worker gets {key} * worker.rollout.n / workers = {samples} / {workers} = {per_worker} "
                f"samples, not a whole number of micro-batches of {micro_key}={micro}; use a micro-batch size "
                f"that divides {per_worker} (e.g. {_largest_divisor_up_to(per_worker, micro)})"
            )

    size = rollout.tensor_parallel_size
    if size >= 1 and workers % size:
        problems.append(
            f"worker.rollout.tensor_parallel_size={size} does not divide {who}: every group needs all its members; "
            f"use a size that divides {workers}"
        )
    if actor.ulysses_size > 1:
        problems.append(
            f"worker.actor.ulysses_size={actor.ulysses_size}: Ulysses sequence parallelism is not implemented; set "
            "ulysses_size=1 and fit long sequences with worker.actor.padding_free=true, smaller "
            "micro_batch_size_per_device_for_update / _for_experience, and "
            "worker.actor.model.enable_gradient_checkpointing=true"
        )
    nodes, per_node, tp = config.trainer.nnodes, config.trainer.n_gpus_per_node, rollout.tensor_parallel_size
    if nodes > 1 and per_node >= 1 and tp >= 1 and per_node % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide trainer.n_gpus_per_node={per_node}: with "
            f"trainer.nnodes={nodes} a tensor-parallel group would span two nodes; use a size that divides {per_node}"
        )
    if rollout.name in ROLLOUT_ENGINES and not supports_tensor_parallel(rollout.name) and size != 1:
        engines = " or ".join(name for name in ROLLOUT_ENGINES.names() if supports_tensor_parallel(name))
        problems.append(
            f"worker.rollout.tensor_parallel_size={size} needs worker.rollout.name={engines}; "
            f"the {rollout.name} engine keeps a whole model per worker: set tensor_parallel_size=1"
        )

    total = data.max_prompt_length + data.max_response_length
    if rollout.max_model_len is not None and total > rollout.max_model_len:
        problems.append(
            f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
            f"{data.max_response_length} = {total} exceeds worker.rollout.max_model_len={rollout.max_model_len}; "
            "raise max_model_len or lower the length limits"
        )

    estimator = config.algorithm.adv_estimator
    if needs.greedy_baseline and rollout_size % workers:
        problems.append(
            f"algorithm.adv_estimator={estimator} generates one greedy baseline per prompt, so "
            f"data.rollout_batch_size={rollout_size} must split evenly across {who}"
        )
    if n < needs.min_group_size:
        problems.append(
            f"algorithm.adv_estimator={estimator} compares responses to the same prompt and "
            f"needs worker.rollout.n >= {needs.min_group_size} (got {n})"
        )


def _read_model_config(model_path: str | None) -> dict[str, Any] | None:
    """The parsed ``config.json`` of a local model directory, or None when there is none to read."""
    if model_path is None or not os.path.isfile(os.path.join(model_path, "config.json")):
        return None
    path = os.path.join(model_path, "config.json")
    try:
        with open(path, encoding="utf-8") as file:
            loaded = json.load(file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the model config {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"the model config {path} must hold a JSON object")
    return loaded


def _model_value(model_config: Mapping[str, Any], key: str) -> Any:
    """A language-model setting from config.json, which multimodal models nest under ``text_config``."""
    text_config = model_config.get("text_config")
    if isinstance(text_config, Mapping) and key in text_config:
        return text_config[key]
    return model_config.get(key)


def check_against_model(config: PPOConfig, model_config: Mapping[str, Any] | None = None) -> None:
    """Check the config against the model's ``config.json``; no weights are read.

    ``model_config`` is that file as a dict; when it is omitted, ``<model_path>/config.json`` is read if the model is
    a local directory (a hub id is skipped: nothing can be checked before download). Raises :class:`ConfigError`
    when the sequence lengths exceed ``max_position_embeddings``, when the tensor-parallel size does not divide the
    attention heads, or when a vision setting is used with a text-only model.
    """
    if model_config is None:
        model_config = _read_model_config(config.worker.actor.model.model_path)
        if model_config is None:
            return
    # The user's override_config wins over the file, as it does when the model is loaded.
    model_config = {**model_config, **config.worker.actor.model.override_config}
    problems = []
    model = config.worker.actor.model.model_path
    data, rollout = config.data, config.worker.rollout
    max_positions = _model_value(model_config, "max_position_embeddings")
    if max_positions is not None:
        total = data.max_prompt_length + data.max_response_length
        if total > max_positions:
            problems.append(
                f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
                f"{data.max_response_length} = {total} exceeds the model's max_position_embeddings={max_positions} "
                f"({model}); lower the length limits"
            )
        if rollout.max_model_len is not None and rollout.max_model_len > max_positions:
            problems.append(
                f"worker.rollout.max_model_len={rollout.max_model_len} exceeds the model's max_position_embeddings="
                f"{max_positions} ({model}); set max_model_len <= {max_positions} or null"
            )
    heads = _model_value(model_config, "num_attention_heads")
    tp = rollout.tensor_parallel_size
    if _tensor_parallel(rollout.name) and heads is not None and tp >= 1 and heads % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide the model's num_attention_heads={heads} "
            f"({model}); use a tensor_parallel_size that divides {heads}"
        )
    if config.worker.actor.model.freeze_vision_tower and "vision_config" not in model_config:
        problems.append(
            f"worker.actor.model.freeze_vision_tower=true but the model ({model}) has no vision tower; set it to false"
        )
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError("configuration does not fit the model:\n" + "\n".join(f"  - {p}" for p in problems))
