"""``worker.rollout.dtype``: an explicit value wins; null follows the dtype the actor computes in."""

from __future__ import annotations

import torch

from easyr1.config import FSDPConfig, load_config
from easyr1.distributed.precision import resolve_precision
from easyr1.workers.hybrid_worker import engine_dtype


def test_null_is_the_actor_compute_dtype():
    cpu = resolve_precision(FSDPConfig(), "cpu", "actor")
    assert engine_dtype(None, cpu.compute) == torch.float32  # CPU: fp32 weights, no mixed precision
    # GPU: fp32 master weights computing in bf16, so the engine samples in bf16, as the actor scores
    gpu = resolve_precision(FSDPConfig(), "cuda", "actor")
    assert (gpu.storage, gpu.compute) == (torch.float32, torch.bfloat16)
    assert engine_dtype(None, gpu.compute) == torch.bfloat16


def test_an_explicit_dtype_wins():
    assert engine_dtype("fp32", torch.bfloat16) == torch.float32
    assert engine_dtype("bfloat16", torch.float32) == torch.bfloat16


def test_config_default_is_null_and_an_explicit_value_is_kept():
    required = ["worker.actor.model.model_path=/models/tiny", "worker.reward.reward_function=/rewards/r.py:score"]
    assert load_config(required).worker.rollout.dtype is None
    assert load_config([*required, "worker.rollout.dtype=bf16"]).worker.rollout.dtype == "bf16"
