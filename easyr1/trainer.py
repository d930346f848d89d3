"""The RL loop, readable top to bottom: ``fit`` -> ``train_step`` -> the step's helpers.

One step: the rollout stage (:mod:`easyr1.stages.rollout`) samples ``n`` responses per prompt on the workers and
has them scored by the reward function (in a Ray actor, overlapping the next calls); the workers recompute the old
log-probs (and the reference's, and the critic's values); the driver folds the KL into the reward where asked and
computes the advantages; the workers update the critic and the policy; the driver logs the metrics. When the batch
feeds exactly one optimizer step the update's own forward gives the old log-probs (no separate pass;
:mod:`easyr1.on_policy`).
"""

from __future__ import annotations

import copy
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm import tqdm

from easyr1.algorithms import (
    build_kl_controller,
    compute_advantages,
    episode_advantages,
    estimator_needs,
    kl_in_reward,
    masked_mean,
    place_scores_on_last_token,
    rollout_correction_weights,
    rollout_mismatch_metrics,
)
from easyr1.checkpoint.manager import TRAINER_STATE_NAME, CheckpointDirectory
from easyr1.checkpoint.sharded import rng_state, save_durably, set_rng_state
from easyr1.config import PPOConfig, to_dict, to_yaml
from easyr1.data import RLDataset, collate_fn
from easyr1.data.sampler import PromptStream
from easyr1.distributed import WorkerGroup
from easyr1.distributed.balance import balanced_order
from easyr1.distributed.placement import resolve_device
from easyr1.distributed.worker import pick_backend
from easyr1.envs import check_environment
from easyr1.errors import UserError
from easyr1.logging import build_trackers
from easyr1.logging.perf import memory_metrics
from easyr1.logging.rollouts import write_rollouts
from easyr1.logging.timing import timed
from easyr1.models.loading import load_model_config, load_tokenizer_and_processor
from easyr1.on_policy import reuses_update_log_probs
from easyr1.protocol import Batch
from easyr1.stages.multi_turn import EpisodeSeeds, MultiTurnRollout
from easyr1.stages.rollout import SAMPLING_KEYS, SingleTurnRollout
from easyr1.workers.actor import ACTOR_FIELDS
from easyr1.workers.hybrid_worker import HybridWorker
from easyr1.workers.reward import Rewards, load_reward_function
from easyr1.workers.reward_actor import RewardActor
from easyr1.workers.rollout.vllm_rollout import cpu_block_size


# Validation samples get their own seed stream, apart from training's generation rounds.
VALIDATION_ROUND = 1_000_000


class Trainer:
    """Single-controller RL trainer: the driver owns data, rewards and advantages; workers own the models."""

    def __init__(self, config: PPOConfig) -> None:
        self.config = config
        model = config.worker.actor.model
        self.tokenizer, self.processor = load_tokenizer_and_processor(model.tokenizer_path, model.trust_remote_code)
        # Everything that can fail on bad input happens before the workers load any model.
        if not config.env.enabled:  # an agent's rewards come from its environment
            load_reward_function(
                config.worker.reward.reward_function,
                config.worker.reward.reward_function_kwargs,
                config.worker.reward.reward_type,
            )
        model_config = load_model_config(model.model_path, model.trust_remote_code, model.override_config)
        # Prompts are drawn in generation rounds of mini_rollout_batch_size (DAPO refills a step round by round).
        self.round_size = config.data.mini_rollout_batch_size or config.data.rollout_batch_size
        self.val_dataset = None
        if config.env.enabled:  # an agent run: environment seeds instead of prompts, rewards from the environment
            check_environment(config.env.name, config.env.env_class, dict(config.env.env_kwargs))
            self.prompts = EpisodeSeeds(config.env.seed, config.env.num_seeds, self.round_size)
            steps_per_epoch = self.prompts.steps_per_epoch
            if steps_per_epoch is None and not config.trainer.max_steps:
                raise UserError(
                    "an agent run without env.num_seeds plays new seeds forever; set trainer.max_steps (or "
                    "env.num_seeds to make an epoch)"
                )
        else:
            steps_per_epoch = self._load_datasets(model_config)
        self.total_steps = config.trainer.max_steps or steps_per_epoch * config.trainer.total_epochs
        config.worker.actor.optim.training_steps = self.total_steps
        # Which checkpoint to continue from is settled (and its state read) before any model loads.
        self.checkpoints = CheckpointDirectory(config.trainer.save_checkpoint_path, config.trainer.save_limit)
        self.resume_from = self.checkpoints.resume_path(
            config.trainer.load_checkpoint_path, config.trainer.find_last_checkpoint
        )
        resumed_state = {}
        if self.resume_from:
            resumed_state = torch.load(self.resume_from / TRAINER_STATE_NAME, weights_only=False)
        for leftover in self.checkpoints.remove_leftovers():
            print(f"easyr1: removed {leftover}, a checkpoint write that was interrupted", flush=True)
        self.global_step = int(resumed_state.get("global_step", 0))
        self.log_dir = Path(config.trainer.log_dir)
        self.trackers = build_trackers(
            list(config.trainer.logger),
            self.log_dir,
            resume_step=self.global_step if self.resume_from else None,
            project=config.trainer.project_name,
            experiment=config.trainer.experiment_name,
            config=to_dict(config),
        )

        self.reward_actor = (
            None
            if config.env.enabled
            else RewardActor.options(
                num_cpus=config.worker.reward.num_cpus,
                # the driver's node, where the reward file was found; another node may not have it (soft: if this
                # node has no CPU free, any node will do)
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
            ).remote(
                config.worker.reward.reward_function,
                config.worker.reward.reward_function_kwargs,
                config.worker.reward.reward_type,
            )
        )
        num_workers = config.trainer.nnodes * config.trainer.n_gpus_per_node
        # the cluster's resources decide `auto`, not the driver's: the driver may sit on a GPU-less head node
        device = resolve_device(config.trainer.device, ray.cluster_resources())
        worker_config = copy.deepcopy(config)
        worker_config.trainer.device = device  # every worker uses the device decided here, and checks it has it
        if device == "cpu" and config.worker.rollout.name == "vllm":
            cpu_block_size(config.worker.rollout.block_size)  # refused here, not after the workers load models
        if config.env.enabled and config.env.context == "full" and config.worker.actor.share_prompt:
            # a trajectory's images sit in its response region too, which a prompt shared by a group cannot carry
            print(
                "easyr1: worker.actor.share_prompt is off for agent runs with env.context=full (observations hold "
                "images)",
                flush=True,
            )
            worker_config.worker.actor.share_prompt = False
            worker_config.fill_derived()
        # on CPU a node's workers share its cores; more threads than cores only adds contention
        cpu_threads = max(1, (os.cpu_count() or 1) // config.trainer.n_gpus_per_node)
        self.workers = WorkerGroup(
            HybridWorker,
            num_workers,
            nnodes=config.trainer.nnodes,
            init_args=(worker_config,),
            gpus_per_worker=1 if device == "cuda" else 0,
            threads_per_worker=cpu_threads if device == "cpu" else 8,
            backend=pick_backend(device),
            cache_sample_tensors=config.trainer.cache_sample_tensors,
        )
        print(f"easyr1: {self.workers.describe()}", flush=True)
        self.workers.check_shared_directory(config.trainer.save_checkpoint_path, "trainer.save_checkpoint_path")
        self.workers.run_all("init_models")

        algorithm = config.algorithm
        self.uses_reference = not algorithm.disable_kl
        self.needs = estimator_needs(algorithm.adv_estimator)
        self.uses_critic = self.needs.critic
        self.kl_controller = build_kl_controller(
            algorithm.kl_type, algorithm.kl_coef, algorithm.kl_target, algorithm.kl_horizon
        )
        # the stage train_step drives (RolloutStage.collect); validation also goes through it
        self.rollout: SingleTurnRollout | MultiTurnRollout
        if config.env.enabled:
            self.rollout = MultiTurnRollout(config, self.workers, self.tokenizer, self.processor, model_config)
        else:
            self.rollout = SingleTurnRollout(config, self.workers, self.reward_actor, self.prompts, self.tokenizer)
        if self.resume_from:
            self._load_checkpoint(self.resume_from, resumed_state)

    def _load_datasets(self, model_config: Any) -> int:
        """Read the training (and validation) prompts; returns the steps per epoch."""
        config = self.config
        self.train_dataset = RLDataset.from_config(
            config.data, config.data.train_files, self.tokenizer, self.processor, model_config
        )
        self.prompts = PromptStream(
            self.train_dataset,
            self.round_size,
            config.data.shuffle,
            config.data.seed,
            collate_fn,
            config.data.dataloader_num_workers,
        )
        trainer = config.trainer
        if trainer.val_freq > 0 or trainer.val_before_train or trainer.val_only:
            self.val_dataset = RLDataset.from_config(
                config.data, config.data.val_files, self.tokenizer, self.processor, model_config
            )
        steps_per_epoch = self.prompts.steps_per_epoch * self.round_size // config.data.rollout_batch_size
        if steps_per_epoch == 0:
            raise UserError(
                f"data.train_files ({config.data.train_files}) has {len(self.train_dataset)} usable rows, fewer than "
                f"data.rollout_batch_size={config.data.rollout_batch_size}; lower the batch size or add data"
            )
        return steps_per_epoch

    # ------------------------------------------------------------------------------------------------- loop
    def fit(self, keep_history: bool = False) -> list[dict[str, float]]:
        """Train from the current step up to ``total_steps``.

        Returns the metrics of every step run (and of the validation before training) with ``keep_history``,
        else of the last one only: a long run's history is in its trackers, and keeping it here too would grow the
        driver's memory with every step.
        """
        history: list[dict[str, float]] = []
        trainer = self.config.trainer
        # before the first step (not again when resuming), or only that with val_only
        if trainer.val_only or (trainer.val_before_train and self.global_step == 0):
            val_metrics = self.validate()
            history.append(val_metrics)
            for tracker in self.trackers:
                tracker.log(val_metrics, self.global_step)
            if trainer.val_only:
                self._close_trackers()
                return history
        save_freq = trainer.save_freq
        with tqdm(
            total=self.total_steps,
            initial=self.global_step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None,
        ) as progress:
            for step in range(self.global_step + 1, self.total_steps + 1):
                metrics = self.train_step(self._step_prompts(), step)
                self.global_step = step
                val_score = None
                if trainer.val_freq > 0 and (step % trainer.val_freq == 0 or step == self.total_steps):
                    start = time.perf_counter()
                    metrics.update(self.validate())
                    metrics["timing/validate"] = time.perf_counter() - start
                    val_score = metrics["val/reward_score"]
                # Like EasyR1: every save_freq steps, and always after the last step.
                if (save_freq > 0 and step % save_freq == 0) or step == self.total_steps:
                    start = time.perf_counter()
                    self.save_checkpoint(val_score)
                    metrics["timing/save_checkpoint"] = time.perf_counter() - start
                if not keep_history:
                    history.clear()
                history.append(metrics)
                for tracker in self.trackers:
                    tracker.log(metrics, step)
                progress.update(1)
        self._close_trackers()
        return history

    def train_step(self, prompts: Batch, step: int) -> dict[str, float]:
        """One RL step on one batch of prompts; returns its metrics."""
        step_start = time.perf_counter()
        self.workers.open_step()  # each sample's heavy fields go to a worker once per step, and are reused there

        # 1. Rollout: n scored samples per prompt (DAPO: informative groups only; ReMax: with greedy baselines). The
        #    rewards may still be computing in the reward actor while the workers go on.
        rollout = self.rollout.collect(prompts, step)
        batch, metrics, timings = rollout.batch, dict(rollout.metrics), dict(rollout.timings)

        # 2. Old log-probs, and the reference's and the critic's where the algorithm needs them, on a batch reordered
        #    so that every worker's share holds a similar number of tokens.
        batch, order = self._balanced(batch)
        samples = len(batch) // self.rollout.rows_per_sample
        on_policy = reuses_update_log_probs(self.config, samples, self.workers.num_workers, step)
        batch = self._compute_experience(batch, on_policy, timings)
        if not on_policy:
            metrics.update(self._old_policy_metrics(batch))

        # 3. Rewards: the score on the last response token, minus the KL to the reference when it is in the reward.
        with timed(timings, "reward"):
            rewards = rollout.rewards.result()
        if order is not None:  # the reward was computed in generation order
            rewards = rewards.index(order)
        metrics.update(self._token_level_rewards(batch, rewards))

        # 4. Advantages (pure functions on the driver).
        with timed(timings, "adv"):
            batch["advantages"], batch["returns"] = self._advantages(batch)

        # 5. Updates: the critic first (PPO), then the policy once the critic has warmed up.
        batch, worker_metrics = self._update(batch, step, on_policy, timings, metrics)
        timings["step"] = time.perf_counter() - step_start
        metrics.update(self.workers.finish_step())
        trainer = self.config.trainer
        if trainer.rollouts_to_log > 0 and (step == 1 or step % max(trainer.rollout_log_freq, 1) == 0):
            write_rollouts(
                self.log_dir, step, batch, rewards.scores, rewards.sub_scores, self.tokenizer, trainer.rollouts_to_log
            )
        return {**self._step_metrics(batch, rewards, worker_metrics, timings), **metrics}

    # ------------------------------------------------------------------------------------------- step helpers
    def _step_prompts(self) -> Batch:
        """The prompts a step starts from: a full rollout batch, or with online filtering one generation round
        (further rounds follow only while too few groups are informative)."""
        if self.config.algorithm.online_filtering:
            return self.prompts.next()
        rounds = self.config.data.rollout_batch_size // self.round_size
        return Batch.concat([self.prompts.next() for _ in range(rounds)])

    def _balanced(self, batch: Batch) -> tuple[Batch, list[int] | None]:
        """With ``trainer.balance_batch``, the batch reordered so that every worker's share holds a similar number
        of tokens, and the order (``None`` when unchanged)."""
        if not (self.config.trainer.balance_batch and self.workers.num_workers > 1):
            return batch, None
        # whole prompt groups where they divide evenly: a prompt's vision tensors then go to one worker only
        token_counts = batch["attention_mask"].sum(dim=-1).tolist()
        order = balanced_order(token_counts, self.workers.num_workers, groups=batch["uid"])
        return batch.index(order), order

    def _compute_experience(self, batch: Batch, on_policy: bool, timings: dict[str, float]) -> Batch:
        """The no-grad passes the step needs (old log-probs unless ``on_policy``, the reference's unless
        ``disable_kl``, the critic's values for PPO), in one call so that the batch travels to the workers once."""
        needed = {"old": not on_policy, "ref": self.uses_reference, "values": self.uses_critic}
        passes = [name for name, need in needed.items() if need]
        if not passes:
            return batch
        with timed(timings, "experience"):
            experience = self.workers.run_split(
                "compute_experience", batch.select(*ACTOR_FIELDS), self.config.worker.rollout.temperature, passes
            )
        # timing/old, /ref, /values: each pass on the first worker; timing/experience: the call, transfers included
        timings.update(experience.meta.pop("experience_seconds"))
        return batch.union(experience)

    def _old_policy_metrics(self, batch: Batch) -> dict[str, float]:
        """The rollout-vs-trainer ``rollout/`` metrics from the old log-probs; with ``algorithm.rollout_correction``
        also its weights' metrics, and the weights attached to ``batch`` (the update reads them unless it computes
        them itself, on-policy)."""
        algorithm = self.config.algorithm
        old, rollout, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
        if not algorithm.rollout_correction:
            return prefixed("rollout", rollout_mismatch_metrics(old, rollout, mask))
        weights, correction_metrics = rollout_correction_weights(
            old,
            rollout,
            mask,
            algorithm.rollout_correction,
            algorithm.rollout_correction_threshold,
        )
        batch["rollout_is_weights"] = weights
        return prefixed("rollout", correction_metrics)

    def _token_level_rewards(self, batch: Batch, rewards: Rewards) -> dict[str, float]:
        """Set ``token_level_scores`` (each score on its response's last valid token) and ``token_level_rewards``
        (minus the KL to the reference when it is in the reward, whose controller then updates); returns the KL
        metrics."""
        algorithm, mask = self.config.algorithm, batch["response_mask"]
        if "token_level_scores" not in batch:  # a multi-turn stage places each turn's reward itself
            batch["token_level_scores"] = place_scores_on_last_token(rewards.scores, mask)
        batch["token_level_rewards"] = batch["token_level_scores"]
        if not self.uses_reference or algorithm.use_kl_loss:
            return {}
        batch["token_level_rewards"], kl_metrics = kl_in_reward(
            batch["token_level_scores"],
            batch["old_log_probs"],
            batch["ref_log_probs"],
            mask,
            self.kl_controller.value,
            algorithm.kl_penalty,
        )
        self.kl_controller.update(kl_metrics["reward_kl"], n_steps=len(batch))
        return prefixed("actor", kl_metrics)

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and returns by ``algorithm.adv_estimator``, each estimator taking the inputs it names."""
        algorithm = self.config.algorithm
        inputs = dict(
            token_level_rewards=batch["token_level_rewards"],
            response_mask=batch["response_mask"],
            index=batch["uid"],
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            turn_gamma=algorithm.turn_gamma,
            turn_lam=algorithm.turn_lam,
            norm_adv_by_std=algorithm.norm_adv_by_std,
            **{key: batch[key] for key in ("values", "reward_baselines", "turn_ids") if key in batch},
        )
        if "episode_index" in batch:  # an episode's turns are separate rows: one advantage per episode
            return episode_advantages(algorithm.adv_estimator, episode_index=batch["episode_index"], **inputs)
        return compute_advantages(algorithm.adv_estimator, **inputs)

    def _update(
        self, batch: Batch, step: int, on_policy: bool, timings: dict[str, float], metrics: dict[str, float]
    ) -> tuple[Batch, list[dict[str, float]]]:
        """The critic's update (PPO), then the policy's once ``trainer.critic_warmup`` steps have passed; each worker
        takes its share in mini-batches of ``global_batch_size`` prompts, one optimizer step each. On-policy, the
        update returns the old log-probs of its own forward, which join the batch with their ``rollout/`` metrics.
        Returns the batch and each worker's metrics."""
        config, algorithm = self.config, self.config.algorithm
        # a mini-batch is global_batch_size prompts: n samples each, and each sample's training rows
        rows_per_prompt, num_workers = config.worker.rollout.n * self.rollout.rows_per_sample, self.workers.num_workers
        temperature = config.worker.rollout.temperature
        worker_metrics: list[dict[str, float]] = []
        if self.uses_critic:
            critic_view = batch.select(*ACTOR_FIELDS, "values", "returns")
            critic_mini_batch = config.worker.critic.global_batch_size * rows_per_prompt // num_workers
            with timed(timings, "update_critic"):
                worker_metrics += self.workers.run_split("update_critic", critic_view, critic_mini_batch)
        mini_batch_size = config.worker.actor.global_batch_size * rows_per_prompt // num_workers
        if on_policy:
            update_fields = [*ACTOR_FIELDS, "advantages"]
            update_fields += [key for key in ("ref_log_probs",) if key in batch]
            update_fields += ["rollout_log_probs"] if algorithm.rollout_correction else []
            with timed(timings, "update"):
                results = self.workers.run_split(
                    "update_actor_on_policy", batch.select(*update_fields), temperature, mini_batch_size
                )
            worker_metrics += [worker for worker, _ in results]
            batch = batch.union(Batch.concat([log_probs for _, log_probs in results]))
            metrics.update(self._old_policy_metrics(batch))
        elif step > config.trainer.critic_warmup:
            update_fields = [*ACTOR_FIELDS, "old_log_probs", "advantages"]
            update_fields += [key for key in ("ref_log_probs", "rollout_is_weights") if key in batch]
            with timed(timings, "update"):
                worker_metrics += self.workers.run_split(
                    "update_actor", batch.select(*update_fields), temperature, mini_batch_size
                )
        return batch, worker_metrics

    def _step_metrics(
        self,
        batch: Batch,
        rewards: Rewards,
        worker_metrics: list[dict[str, float]],
        timings: dict[str, float],
    ) -> dict[str, float]:
        """The step's logged metrics: batch, reward, length and advantage statistics, the workers' metrics
        averaged, timings and throughput."""
        mask = batch["response_mask"].bool()
        real = mask.any(dim=-1)  # every sample has a token; only the padding rows of split episodes have none
        scores = rewards.scores[real]
        sub_scores = {
            key: [value for value, keep in zip(values, real.tolist()) if keep]
            for key, values in rewards.sub_scores.items()
        }
        lengths = mask[real].sum(dim=-1).float()
        prompt_lengths = batch["attention_mask"][real, : batch["prompts"].shape[1]].sum(dim=-1).float()
        max_response = self.config.data.max_response_length
        metrics: dict[str, float] = {
            "batch/samples": float(real.sum()),
            "reward/overall": scores.mean().item(),
            "reward/overall_max": scores.max().item(),
            "reward/overall_min": scores.min().item(),
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/clip_ratio": (lengths >= max_response).float().mean().item(),
            "prompt_length/mean": prompt_lengths.mean().item(),
            "prompt_length/max": prompt_lengths.max().item(),
            "prompt_length/clip_ratio": (prompt_lengths >= self.config.data.max_prompt_length).float().mean().item(),
            "advantages/mean": masked_mean(batch["advantages"], mask).item(),
            "advantages/max": batch["advantages"][mask].max().item(),
            "advantages/min": batch["advantages"][mask].min().item(),
            # |log p_vLLM - log p_actor| on the same sampled tokens: 0 up to numerics when the weights are in sync.
            "rollout/log_prob_gap": masked_mean(
                (batch["rollout_log_probs"] - batch["old_log_probs"]).abs(), mask
            ).item(),
            "rollout/log_prob_gap_max": (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[mask].max().item(),
        }
        for key, values in sub_scores.items():
            if key != "overall":
                metrics[f"reward/{key}"] = float(np.mean(values))
                metrics[f"reward/{key}_max"] = float(np.max(values))
                metrics[f"reward/{key}_min"] = float(np.min(values))
        for key in sorted({key for worker in worker_metrics for key in worker}):
            metrics[key] = float(np.mean([worker[key] for worker in worker_metrics if key in worker]))
        metrics.update({f"timing/{name}": seconds for name, seconds in timings.items()})
        metrics["timing/sync"] = batch.meta.get("sync_seconds", 0.0)
        if "generate_seconds" in batch.meta:  # the engine's own generate, inside timing/gen (validation has none)
            metrics["timing/engine"] = batch.meta["generate_seconds"]
        total_tokens = (prompt_lengths.sum() + lengths.sum()).item()
        metrics["throughput/tokens_per_second"] = total_tokens / max(timings["step"], 1e-9)
        metrics["perf/driver_max_host_memory_gb"] = memory_metrics()["perf/max_host_memory_gb"]
        return metrics

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Generate for the whole validation set with ``worker.rollout.val_override_config``, score it, and return
        ``val/`` metrics (reward and sub-scores, response lengths); logs the first ``val_generations_to_log``."""
        overrides = dict(self.config.worker.rollout.val_override_config)
        n = int(overrides.pop("n", 1))
        # engine settings (memory, ...) are fixed at start-up; only the sampling ones can change per call
        sampling = self.rollout.sampling({key: value for key, value in overrides.items() if key in SAMPLING_KEYS})
        if isinstance(self.rollout, MultiTurnRollout):
            return self.rollout.validate(self.global_step, VALIDATION_ROUND, sampling)
        size = self.config.data.val_batch_size
        size = len(self.val_dataset) if size == -1 else size
        scores, sub_scores, lengths, shown = [], defaultdict(list), [], []
        for start in tqdm(range(0, len(self.val_dataset), size), desc="validate", leave=False, disable=None):
            rows = range(start, min(start + size, len(self.val_dataset)))
            prompts = collate_fn([self.val_dataset[i] for i in rows])
            batch = self.rollout.generate(prompts, self.global_step, VALIDATION_ROUND + start, sampling, n=n)
            rewards = self.rollout.score(batch).result()
            batch_scores, batch_sub_scores = rewards.scores, rewards.sub_scores
            scores.append(batch_scores)
            for key, values in batch_sub_scores.items():
                sub_scores[key] += list(values)
            lengths.append(batch["response_mask"].sum(dim=-1).float())
            keep = self.config.trainer.val_generations_to_log - len(shown)
            shown += self._generation_records(batch, batch_scores)[: max(keep, 0)]
        all_scores, all_lengths = torch.cat(scores), torch.cat(lengths)
        metrics = {
            "val/reward_score": all_scores.mean().item(),
            "val/response_length/mean": all_lengths.mean().item(),
            "val/response_length/clip_ratio": (all_lengths >= sampling["max_tokens"]).float().mean().item(),
        }
        for key, values in sub_scores.items():
            if key != "overall":
                metrics[f"val/{key}"] = float(np.mean(values))
        for tracker in self.trackers:
            log_generations = getattr(tracker, "log_generations", None)
            if log_generations is not None:
                log_generations(shown, self.global_step)
        return metrics

    def _generation_records(self, batch: Batch, scores: torch.Tensor) -> list[dict[str, Any]]:
        """Prompt, response, answer and score of each sample, as text."""
        lengths = batch["response_mask"].sum(dim=-1).tolist()
        return [
            {
                "prompt": self.tokenizer.decode(batch["raw_prompt_ids"][i], skip_special_tokens=False),
                "response": self.tokenizer.decode(batch["responses"][i, : lengths[i]].tolist()),
                "ground_truth": batch["ground_truth"][i],
                "score": float(scores[i]),
            }
            for i in range(len(batch))
        ]

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, val_score: float | None = None) -> Path:
        """Write the full training state of ``global_step`` and commit it atomically; returns its directory."""
        staging = self.checkpoints.staging_dir(self.global_step)
        self.workers.run_all("save_checkpoint", str(staging), self.config.trainer.save_model_only)
        driver_state = {
            "global_step": self.global_step,
            "prompts": self.prompts.state_dict(),
            "kl_controller": self.kl_controller.state_dict(),
            "rng": rng_state(),
        }
        save_durably(driver_state, staging / TRAINER_STATE_NAME)
        (staging / "config.yaml").write_text(to_yaml(self.config), encoding="utf-8")
        return self.checkpoints.commit(self.global_step, staging, val_score)

    def _load_checkpoint(self, step_dir: Path, driver_state: dict[str, Any]) -> None:
        """Restore the workers' models and optimizers and the driver's data position, KL controller and RNGs."""
        self.workers.run_all("load_checkpoint", str(step_dir))
        self.prompts.load_state_dict(driver_state["prompts"])
        self.kl_controller.load_state_dict(driver_state["kl_controller"])
        set_rng_state(driver_state["rng"])
        print(f"easyr1: resumed from {step_dir} (step {self.global_step} of {self.total_steps})", flush=True)

    def _close_trackers(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def shutdown(self) -> None:
        """Stop the workers and the reward actor (the Ray cluster itself stays up)."""
        self.workers.shutdown()
        if self.reward_actor is not None:
            ray.kill(self.reward_actor)


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    """``{"a": 1}`` -> ``{"prefix/a": 1}``."""
    return {f"{prefix}/{key}": value for key, value in metrics.items()}
