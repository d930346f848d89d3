"""The RL loop, readable top to bottom.

One step: take a batch of prompts, repeat each ``n`` times, let the workers generate responses
(vLLM or HF, with the actor's current weights), score them with the reward function (in a Ray actor,
overlapping the next two calls), recompute the old log-probs (and the reference's), compute the
advantages on the driver, update the policy on the workers, and log the metrics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from tqdm import tqdm

from easyr1.algorithms import compute_advantages, kl_penalty, masked_mean
from easyr1.config import PPOConfig
from easyr1.data import RLDataset, collate_fn
from easyr1.distributed import WorkerGroup
from easyr1.distributed.worker import device_type, pick_backend
from easyr1.errors import UserError
from easyr1.logging import build_trackers
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.protocol import Batch
from easyr1.workers.hybrid_worker import HybridWorker
from easyr1.workers.reward import load_reward_function
from easyr1.workers.reward_actor import RewardActor


# What the actor's forward needs; the rest of the batch (images for vLLM, strings) stays on the driver.
ACTOR_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "multi_modal_inputs")


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the block to ``timings[name]``."""
    start = time.perf_counter()
    yield
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def place_scores_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence scores -> (B, R) token rewards with the score on each response's last valid token."""
    token_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(dim=-1) - 1).clamp(min=0)
    token_rewards[torch.arange(len(scores)), last] = scores.float()
    return token_rewards


class Trainer:
    """Single-controller RL trainer: the driver owns data, rewards and advantages; workers own the models."""

    def __init__(self, config: PPOConfig) -> None:
        self.config = config
        model = config.worker.actor.model
        self.tokenizer, self.processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
        # Everything that can fail on bad input happens before the workers load any model.
        load_reward_function(
            config.worker.reward.reward_function,
            config.worker.reward.reward_function_kwargs,
            config.worker.reward.reward_type,
        )
        model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
        self.train_dataset = RLDataset.from_config(
            config.data, config.data.train_files, self.tokenizer, self.processor, model_config
        )
        self.train_loader = self._make_loader(self.train_dataset, config.data.rollout_batch_size, config.data.shuffle)
        steps_per_epoch = len(self.train_loader)
        if steps_per_epoch == 0:
            raise UserError(
                f"data.train_files ({config.data.train_files}) has {len(self.train_dataset)} usable rows, fewer than "
                f"data.rollout_batch_size={config.data.rollout_batch_size}; lower the batch size or add data"
            )
        self.total_steps = config.trainer.max_steps or steps_per_epoch * config.trainer.total_epochs
        config.worker.actor.optim.training_steps = self.total_steps
        self.log_dir = Path(config.trainer.log_dir)
        self.trackers = build_trackers(list(config.trainer.logger), self.log_dir)

        self.reward_actor = RewardActor.options(num_cpus=config.worker.reward.num_cpus).remote(
            config.worker.reward.reward_function,
            config.worker.reward.reward_function_kwargs,
            config.worker.reward.reward_type,
        )
        num_workers = config.trainer.nnodes * config.trainer.n_gpus_per_node
        device = device_type(config.trainer.device)
        self.workers = WorkerGroup(
            HybridWorker,
            num_workers,
            init_args=(config,),
            gpus_per_worker=1 if device == "cuda" else 0,
            # on CPU the workers share the cores; more threads than cores only adds contention
            threads_per_worker=max(1, (os.cpu_count() or 1) // num_workers) if device == "cpu" else 8,
            backend=pick_backend(device),
        )
        self.workers.run_all("init_models")

    def _make_loader(self, dataset: RLDataset, batch_size: int, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.config.data.seed)
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=True,
            collate_fn=collate_fn,
            num_workers=self.config.data.dataloader_num_workers,
        )

    def _prompt_batches(self) -> Iterator[Batch]:
        """Batches of prompts, epoch after epoch, until the loop stops asking."""
        while True:
            yield from self.train_loader

    # ------------------------------------------------------------------------------------------------- loop
    def fit(self) -> list[dict[str, float]]:
        """Train for ``total_steps`` steps; returns every step's metrics."""
        history = []
        prompt_batches = self._prompt_batches()
        with tqdm(total=self.total_steps, desc="train", unit="step", dynamic_ncols=True, disable=None) as progress:
            for step in range(1, self.total_steps + 1):
                metrics = self.train_step(next(prompt_batches), step)
                history.append(metrics)
                for tracker in self.trackers:
                    tracker.log(metrics, step)
                progress.update(1)
        for tracker in self.trackers:
            tracker.close()
        return history

    def train_step(self, prompts: Batch, step: int) -> dict[str, float]:
        """One RL step on one batch of prompts; returns its metrics."""
        config = self.config
        rollout, algorithm = config.worker.rollout, config.algorithm
        timings: dict[str, float] = {}
        step_start = time.perf_counter()

        # 1. Rollout: n samples per prompt, each with its own seed so that a step can be replayed exactly.
        prompts["uid"] = np.array([f"{step}-{i}" for i in range(len(prompts))], dtype=object)
        batch = prompts.repeat(rollout.n, interleave=True)
        batch["sample_seed"] = torch.arange(len(batch)) + (rollout.seed * 1_000_003 + step) * len(batch)
        with timed(timings, "gen"):
            batch = self.workers.run_split("generate", batch, self._sampling_settings())

        # 2. Reward, computed in a Ray actor while the workers recompute log-probs.
        reward_future = self.reward_actor.score.remote(self._reward_inputs(batch))

        # 3. Old (and reference) log-probs.
        with timed(timings, "old"):
            batch = batch.union(
                self.workers.run_split("compute_old_log_probs", batch.select(*ACTOR_FIELDS), rollout.temperature)
            )
        if not algorithm.disable_kl:
            with timed(timings, "ref"):
                batch = batch.union(
                    self.workers.run_split("compute_ref_log_probs", batch.select(*ACTOR_FIELDS), rollout.temperature)
                )
        with timed(timings, "reward"):
            scores, sub_scores = self._wait_for_reward(reward_future)
        batch["token_level_scores"] = place_scores_on_last_token(scores, batch["response_mask"])
        batch["token_level_rewards"] = batch["token_level_scores"]
        kl_metrics = {}
        if not algorithm.disable_kl and not algorithm.use_kl_loss:
            # KL in the reward (EasyR1's default): r_t = score_t - kl_coef * KL_t(policy || reference)
            kl = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], algorithm.kl_penalty)
            kl = kl * batch["response_mask"]
            batch["token_level_rewards"] = batch["token_level_scores"] - algorithm.kl_coef * kl
            kl_metrics = {"actor/reward_kl": masked_mean(kl, batch["response_mask"]).item()}

        # 4. Advantages.
        with timed(timings, "adv"):
            advantages, returns = compute_advantages(
                algorithm.adv_estimator,
                token_level_rewards=batch["token_level_rewards"],
                response_mask=batch["response_mask"],
                index=batch["uid"],
                norm_adv_by_std=algorithm.norm_adv_by_std,
            )
        batch["advantages"], batch["returns"] = advantages, returns

        # 5. Policy update: each worker updates on its share in mini-batches of global_batch_size prompts.
        num_workers = self.workers.num_workers
        mini_batch_size = config.worker.actor.global_batch_size * rollout.n // num_workers
        update_fields = [*ACTOR_FIELDS, "old_log_probs", "advantages"]
        if "ref_log_probs" in batch:
            update_fields.append("ref_log_probs")
        with timed(timings, "update"):
            worker_metrics = self.workers.run_split(
                "update_actor", batch.select(*update_fields), rollout.temperature, mini_batch_size
            )
        timings["step"] = time.perf_counter() - step_start
        return {**self._step_metrics(batch, scores, sub_scores, worker_metrics, timings), **kl_metrics}

    # -------------------------------------------------------------------------------------------- helpers
    def _sampling_settings(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        rollout = self.config.worker.rollout
        settings = {
            "temperature": rollout.temperature,
            "top_p": rollout.top_p,
            "top_k": rollout.top_k,
            "max_tokens": self.config.data.max_response_length,
            "ignore_eos": rollout.ignore_eos,
        }
        settings.update(overrides or {})
        return settings

    def _reward_inputs(self, batch: Batch) -> list[dict[str, Any]]:
        """What a reward function sees per sample (EasyR1's keys)."""
        responses = batch["responses"]
        lengths = batch["response_mask"].sum(dim=-1)
        texts = self.tokenizer.batch_decode(
            [ids[:length].tolist() for ids, length in zip(responses, lengths)],
            skip_special_tokens=self.config.worker.reward.skip_special_tokens,
        )
        return [
            {"response": text, "response_length": int(length), "ground_truth": truth}
            for text, length, truth in zip(texts, lengths.tolist(), batch["ground_truth"])
        ]

    @staticmethod
    def _wait_for_reward(future: ray.ObjectRef) -> tuple[torch.Tensor, dict[str, list[float]]]:
        try:
            return ray.get(future)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, UserError):
                raise error.cause from None
            raise

    def _step_metrics(
        self,
        batch: Batch,
        scores: torch.Tensor,
        sub_scores: dict[str, list[float]],
        worker_metrics: list[dict[str, float]],
        timings: dict[str, float],
    ) -> dict[str, float]:
        mask = batch["response_mask"].bool()
        lengths = mask.sum(dim=-1).float()
        prompt_lengths = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(dim=-1).float()
        max_response = self.config.data.max_response_length
        metrics: dict[str, float] = {
            "reward/overall": scores.mean().item(),
            "reward/overall_max": scores.max().item(),
            "reward/overall_min": scores.min().item(),
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/clip_ratio": (lengths >= max_response).float().mean().item(),
            "prompt_length/mean": prompt_lengths.mean().item(),
            "advantages/mean": masked_mean(batch["advantages"], mask).item(),
            # |log p_vLLM - log p_actor| on the same sampled tokens: 0 up to numerics when the weights are in sync.
            "rollout/log_prob_gap": masked_mean(
                (batch["rollout_log_probs"] - batch["old_log_probs"]).abs(), mask
            ).item(),
            "rollout/log_prob_gap_max": (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[mask].max().item(),
        }
        for key, values in sub_scores.items():
            if key != "overall":
                metrics[f"reward/{key}"] = float(np.mean(values))
        for key in worker_metrics[0]:
            metrics[key] = float(np.mean([worker[key] for worker in worker_metrics]))
        metrics.update({f"timing/{name}": seconds for name, seconds in timings.items()})
        metrics["timing/sync"] = batch.meta.get("sync_seconds", 0.0)
        total_tokens = (prompt_lengths.sum() + lengths.sum()).item()
        metrics["throughput/tokens_per_second"] = total_tokens / max(timings["step"], 1e-9)
        return metrics
