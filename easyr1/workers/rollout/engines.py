"""The registry of rollout engines, chosen by name (``worker.rollout.name``) from :data:`ROLLOUT_ENGINES`.

Each engine registers a builder ``fn(EngineSetup) -> RolloutEngine`` and whether it can run one engine over a
tensor-parallel group of workers. The builders import their engine's module only when called, so importing this
registry (the config does, to validate names) never imports vLLM or loads a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from easyr1.algorithms.registry import Registry


if TYPE_CHECKING:
    import torch

    from easyr1.workers.rollout.base import RolloutEngine


@dataclass(frozen=True)
class EngineSetup:
    """What the hybrid worker hands an engine builder.

    Attributes:
        config: the run's ``PPOConfig``.
        dtype: the engine's weights dtype.
        pad_token_id: the id responses are padded with.
        eos_token_ids: the ids that end a response.
        banned_token_ids: ids never sampled (the vision placeholders).
        device: the worker's device type ("cpu" or "cuda").
        cpu_kv_cache_bytes: computes the KV-cache size of an engine on CPU (reads the model's config).
        show_progress: whether this engine shows a generation progress bar.
    """

    config: Any
    dtype: torch.dtype
    pad_token_id: int
    eos_token_ids: list[int]
    banned_token_ids: list[int]
    device: str
    cpu_kv_cache_bytes: Callable[[], int]
    show_progress: bool


EngineBuilder = Callable[[EngineSetup], "RolloutEngine"]

ROLLOUT_ENGINES: Registry[EngineBuilder] = Registry("rollout engine", "worker.rollout.name")


def register_rollout_engine(name: str, *, tensor_parallel: bool) -> Callable[[EngineBuilder], EngineBuilder]:
    """Decorator registering an engine builder as ``name``; ``tensor_parallel``: whether the engine can be shared
    by ``worker.rollout.tensor_parallel_size`` workers (else each worker holds a whole model)."""
    return ROLLOUT_ENGINES.register(name, traits=tensor_parallel)


def supports_tensor_parallel(name: str) -> bool:
    """Whether the engine registered as ``name`` runs over a tensor-parallel group (ConfigError if unknown)."""
    return ROLLOUT_ENGINES.traits(name)


def build_rollout_engine(setup: EngineSetup) -> RolloutEngine:
    """The engine named by ``worker.rollout.name``, built by its registered builder."""
    return ROLLOUT_ENGINES.get(setup.config.worker.rollout.name)(setup)


@register_rollout_engine("vllm", tensor_parallel=True)
def _build_vllm(setup: EngineSetup) -> RolloutEngine:
    from easyr1.workers.rollout.vllm_rollout import VLLMRollout

    config = setup.config
    rollout, model = config.worker.rollout, config.worker.actor.model
    return VLLMRollout(
        model.model_path,
        model.tokenizer_path,
        dtype=setup.dtype,
        max_model_len=rollout.max_model_len or (config.data.max_prompt_length + config.data.max_response_length),
        tensor_parallel_size=rollout.tensor_parallel_size,
        seed=rollout.seed,
        pad_token_id=setup.pad_token_id,
        banned_token_ids=setup.banned_token_ids,
        limit_images=rollout.limit_images,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        enforce_eager=rollout.enforce_eager,
        enable_chunked_prefill=rollout.enable_chunked_prefill,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        block_size=rollout.block_size,
        cpu_kv_cache_bytes=setup.cpu_kv_cache_bytes(),
        trust_remote_code=rollout.trust_remote_code,
        disable_log_stats=rollout.disable_log_stats,
        override_config=model.override_config,
        show_progress=setup.show_progress,
    )


@register_rollout_engine("hf", tensor_parallel=False)
def _build_hf(setup: EngineSetup) -> RolloutEngine:
    from easyr1.workers.rollout.hf_rollout import HFRollout

    model = setup.config.worker.actor.model
    return HFRollout(
        model.model_path,
        dtype=setup.dtype,
        pad_token_id=setup.pad_token_id,
        eos_token_ids=setup.eos_token_ids,
        banned_token_ids=setup.banned_token_ids,
        device=setup.device,
        override_config=model.override_config,
        show_progress=setup.show_progress,
    )
