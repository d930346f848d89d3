"""Host memory that does not come from the model: the worker and driver processes themselves, the dataset, the
batch in Ray's object store.

The process bases are measurements (``perf/max_host_memory_gb`` and ``perf/driver_max_host_memory_gb`` of tiny-model
runs, where the model adds a few MB; ``bench/plan_vs_measured.py`` checks them): python, torch, transformers, Ray's
worker runtime and, for a vLLM worker, vLLM with its engine core. On GPU the base adds the CUDA context and vLLM's
pinned buffers; that figure is stated, not measured here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


GIB = 2**30
MIB = 2**20

# Resident memory of one CPU worker process before the model's own bytes: with vLLM (eager) and with the HF engine.
# Fit to the 0.6M-parameter runs of bench/plan_vs_measured.py (2026-11-23: 0.80 / 0.84 GiB measured with vLLM,
# 0.54 with the HF engine, of which the plan's model part is 0.07-0.10 GiB).
CPU_WORKER_BASE_VLLM = int(0.73 * GIB)
CPU_WORKER_BASE_HF = int(0.47 * GIB)
# vLLM's torch.compile of its model (enforce_eager=false) on CPU: inductor's compiled code and caches.
CPU_VLLM_COMPILE = int(0.10 * GIB)
# A GPU worker: torch + CUDA context, vLLM, NCCL and pinned staging buffers (stated, typical of 8-GPU nodes).
GPU_WORKER_BASE = 6 * GIB
# The driver: tokenizer, processor, dataloader, trackers (measured 0.49-0.56 GiB on tiny-model runs).
DRIVER_BASE = int(0.55 * GIB)
# What a batch takes in Ray's object store per token of every sample (int64 ids, masks, positions, log-probs, ...).
OBJECT_STORE_BYTES_PER_TOKEN = 96


def worker_base_bytes(config: Any, on_gpu: bool) -> int:
    """Resident bytes of one worker process with no model in it."""
    if on_gpu:
        return GPU_WORKER_BASE
    rollout = config.worker.rollout
    if rollout.name == "hf":
        return CPU_WORKER_BASE_HF
    return CPU_WORKER_BASE_VLLM + (0 if rollout.enforce_eager else CPU_VLLM_COMPILE)


def dataset_bytes(config: Any) -> int:
    """Bytes of the training and validation files when they are local files or folders (the driver reads them and
    keeps their rows; images are read per batch), else 0: a hub dataset's size is not known before it is read."""
    total = 0
    for spec in (config.data.train_files, config.data.val_files):
        path = Path(str(spec).split("@", 1)[0])
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            total += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return total


def driver_bytes(config: Any) -> int:
    """The driver process: its base and the dataset's rows."""
    return DRIVER_BASE + dataset_bytes(config)


def object_store_bytes(config: Any, on_gpu: bool) -> int:
    """Ray's object store on a node: a step's batch once (CPU runs cap the store at 512 MiB, ``easyr1.main``)."""
    data, rollout = config.data, config.worker.rollout
    samples = data.rollout_batch_size * rollout.n * config.env.rows_per_episode
    used = samples * (data.max_prompt_length + data.max_response_length) * OBJECT_STORE_BYTES_PER_TOKEN
    return used if on_gpu else min(used, 512 * MIB)


def cpu_count() -> int:
    """Cores of this machine (for the notes of a CPU plan)."""
    return os.cpu_count() or 1
