"""The GPU check drives the product's loop: ``build_trainer`` with ``trainer.single_process`` (one worker in this
process, no Ray) and the HF engine (no vLLM), then ``Trainer.train_step`` step by step.

The GPU test machines have torch and transformers but neither Ray nor vLLM; nothing here needs them, and with
``EASYR1_GPU_TESTS_ON_CPU=1`` (how ``make test`` runs this directory) the conftest makes both unimportable, so the
check cannot come to depend on them unnoticed. The configs start from ``examples/config.yaml``, EasyR1's GPU recipe
(KL loss against a reference with FSDP CPU offload, rank-0 init, actor parameter and optimizer offload, padding-free
dynamic micro-batches, ``use_torch_compile``), with a bf16 engine; only paths, sizes and the engine name change.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from easyr1.build import build_trainer
from easyr1.config import PPOConfig, load_config
from easyr1.distributed.fsdp import full_tensor
from easyr1.protocol import Batch


REPO = Path(__file__).resolve().parents[2]
ON_CPU = os.environ.get("EASYR1_GPU_TESTS_ON_CPU") == "1"
DEVICE = "cpu" if ON_CPU or not torch.cuda.is_available() else "cuda"
# the probe: a trainable weight of the first attention block (the layer's own weight, or with LoRA its adapter's)
PROBE_MODULE = "layers.0.self_attn.q_proj"


def recipe_config(model_dir: Path, data_dir: Path, run_dir: Path, *overrides: str) -> PPOConfig:
    """``examples/config.yaml`` on the tiny model and shape data, one worker in this process, the HF engine in bf16:
    4 prompts x 4 samples of up to 8 tokens a step, one optimizer step each, an entropy bonus."""
    return load_config(
        [
            f"config={REPO / 'examples' / 'config.yaml'}",
            f"worker.actor.model.model_path={model_dir}",
            f"data.train_files={data_dir / 'train.jsonl'}",
            f"data.val_files={data_dir / 'val.jsonl'}",
            "data.format_prompt=null",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "data.min_pixels=3136",
            "data.max_pixels=3136",
            "data.rollout_batch_size=4",
            f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
            "worker.rollout.name=hf",
            "worker.rollout.tensor_parallel_size=1",
            "worker.rollout.n=4",
            # bf16 as the recipe runs on a GPU; on the CPU (the suite's CPU-runnable part) fp32: bf16 matmuls there
            # made generation 4x slower (0.52 s a sample), and the CPU run checks the code path, not bf16 numerics
            f"worker.rollout.dtype={'bf16' if DEVICE == 'cuda' else 'float32'}",
            "worker.actor.global_batch_size=4",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.micro_batch_size_per_device_for_experience=8",
            "worker.actor.optim.lr=1e-4",
            # a gradient at every step, also when a step's rewards are all equal (the untrained tiny model's often are)
            "worker.actor.entropy_coeff=0.01",
            "worker.rollout.disable_tqdm=true",
            "trainer.single_process=true",
            "trainer.n_gpus_per_node=1",
            f"trainer.device={DEVICE}",
            "trainer.logger=[file]",
            f"trainer.save_checkpoint_path={run_dir}",
            "trainer.val_before_train=false",
            "trainer.val_freq=-1",
            "trainer.save_freq=-1",
            "trainer.max_steps=3",
            *overrides,
        ]
    )


@dataclass
class StepRecord:
    """What one step produced, for the tests to check."""

    metrics: dict[str, float]
    probe_before: torch.Tensor
    probe_after: torch.Tensor
    result_devices: set[str] = field(default_factory=set)
    update_peak_bytes: int | None = None  # CUDA's peak allocated bytes during the actor's update (None on CPU)


class LoopRun:
    """A trainer built as ``python -m easyr1.main`` builds it, stepped by the test; records what the workers returned
    (their tensors' devices) and, on CUDA, the update's peak memory."""

    def __init__(self, config: PPOConfig) -> None:
        self.trainer = build_trainer(config)
        self.worker = self.trainer.workers.worker
        self.result_devices: set[str] = set()
        group = self.trainer.workers
        run_split = group.run_split

        def recording(method: Any, batch: Batch, *args: Any, **kwargs: Any) -> Any:
            if DEVICE == "cuda" and method.__name__.startswith("update_actor"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            result = run_split(method, batch, *args, **kwargs)
            if DEVICE == "cuda" and method.__name__.startswith("update_actor"):
                self.update_peak = torch.cuda.max_memory_allocated()
            for value in result if isinstance(result, list) else [result]:
                batches = [
                    part for part in (value if isinstance(value, tuple) else (value,)) if isinstance(part, Batch)
                ]
                self.result_devices |= {tensor.device.type for part in batches for tensor in part.tensors.values()}
            return result

        group.run_split = recording  # the stage holds the same group: its generate calls are recorded too
        self.update_peak: int | None = None
        self.probe_name = next(
            name
            for name, param in self.worker.actor.model.named_parameters()
            if PROBE_MODULE in name and name.endswith("weight") and param.requires_grad
        )

    def probe(self, name: str | None = None) -> torch.Tensor:
        """A full copy of one actor weight (default: the probe), on the host."""
        parameters = dict(self.worker.actor.model.named_parameters())
        return full_tensor(parameters[name or self.probe_name].detach()).float().cpu().clone()

    def step(self) -> StepRecord:
        """The trainer's next step, as ``Trainer.fit`` runs it (without validation, logging or saving)."""
        step = self.trainer.global_step + 1
        self.result_devices = set()
        before = self.probe()
        metrics = self.trainer.train_step(self.trainer.step_prompts(), step)
        self.trainer.global_step = step
        return StepRecord(metrics, before, self.probe(), self.result_devices, self.update_peak)

    def close(self) -> None:
        """Stop the worker (models, engine, process group)."""
        self.trainer.shutdown()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def run_steps(config: PPOConfig, steps: int) -> list[StepRecord]:
    """``steps`` steps of a fresh trainer of ``config``."""
    run = LoopRun(config)
    try:
        return [run.step() for _ in range(steps)]
    finally:
        run.close()


def finite(metrics: dict[str, float], *keys: str) -> bool:
    """Whether every named metric is present and finite."""
    return all(key in metrics and math.isfinite(metrics[key]) for key in keys)
