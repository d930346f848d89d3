"""The ``worker.rollout`` section: the generation engine and its sampling settings, with their checks.

Engine names are checked against :data:`easyr1.engines.ENGINES` (importing it imports no engine library).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from easyr1.config.fields import mirror, mirror_source, option
from easyr1.config.rules import (
    AT_LEAST_ONE,
    AT_LEAST_ONE_OR_NULL,
    DTYPE_NAMES,
    MINUS_ONE_OR_AT_LEAST_ONE,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE_OR_NULL,
    one_of,
)
from easyr1.engines import ENGINES


@dataclass
class RolloutConfig:
    """The generation engine that samples responses."""

    name: str = option("vllm", f"engine: {', '.join(ENGINES.names())}")
    n: int = option(5, "responses sampled per prompt")
    temperature: float = option(1.0, "sampling temperature")
    top_p: float = option(1.0, "nucleus sampling threshold")
    top_k: int = option(-1, "sample from the k most likely tokens (-1: all)")
    seed: int = option(1, "sampling seed")
    limit_images: int = option(0, "most images per prompt the engine accepts (0: no limit)")
    dtype: str | None = option(
        None, "dtype of the engine's weights (null: the actor's compute dtype, mixed-precision param dtype if any)"
    )
    gpu_memory_utilization: float = option(0.6, "fraction of GPU memory vLLM may use")
    ignore_eos: bool = option(False, "keep generating after the end-of-sequence token")
    enforce_eager: bool = option(
        False,
        "run vLLM's model without compiling it: no CUDA graphs on GPU, no torch.compile on CPU (starts ~25 s sooner "
        "on CPU, generates ~20-30% slower)",
    )
    enable_chunked_prefill: bool = option(False, "let vLLM split long prefills into chunks")
    tensor_parallel_size: int = option(2, "workers sharing one engine by tensor parallelism")
    max_model_len: int | None = option(None, "longest prompt + response the engine handles (null: from lengths)")
    max_num_batched_tokens: int = option(8192, "most tokens vLLM processes in one scheduler step")
    block_size: int | None = option(
        None,
        "tokens per block of vLLM's KV cache (null: 32 on CPU, vLLM's own choice on GPU). vLLM shares whole blocks "
        "of a prompt between its n samples, so smaller blocks share more of its prefill; vLLM's CPU attention takes "
        "multiples of 32, its GPU kernels multiples of 16",
    )
    load_format: str = option(
        "dummy",
        "how vLLM fills its weights at start: 'dummy' reads no checkpoint (random values, which the actor's weight "
        "sync before the first rollout replaces and must prove it wrote, parameter by parameter), 'auto' loads the "
        "checkpoint first (verl's rollout.load_format)",
    )
    disable_log_stats: bool = option(True, "silence vLLM's periodic statistics")
    disable_tqdm: bool = option(False, "hide rank 0's generation progress bar")
    val_override_config: dict[str, Any] = option({}, "rollout keys changed for validation, e.g. {temperature: 0.6}")
    cpu_kv_cache_gb: float | None = option(
        None,
        "GiB of KV cache for vLLM on CPU (null: sized for one engine's share of a rollout batch at max_model_len; "
        "a larger batch, e.g. validation, then waits in vLLM's queue)",
    )
    trust_remote_code: bool = mirror(False, "worker.actor.model.trust_remote_code")
    prompt_length: int = mirror(512, "data.max_prompt_length")
    response_length: int = mirror(512, "data.max_response_length")


# worker.rollout.load_format: vLLM's formats easyr1 starts an engine with (vllm_engine.VLLMEngine)
LOAD_FORMATS = ("dummy", "auto")

# Value rules of single keys, relative to ``worker.rollout``.
ROLLOUT_RANGES = {
    "n": AT_LEAST_ONE,
    "temperature": (lambda v: v > 0, "positive for training (greedy validation: val_override_config)"),
    "top_p": OPEN_UNIT,
    "top_k": MINUS_ONE_OR_AT_LEAST_ONE,
    "limit_images": NON_NEGATIVE,
    "gpu_memory_utilization": OPEN_UNIT,
    "tensor_parallel_size": AT_LEAST_ONE,
    "max_model_len": AT_LEAST_ONE_OR_NULL,
    "max_num_batched_tokens": AT_LEAST_ONE,
    "block_size": (lambda v: v is None or (v > 0 and v % 16 == 0), "a positive multiple of 16, or null"),
    "cpu_kv_cache_gb": POSITIVE_OR_NULL,
}


def check_rollout_names(rollout: RolloutConfig, problems: list[str]) -> None:
    """The engine name (a registered engine) and the engine's dtype name."""
    one_of(problems, "worker.rollout.name", rollout.name, ENGINES.names())
    one_of(problems, "worker.rollout.load_format", rollout.load_format, LOAD_FORMATS)
    if rollout.dtype is not None:
        one_of(problems, "worker.rollout.dtype", rollout.dtype, DTYPE_NAMES)


def check_val_override(rollout: RolloutConfig, problems: list[str]) -> None:
    """Every key of ``val_override_config`` must be a rollout key the user may set (not a derived one)."""
    rollout_keys = [item.name for item in dataclasses.fields(RolloutConfig) if mirror_source(item) is None]
    for name in rollout.val_override_config:
        if name not in rollout_keys:
            close = difflib.get_close_matches(name, rollout_keys, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(rollout_keys)}"
            problems.append(f"worker.rollout.val_override_config has unknown rollout key '{name}'{hint}")
