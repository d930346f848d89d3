"""The rollout engine on one worker: its weights, its KV cache and how many sequences that cache holds.

On GPU vLLM claims ``gpu_memory_utilization`` of the device's memory for weights (``1 / tensor_parallel_size`` of the
model at ``worker.rollout.dtype``), its non-KV overhead (:data:`VLLM_GPU_OVERHEAD_BYTES`) and the KV cache, which
gets the rest; the engine sleeps (level 2: weights and cache released) outside generation. On CPU vLLM's cache is
sized for the work (:func:`easyr1.engines.vllm_engine.cpu_kv_cache_bytes`, or
``worker.rollout.cpu_kv_cache_gb``) and nothing is released between rollouts. The HF engine keeps an unsharded
copy of the model and a KV cache for the rows of one ``generate`` (at most the experience micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from easyr1.config.schedule import generating_prompts, generating_workers
from easyr1.engines.vllm_engine import cpu_kv_cache_bytes
from easyr1.models.loading import resolve_dtype
from easyr1.plan.model_size import ModelSize
from easyr1.plan.states import dtype_bytes


GIB = 2**30
# vLLM on GPU beyond weights and KV cache: the profiled activation peak at max_num_batched_tokens, CUDA graphs,
# the sampler's buffers and the encoder cache; vLLM's own profiling reports 1-3 GiB for 3B-32B models.
VLLM_GPU_OVERHEAD_BYTES = 2 * GIB


@dataclass(frozen=True)
class EnginePlan:
    """One worker's engine: ``weight_bytes`` and ``kv_bytes`` on its device, ``claimed_bytes`` in all while it is
    awake, ``kv_bytes_per_sequence`` for one prompt + response, ``sequences`` it holds at once and
    ``rows`` it is asked to generate per step, ``releases`` whether it frees its memory while asleep."""

    dtype: torch.dtype
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    kv_bytes_per_sequence: int
    rows: int
    releases: bool

    @property
    def claimed_bytes(self) -> int:
        """Device bytes while generating."""
        return self.weight_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def sequences(self) -> int:
        """Sequences of prompt + response length the KV cache holds at once."""
        return self.kv_bytes // max(self.kv_bytes_per_sequence, 1)


def engine_dtype(config: Any, actor_compute: torch.dtype, device: str) -> torch.dtype:
    """``worker.rollout.dtype``, or the actor's compute dtype when null."""
    name = config.worker.rollout.dtype
    return resolve_dtype(name, device) if name else actor_compute


def plan_engine(config: Any, size: ModelSize, dtype: torch.dtype, device_kind: str, device_memory: int) -> EnginePlan:
    """The engine of one worker that generates (every worker, or a split placement's generator) for ``config`` on a
    device of ``device_memory`` bytes, sized for the responses generating at once (partial_rollout's pool)."""
    rollout, data = config.worker.rollout, config.data
    world = generating_workers(config)
    prompts = generating_prompts(config)
    tp = rollout.tensor_parallel_size
    text = size.text
    element = dtype_bytes(dtype)
    length = rollout.max_model_len or data.max_prompt_length + data.max_response_length
    kv_heads = max(text.kv_heads // tp, 1)  # fewer KV heads than TP ranks: vLLM replicates them
    # linear-attention layers keep a fixed state per sequence instead of a cache growing with its length
    linear_state = text.linear_layers * text.linear_state * element
    per_sequence = text.attention_layers * 2 * kv_heads * text.head_dim * element * length + linear_state
    rows = -(-prompts * rollout.n // world) * tp
    if rollout.name == "hf":
        # an unsharded copy per worker (no tensor parallelism), and a cache for one generate's rows: the engine runs
        # its rows in batches of the experience micro-batch (engines/hf_engine.py)
        own_rows = -(-prompts * rollout.n // world)
        batch_rows = min(own_rows, config.worker.actor.micro_batch_size_per_device_for_experience)
        full_sequence = text.attention_layers * 2 * text.kv_heads * text.head_dim * element * length + linear_state
        return EnginePlan(dtype, size.total * element, batch_rows * full_sequence, 0, full_sequence, batch_rows, False)
    weights = size.total * element // tp
    if device_kind == "cuda":
        claimed = int(rollout.gpu_memory_utilization * device_memory)
        kv = max(claimed - weights - VLLM_GPU_OVERHEAD_BYTES, 0)
        return EnginePlan(dtype, weights, kv, VLLM_GPU_OVERHEAD_BYTES, per_sequence, rows, True)
    if rollout.cpu_kv_cache_gb is not None:
        kv = int(rollout.cpu_kv_cache_gb * GIB)
    else:
        text_config = SimpleNamespace(
            num_key_value_heads=text.kv_heads,
            num_attention_heads=text.heads,
            head_dim=text.head_dim,
            hidden_size=text.hidden,
            num_hidden_layers=text.layers,
        )
        kv = cpu_kv_cache_bytes(text_config, rows, length, dtype)
    # kv_cache_memory_bytes is what each rank of the TP group allocates (and touches: it is resident at once)
    return EnginePlan(dtype, weights, kv, 0, per_sequence, rows, False)


def plan_reward_model(
    config: Any, size: ModelSize, dtype: torch.dtype, device_kind: str, device_memory: int
) -> EnginePlan:
    """One worker's reward model (``worker.reward_model``), a whole copy per worker: a judge on vLLM claims
    ``gpu_memory_utilization`` of the device while it judges and sleeps (level 1) otherwise, on CPU its weights and
    ``cpu_kv_cache_gb`` stay; a judge on the HF engine or a classifier holds its weights (and one request's KV cache,
    or ``micro_batch_size`` sequences' activations, counted as KV here), moved off the GPU between steps."""
    settings, text = config.worker.reward_model, size.text
    element = dtype_bytes(dtype)
    weights = size.total * element
    length = settings.max_model_len
    per_sequence = text.layers * 2 * text.kv_heads * text.head_dim * element * length
    on_gpu = device_kind == "cuda"
    engine = settings.engine or config.worker.rollout.name
    if settings.kind == "judge" and engine == "vllm":
        if on_gpu:
            claimed = int(settings.gpu_memory_utilization * device_memory)
            kv = max(claimed - weights - VLLM_GPU_OVERHEAD_BYTES, 0)
            return EnginePlan(dtype, weights, kv, VLLM_GPU_OVERHEAD_BYTES, per_sequence, 1, True)
        return EnginePlan(dtype, weights, int(settings.cpu_kv_cache_gb * GIB), 0, per_sequence, 1, False)
    rows = 1 if settings.kind == "judge" else settings.micro_batch_size
    return EnginePlan(dtype, weights, rows * per_sequence, 0, per_sequence, rows, on_gpu)
