"""Settings that would make a run fit: each candidate change is planned again, and those that fit are offered.

Candidates, in the order they cost the least: smaller micro-batches, gradient checkpointing, offloading (GPU), a
lower ``gpu_memory_utilization`` or a larger tensor-parallel size when generation is the peak, bf16 AdamW moments,
shorter responses, shorter prompts. When no single change fits, they are combined in that order until the plan fits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from easyr1.plan.plan import Plan


def _set(config: Any, key: str, value: Any) -> None:
    target = config
    *parents, last = key.split(".")
    for part in parents:
        target = getattr(target, part)
    setattr(target, last, value)


def _get(config: Any, key: str) -> Any:
    target = config
    for part in key.split("."):
        target = getattr(target, part)
    return target


def _divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` not above ``limit`` (0 when ``limit`` < 1): micro-batches must divide a
    worker's share."""
    return max((d for d in range(1, max(limit, 0) + 1) if total % d == 0), default=0)


def candidates(config: Any, plan: Plan) -> list[dict[str, Any]]:
    """Changes worth trying for ``config``, each a ``{key: value}`` of overrides."""
    actor = "worker.actor"
    found: list[dict[str, Any]] = []
    rows_per_prompt = config.worker.rollout.n * config.env.rows_per_episode
    samples = config.data.rollout_batch_size * rows_per_prompt
    mini_batch = config.worker.actor.global_batch_size * rows_per_prompt // plan.world
    update_mb = plan.update_batch.samples
    for smaller in dict.fromkeys((_divisor_at_most(mini_batch, update_mb // 2), 1)):
        if 0 < smaller < update_mb:
            found.append({f"{actor}.micro_batch_size_per_device_for_update": smaller})
    exp_mb = plan.experience_batch.samples
    smaller = _divisor_at_most(-(-samples // plan.world), exp_mb // 4)
    if 0 < smaller < exp_mb:
        found.append({f"{actor}.micro_batch_size_per_device_for_experience": smaller})
    if not config.worker.actor.model.enable_gradient_checkpointing:
        found.append({f"{actor}.model.enable_gradient_checkpointing": True})
    if plan.device.on_gpu:
        offload = {}
        for role in plan.states:
            section = "worker.ref" if role == "ref" else f"worker.{role}"
            if not _get(config, f"{section}.offload.offload_params"):
                offload[f"{section}.offload.offload_params"] = True
            if role != "ref" and not _get(config, f"{section}.offload.offload_optimizer"):
                offload[f"{section}.offload.offload_optimizer"] = True
        if offload:
            found.append(offload)
        rollout = config.worker.rollout
        if plan.peak_phase.name == "generation":
            if rollout.gpu_memory_utilization > 0.35:
                found.append({"worker.rollout.gpu_memory_utilization": round(rollout.gpu_memory_utilization - 0.1, 2)})
            tp = rollout.tensor_parallel_size * 2
            if tp <= config.trainer.n_gpus_per_node and config.trainer.n_gpus_per_node % tp == 0:
                found.append({"worker.rollout.tensor_parallel_size": tp})
    if config.worker.actor.optim.strategy != "adamw_bf16":
        found.append({f"{actor}.optim.strategy": "adamw_bf16"})
    if config.data.max_response_length > 256:
        found.append({"data.max_response_length": config.data.max_response_length // 2})
    if config.data.max_prompt_length > 256:
        found.append({"data.max_prompt_length": config.data.max_prompt_length // 2})
    return found


def apply(config: Any, overrides: dict[str, Any]) -> Any:
    """A copy of ``config`` with ``overrides`` set (mirrored keys follow their sources)."""
    changed = copy.deepcopy(config)
    for key, value in overrides.items():
        _set(changed, key, value)
    rollout = changed.worker.rollout
    rollout.prompt_length, rollout.response_length = changed.data.max_prompt_length, changed.data.max_response_length
    return changed


def suggest(config: Any, plan: Plan, replan: Callable[[Any], Plan], limit: int = 4) -> list[tuple[dict, Plan]]:
    """Up to ``limit`` changes that make ``config`` fit, each with its plan; a combination when no single one does;
    empty when the run already fits or nothing tried fits."""
    if plan.fits:
        return []
    tried = [(change, replan(apply(config, change))) for change in candidates(config, plan)]
    fitting = [(change, result) for change, result in tried if result.fits]
    if fitting:
        return fitting[:limit]
    combined: dict[str, Any] = {}
    for change, _ in tried:
        combined.update(change)
        result = replan(apply(config, combined))
        if result.fits:
            return [(dict(combined), result)]
    return []
