"""One ``HybridWorker`` driven in this process, without Ray or vLLM: the GPU test suite's training harness.

The GPU test machines have torch and transformers but neither Ray nor vLLM, so the suite runs rank 0 of a one-rank
process group (``cpu:gloo,cuda:nccl`` on CUDA, as the Ray workers create it) here, with the HF rollout engine, and
plays the driver's part of a GRPO step itself: generate -> reward (the reward file, called directly) -> old
log-probs -> advantages -> update. The worker's code is the production code; only Ray's dispatch is left out.

With ``EASYR1_GPU_TESTS_ON_CPU=1`` the same harness runs on CPU (gloo), which is how it is checked where no GPU is.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from easyr1.algorithms import compute_advantages, place_scores_on_last_token, rollout_mismatch_metrics
from easyr1.config import PPOConfig, load_config
from easyr1.data import RLDataset, collate_fn
from easyr1.distributed.fsdp import full_tensor
from easyr1.distributed.worker import pick_backend
from easyr1.models.loading import load_model_config
from easyr1.protocol import ACTOR_FIELDS, Batch
from easyr1.reward import load_reward_function
from easyr1.workers.hybrid_worker import HybridWorker


REPO = Path(__file__).resolve().parents[2]
ON_CPU = os.environ.get("EASYR1_GPU_TESTS_ON_CPU") == "1"
DEVICE = "cpu" if ON_CPU or not torch.cuda.is_available() else "cuda"
PROBE_PARAMETER = "model.language_model.layers.0.self_attn.q_proj.weight"


def build_config(model_dir: Path, data_dir: Path, *overrides: str) -> PPOConfig:
    """``examples/config_cpu.yaml`` for one in-process worker with the HF engine: 4 prompts x 4 samples a step."""
    return load_config(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.actor.model.model_path={model_dir}",
            f"data.train_files={data_dir / 'train.jsonl'}",
            f"data.val_files={data_dir / 'val.jsonl'}",
            f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
            f"trainer.device={DEVICE}",
            "trainer.n_gpus_per_node=1",
            "worker.rollout.name=hf",
            "worker.rollout.n=4",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=4",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.actor.micro_batch_size_per_device_for_experience=8",
            *overrides,
        ]
    )


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class StepRecord:
    """What one step produced, for the tests to check."""

    metrics: dict[str, float]
    batch: Batch
    probe_before: torch.Tensor
    probe_after: torch.Tensor
    result_devices: set[str] = field(default_factory=set)
    update_peak_bytes: int | None = None  # CUDA's peak allocated bytes during the actor's update (None on CPU)


class InProcessRun:
    """Rank 0 of a one-rank process group holding a :class:`HybridWorker`, plus the driver's side of a step."""

    def __init__(self, config: PPOConfig) -> None:
        self.config = config
        self.worker = HybridWorker(config)
        threads = 8 if DEVICE == "cuda" else 1
        # the worker's own set-up: rank environment, thread count, device, and the process group Ray workers join
        self.worker.init_distributed(0, 1, "127.0.0.1", free_port(), threads, pick_backend(DEVICE))
        self.worker.init_models()
        self.tokenizer = self.worker.tokenizer
        model = config.worker.actor.model
        data = config.data
        self.dataset = RLDataset.from_config(
            data, data.train_files, self.tokenizer, self.worker.processor, load_model_config(model.model_path)
        )
        reward = config.worker.reward
        # the reward file called in this process (the trainer calls it in a Ray actor)
        self.reward_fn = load_reward_function(
            reward.reward_function, reward.reward_function_kwargs, reward.reward_type
        )

    def close(self) -> None:
        """Leave the process group (the models go with the worker)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def prompts(self, step: int) -> Batch:
        """The ``rollout_batch_size`` prompts of ``step`` (1-based), in dataset order."""
        size = self.config.data.rollout_batch_size
        return collate_fn([self.dataset[(step - 1) * size + i] for i in range(size)])

    def probe(self) -> torch.Tensor:
        """A full copy of one actor weight, on the host."""
        parameters = dict(self.worker.actor.model.named_parameters())
        return full_tensor(parameters[PROBE_PARAMETER].detach()).float().cpu().clone()

    def step(self, step: int) -> StepRecord:
        """One GRPO step on the worker; returns its metrics and the batch with every field filled."""
        config = self.config
        rollout = config.worker.rollout
        prompts = self.prompts(step)
        prompts["uid"] = np.array([f"{step}-{i}" for i in range(len(prompts))], dtype=object)
        batch = prompts.repeat(rollout.n, interleave=True)
        batch["sample_seed"] = torch.arange(len(batch)) + step * len(batch)
        sampling = {
            "temperature": rollout.temperature,
            "top_p": rollout.top_p,
            "top_k": rollout.top_k,
            "max_tokens": config.data.max_response_length,
            "ignore_eos": rollout.ignore_eos,
        }
        batch = self.worker.generate(batch, sampling)
        result_devices = {str(value.device.type) for value in batch.tensors.values()}

        lengths = batch["response_mask"].sum(dim=-1)
        texts = self.tokenizer.batch_decode(
            [ids[:length].tolist() for ids, length in zip(batch["responses"], lengths)], skip_special_tokens=True
        )
        scores = self.reward_fn(
            [
                {"response": text, "response_length": int(length), "ground_truth": truth}
                for text, length, truth in zip(texts, lengths.tolist(), batch["ground_truth"])
            ]
        )
        overall = torch.tensor([float(score["overall"]) for score in scores])

        actor_view = batch.select(*ACTOR_FIELDS)
        old = self.worker.compute_old_log_probs(actor_view, rollout.temperature)
        result_devices |= {str(value.device.type) for value in old.tensors.values()}
        batch = batch.union(old)
        mask = batch["response_mask"]
        mismatch = rollout_mismatch_metrics(batch["old_log_probs"], batch["rollout_log_probs"], mask)
        metrics: dict[str, Any] = {f"rollout/{key}": value for key, value in mismatch.items()}
        batch["token_level_rewards"] = place_scores_on_last_token(overall, mask)
        algorithm = config.algorithm
        batch["advantages"], batch["returns"] = compute_advantages(
            algorithm.adv_estimator,
            token_level_rewards=batch["token_level_rewards"],
            response_mask=mask,
            index=batch["uid"],
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            norm_adv_by_std=algorithm.norm_adv_by_std,
        )
        before = self.probe()
        update_view = batch.select(*ACTOR_FIELDS, "old_log_probs", "advantages")
        mini_batch_size = config.worker.actor.global_batch_size * rollout.n
        if DEVICE == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        metrics.update(self.worker.update_actor(update_view, rollout.temperature, mini_batch_size))
        update_peak = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else None
        metrics["reward/overall"] = overall.mean().item()
        return StepRecord(metrics, batch, before, self.probe(), result_devices, update_peak)
