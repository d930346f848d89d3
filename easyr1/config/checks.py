"""Checks of the config that involve several sections: batch sizes against workers and micro-batches, parallel
group sizes, lengths (:func:`check_sizes`), and what must fit the model's ``config.json`` (:func:`model_problems`).

The checks of single fields live beside the fields, in the section modules;
:func:`easyr1.config.ppo.validation_problems` runs them all, then these, in one fixed order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from easyr1.algorithms.advantage import ADV_ESTIMATORS, EstimatorNeeds, estimator_needs
from easyr1.config.actor import ActorConfig, CriticConfig, ModelConfig
from easyr1.config.algorithm import AlgorithmConfig
from easyr1.config.data import DataConfig
from easyr1.config.env import EnvConfig
from easyr1.config.rollout import RolloutConfig
from easyr1.config.trainer import TrainerConfig
from easyr1.engines import ENGINES, engine_traits
from easyr1.models.families import family_of, unsupported_model_problem
from easyr1.models.linear_attention import has_linear_attention


def _largest_divisor_up_to(number: int, limit: int) -> int:
    """The largest divisor of ``number`` that is at most ``limit`` (used to suggest a batch size)."""
    return max(d for d in range(1, max(1, min(number, limit)) + 1) if number % d == 0)


def known_estimator_needs(name: str) -> EstimatorNeeds:
    """The registered estimator's needs; none for an unknown name (reported by the name check)."""
    return estimator_needs(name) if name in ADV_ESTIMATORS else EstimatorNeeds()


def _tensor_parallel(engine: str) -> bool:
    """Whether the named engine runs over a tensor-parallel group; False for an unknown name (reported apart)."""
    return engine in ENGINES and engine_traits(engine).tensor_parallel


def check_sizes(
    data: DataConfig,
    algorithm: AlgorithmConfig,
    actor: ActorConfig,
    critic: CriticConfig,
    rollout: RolloutConfig,
    trainer: TrainerConfig,
    num_workers: int | None,
    problems: list[str],
) -> None:
    """Batch sizes that must split evenly over workers and micro-batches; parallel group sizes; lengths.

    ``num_workers`` replaces ``trainer.nnodes * trainer.n_gpus_per_node`` when the caller knows the real count.
    """
    if num_workers is None:
        workers = trainer.world_size
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
    needs = known_estimator_needs(algorithm.adv_estimator)
    if needs.critic:
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
    micro_sizes = {
        "worker.actor.micro_batch_size_per_device_for_experience": actor.micro_batch_size_per_device_for_experience,
        "worker.actor.micro_batch_size_per_device_for_update": actor.micro_batch_size_per_device_for_update,
        "worker.critic.micro_batch_size_per_device_for_update": critic.micro_batch_size_per_device_for_update,
    }
    for key, prompts, micro_key in per_batch:
        samples = prompts * n
        if samples % workers:
            problems.append(
                f"{key} * worker.rollout.n = {prompts} * {n} = {samples} samples cannot be split evenly across "
                f"{who}; make {key} * n a multiple of {workers}"
            )
            continue
        micro = micro_sizes[micro_key] if micro_key else 1
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
    sequence_parallel = {"worker.actor.ulysses_size": actor.ulysses_size}
    if needs.critic:
        sequence_parallel["worker.critic.ulysses_size"] = critic.ulysses_size
    for key, group_size in sequence_parallel.items():
        if group_size > 1 and workers % group_size:
            problems.append(
                f"{key}={group_size} does not divide {who}: every sequence-parallel group needs all its members; use "
                f"a size that divides {workers}"
            )
    nodes, per_node, tp = trainer.nnodes, trainer.n_gpus_per_node, rollout.tensor_parallel_size
    if nodes > 1 and per_node >= 1 and tp >= 1 and per_node % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide trainer.n_gpus_per_node={per_node}: with "
            f"trainer.nnodes={nodes} a tensor-parallel group would span two nodes; use a size that divides {per_node}"
        )
    if rollout.name in ENGINES and not engine_traits(rollout.name).tensor_parallel and size != 1:
        engines = " or ".join(name for name in ENGINES.names() if engine_traits(name).tensor_parallel)
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

    estimator = algorithm.adv_estimator
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


def check_estimator_env(algorithm: AlgorithmConfig, env: EnvConfig, data: DataConfig, problems: list[str]) -> None:
    """An estimator that reads each token's turn (``turn_gae``) needs a multi-turn run (the ``env`` section); an
    agent run needs a turn that fits the response budget, and no DAPO refills or greedy-baseline round (the
    multi-turn stage plays neither); ``env.context=latest`` needs an estimator with one advantage per sample."""
    needs = known_estimator_needs(algorithm.adv_estimator)
    if needs.turn_ids and not env.enabled:
        problems.append(
            f"algorithm.adv_estimator={algorithm.adv_estimator} assigns credit over an episode's turns and needs a "
            "multi-turn run: set env.name or env.env_class (the env section), or use algorithm.adv_estimator=gae"
        )
    if not env.enabled:
        return
    if env.max_tokens_per_turn > data.max_response_length:
        bound = "a whole trajectory after its first observation" if env.context == "full" else "one turn"
        problems.append(
            f"env.max_tokens_per_turn={env.max_tokens_per_turn} exceeds data.max_response_length="
            f"{data.max_response_length}, which bounds {bound}; raise data.max_response_length or lower "
            "env.max_tokens_per_turn"
        )
    if env.context == "latest" and algorithm.adv_estimator in ADV_ESTIMATORS and not needs.one_per_sample:
        usable = ", ".join(name for name in ADV_ESTIMATORS.names() if estimator_needs(name).one_per_sample)
        problems.append(
            f"env.context=latest trains each turn as its own sequence and gives it its episode's advantage, which "
            f"needs one advantage per sample; algorithm.adv_estimator={algorithm.adv_estimator} gives one per "
            f"token. Use one of {usable}, or env.context=full"
        )
    if algorithm.online_filtering:
        problems.append("algorithm.online_filtering (DAPO refills) is not available for agent runs (env section)")
    if needs.greedy_baseline:
        problems.append(
            f"algorithm.adv_estimator={algorithm.adv_estimator} needs a greedy baseline round, which agent runs "
            "(env section) do not play; use grpo, rloo, reinforce_plus_plus, gae or turn_gae"
        )


def _model_value(model_config: Mapping[str, Any], key: str) -> Any:
    """A language-model setting from config.json, which multimodal models nest under ``text_config``."""
    text_config = model_config.get("text_config")
    if isinstance(text_config, Mapping) and key in text_config:
        return text_config[key]
    return model_config.get(key)


def model_problems(
    data: DataConfig,
    model: ModelConfig,
    rollout: RolloutConfig,
    model_config: Mapping[str, Any],
    sequence_parallel: Mapping[str, int] | None = None,
) -> list[str]:
    """What does not fit the model's ``config.json`` (``model_config``): a model type outside the supported
    families (then that is the only problem returned), sequence lengths beyond ``max_position_embeddings``, a
    tensor-parallel size that does not divide the attention heads, a vision setting with a text-only model, vLLM
    without chunked prefill for a model with linear-attention layers, a router loss for a model without routers, a
    Ulysses size (``sequence_parallel``: key -> size) the model's attention cannot be split by."""
    # The user's override_config wins over the file, as it does when the model is loaded.
    model_config = {**model_config, **model.override_config}
    model_path = model.model_path
    unsupported = unsupported_model_problem(model_config, model_path)
    if unsupported is not None:
        return [unsupported]  # the other checks would only read settings of a model that cannot run anyway
    problems = []
    max_positions = _model_value(model_config, "max_position_embeddings")
    if max_positions is not None:
        total = data.max_prompt_length + data.max_response_length
        if total > max_positions:
            problems.append(
                f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
                f"{data.max_response_length} = {total} exceeds the model's max_position_embeddings={max_positions} "
                f"({model_path}); lower the length limits"
            )
        if rollout.max_model_len is not None and rollout.max_model_len > max_positions:
            problems.append(
                f"worker.rollout.max_model_len={rollout.max_model_len} exceeds the model's max_position_embeddings="
                f"{max_positions} ({model_path}); set max_model_len <= {max_positions} or null"
            )
    heads = _model_value(model_config, "num_attention_heads")
    tp = rollout.tensor_parallel_size
    if _tensor_parallel(rollout.name) and heads is not None and tp >= 1 and heads % tp:
        problems.append(
            f"worker.rollout.tensor_parallel_size={tp} does not divide the model's num_attention_heads={heads} "
            f"({model_path}); use a tensor_parallel_size that divides {heads}"
        )
    for key, size in (sequence_parallel or {}).items():
        if size > 1:
            problems.extend(sequence_parallel_problems(key, size, model_config, model_path))
    if rollout.name == "vllm" and has_linear_attention(model_config) and not rollout.enable_chunked_prefill:
        problems.append(
            f"the model ({model_path}) has linear-attention layers (model_type={model_config.get('model_type')}), "
            "whose state vLLM caches for shared prompt blocks only with chunked prefill; set "
            "worker.rollout.enable_chunked_prefill=true"
        )
    if model.freeze_vision_tower and "vision_config" not in model_config:
        problems.append(
            f"worker.actor.model.freeze_vision_tower=true but the model ({model_path}) has no vision tower; "
            "set it to false"
        )
    if model.router_aux_loss_coef and not family_of(model_config).router_aux_loss:
        problems.append(
            f"worker.actor.model.router_aux_loss_coef={model.router_aux_loss_coef} but the model ({model_path}, "
            f"model_type={model_config.get('model_type')}) has no mixture-of-experts router; set it to 0"
        )
    return problems


def sequence_parallel_problems(key: str, size: int, model_config: Mapping[str, Any], model_path: str) -> list[str]:
    """Why ``key=size`` (a Ulysses size above 1) cannot split the model's sequences: attention heads it does not
    divide, linear-attention layers (a state along the whole sequence), masks built from token types."""
    heads = _model_value(model_config, "num_attention_heads")
    kv_heads = _model_value(model_config, "num_key_value_heads") or heads
    model_type = model_config.get("model_type")
    problems = []
    if heads is not None and heads % size:
        problems.append(
            f"{key}={size} does not divide the model's num_attention_heads={heads} (num_key_value_heads={kv_heads}; "
            f"{model_path}): each rank attends with an equal share of the heads; use a size that divides {heads}"
        )
    if has_linear_attention(model_config):
        problems.append(
            f"{key}={size}: the model ({model_path}, model_type={model_type}) has linear-attention layers, whose "
            "state runs along the whole sequence and cannot be split across ranks; set it to 1"
        )
    if family_of(model_config).token_types is not None:
        problems.append(
            f"{key}={size}: the model ({model_path}, model_type={model_type}) builds its attention masks from token "
            "types (image blocks attending bidirectionally, sliding windows), which a split sequence does not "
            "carry; set it to 1"
        )
    return problems
