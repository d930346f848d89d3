"""The RL loop, readable top to bottom: ``fit`` -> ``train_step`` -> the step's helpers.

The :class:`Trainer` is given its parts (:func:`easyr1.build.build_trainer` makes them from the config) and only
orders them. One step: the rollout stage (:mod:`easyr1.stages`) samples ``n`` responses per prompt on the workers and
has them scored by the reward function (user code, in the scorer, overlapping the next calls); the workers recompute
the old log-probs (and the reference's, and the critic's values); the driver folds the KL into the reward where asked
and computes the advantages; the workers update the critic and the policy; the driver logs the metrics. When the
batch feeds exactly one optimizer step the update's own forward gives the old log-probs (no separate pass;
:mod:`easyr1.on_policy`).

The workers are a :class:`~easyr1.distributed.worker_group.WorkerGroup` of Ray actors, or with
``trainer.single_process`` a :class:`~easyr1.distributed.local_group.LocalWorkerGroup`: one worker in this process,
where a debugger can step from ``train_step`` into :class:`~easyr1.workers.hybrid_worker.HybridWorker`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from easyr1.algorithms import (
    build_kl_controller,
    compute_advantages,
    episode_advantages,
    estimator_needs,
    kl_in_reward,
    masked_mean,
    place_scores_on_last_token,
    rollout_correction,
    rollout_mismatch_metrics,
)
from easyr1.checkpoint.manager import TRAINER_STATE_NAME, CheckpointDirectory
from easyr1.checkpoint.sharded import rng_state, save_durably, set_rng_state
from easyr1.config import PPOConfig, to_yaml
from easyr1.distributed.balance import balanced_order
from easyr1.errors import WorkerLost
from easyr1.logging import startup
from easyr1.logging.perf import memory_metrics
from easyr1.logging.rollouts import write_rollouts
from easyr1.logging.timing import timed
from easyr1.logging.trackers import Tracker
from easyr1.on_policy import reuses_update_log_probs
from easyr1.protocol import ACTOR_FIELDS, Batch
from easyr1.reward import Rewards, RewardScorer
from easyr1.reward_model.client import reward_model_metrics
from easyr1.schedules.versions import staleness
from easyr1.stages import RolloutStage
from easyr1.workers.hybrid_worker import HybridWorker


class Trainer:
    """Single-controller RL trainer: the driver owns data, rewards and advantages; workers own the models.

    Args:
        config: the run's settled config (:meth:`~easyr1.config.PPOConfig.settle`): what every worker runs.
        workers: the worker group (``run_all`` / ``run_split`` / ``open_step`` / ``finish_step`` / ``shutdown``) of
            :class:`~easyr1.workers.hybrid_worker.HybridWorker` ranks whose models are loaded.
        stage: the rollout stage: a step's prompts -> scored samples; validation.
        prompts: the step's prompts (``next()``), with a position saved in checkpoints (``state_dict``): a
            :class:`~easyr1.data.sampler.PromptStream`, or an agent run's
            :class:`~easyr1.stages.multi_turn.EpisodeSeeds`.
        checkpoints: the run's checkpoint directory.
        trackers: where each step's metrics go.
        tokenizer: decodes what is logged.
        total_steps: the step the run ends after.
        scorer: the reward scorer the stage sends to (closed with the run); ``None`` when the stage scores itself.
    """

    def __init__(
        self,
        config: PPOConfig,
        *,
        workers: Any,
        stage: RolloutStage,
        prompts: Any,
        checkpoints: CheckpointDirectory,
        trackers: list[Tracker],
        tokenizer: Any,
        total_steps: int,
        scorer: RewardScorer | None = None,
    ) -> None:
        self.config = config
        self.workers = workers
        self.stage = stage
        self.prompts = prompts
        self.checkpoints = checkpoints
        self.trackers = trackers
        self.tokenizer = tokenizer
        self.total_steps = total_steps
        self.scorer = scorer
        self.global_step = 0
        self.log_dir = Path(config.trainer.log_dir)
        # Prompts are drawn in generation rounds of mini_rollout_batch_size (DAPO refills a step round by round).
        self.round_size = config.data.mini_rollout_batch_size or config.data.rollout_batch_size
        algorithm = config.algorithm
        self.uses_reference = not algorithm.disable_kl
        self.uses_critic = estimator_needs(algorithm.adv_estimator).critic
        self.kl_controller = build_kl_controller(
            algorithm.kl_type, algorithm.kl_coef, algorithm.kl_target, algorithm.kl_horizon
        )

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
                try:
                    metrics = self.train_step(self.step_prompts(), step)
                except WorkerLost as lost:  # the message names the step
                    lost.step = step
                    raise
                self.global_step = step
                startup.mark("first_step")
                started = startup.startup_metrics()  # the first step this run takes only
                if started:
                    metrics.update(started)
                    print(f"easyr1: {startup.summary(started)}", flush=True)
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

    def train_step(self, prompts: Batch | None, step: int) -> dict[str, float]:
        """One RL step on one batch of prompts; returns its metrics."""
        step_start = time.perf_counter()
        self.workers.open_step()  # each sample's heavy fields go to a worker once per step, and are reused there

        # 1. Rollout: n scored samples per prompt (DAPO: informative groups only; ReMax: with greedy baselines). The
        #    rewards may still be computing in the reward scorer while the workers go on.
        samples = self.stage.collect(prompts, step)
        batch, metrics, timings = samples.batch, dict(samples.metrics), dict(samples.timings)

        # 2. Old log-probs, and the reference's and the critic's where the algorithm needs them, on a batch reordered
        #    so that every worker's share holds a similar number of tokens.
        batch, order = self._balanced(batch)
        sample_count = len(batch) // self.stage.rows_per_sample
        on_policy = reuses_update_log_probs(self.config, sample_count, self.workers.num_workers, step)
        batch = self._compute_experience(batch, on_policy, timings)
        if not on_policy:
            metrics.update(self._old_policy_metrics(batch))

        # 3. Rewards: the score on the last response token, minus the KL to the reference when it is in the reward.
        with timed(timings, "reward"):
            rewards = samples.rewards.result()
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
                self.log_dir,
                step,
                batch,
                rewards.scores,
                rewards.sub_scores,
                self.tokenizer,
                trainer.rollouts_to_log,
                reward_model=rewards.reward_model,
            )
        return {**self._step_metrics(batch, rewards, worker_metrics, timings), **metrics}

    # ------------------------------------------------------------------------------------------- step helpers
    def step_prompts(self) -> Batch | None:
        """The prompts a step starts from: a full rollout batch, or with online filtering one generation round
        (further rounds follow only while too few groups are informative); ``None`` for an asynchronous schedule,
        which runs ahead of the step and draws its prompts itself."""
        if getattr(self.stage, "draws_prompts", False):
            return None
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
        bypass = self.config.algorithm.rollout_correction_mode == "bypass"
        if bypass:  # the engine's log-probs are the PPO old policy: no old-log-prob pass at all
            batch["old_log_probs"] = batch["rollout_log_probs"]
        needed = {"old": not (on_policy or bypass), "ref": self.uses_reference, "values": self.uses_critic}
        passes = [name for name, need in needed.items() if need]
        if not passes:
            return batch
        with timed(timings, "experience"):
            experience = self.workers.run_split(
                HybridWorker.compute_experience,
                batch.select(*ACTOR_FIELDS),
                self.config.worker.rollout.temperature,
                passes,
            )
        # timing/old, /ref, /values: each pass on the first worker; timing/experience: the call, transfers included
        timings.update(experience.meta.pop("experience_seconds"))
        return batch.union(experience)

    def _old_policy_metrics(self, batch: Batch) -> dict[str, float]:
        """The rollout-vs-trainer ``rollout/`` metrics from the old log-probs; with a rollout correction
        (``algorithm.rollout_is`` / ``rollout_rs``, decoupled mode) or samples that carry their age (``staleness``,
        or ``version_first`` of an asynchronous schedule) also the ``rollout_corr/`` metrics, and the correction
        attached to ``batch``: ``rollout_is_weights`` and ``rollout_rs_mask`` (the update reads them unless it
        computes them itself, on-policy). In bypass mode the old log-probs are the engine's: nothing to compare
        here, the update reports ``rollout_corr/`` from the current policy."""
        settings = self.config.algorithm.rollout_correction_settings()
        if settings.bypass:
            return {}
        old, rollout, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
        metrics = prefixed("rollout", rollout_mismatch_metrics(old, rollout, mask))
        ages = batch["staleness"] if "staleness" in batch else None
        if ages is None and "version_first" in batch:  # train_step runs before global_step counts its step
            ages = staleness(batch["version_first"], self.global_step + 1)
        if not settings.active and ages is None:
            return metrics
        weights, kept, correction_metrics = rollout_correction(old, rollout, mask, settings, ages)
        if weights is not None:
            batch["rollout_is_weights"] = weights
        if settings.rollout_rs:
            batch["rollout_rs_mask"] = kept
        return {**metrics, **correction_metrics}

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
        rows_per_prompt, num_workers = config.worker.rollout.n * self.stage.rows_per_sample, self.workers.num_workers
        temperature = config.worker.rollout.temperature
        worker_metrics: list[dict[str, float]] = []
        if self.uses_critic:
            critic_view = batch.select(*ACTOR_FIELDS, "values", "returns")
            critic_mini_batch = config.worker.critic.global_batch_size * rows_per_prompt // num_workers
            with timed(timings, "update_critic"):
                worker_metrics += self.workers.run_split(HybridWorker.update_critic, critic_view, critic_mini_batch)
        mini_batch_size = config.worker.actor.global_batch_size * rows_per_prompt // num_workers
        if on_policy:
            update_fields = [*ACTOR_FIELDS, "advantages"]
            update_fields += [key for key in ("ref_log_probs",) if key in batch]
            update_fields += ["rollout_log_probs"] if algorithm.rollout_correction_settings().active else []
            with timed(timings, "update"):
                results = self.workers.run_split(
                    HybridWorker.update_actor_on_policy, batch.select(*update_fields), temperature, mini_batch_size
                )
            worker_metrics += [worker for worker, _ in results]
            batch = batch.union(Batch.concat([log_probs for _, log_probs in results]))
            metrics.update(self._old_policy_metrics(batch))
        elif step > config.trainer.critic_warmup:
            update_fields = [*ACTOR_FIELDS, "old_log_probs", "advantages"]
            update_fields += [
                key for key in ("ref_log_probs", "rollout_is_weights", "rollout_rs_mask") if key in batch
            ]
            with timed(timings, "update"):
                worker_metrics += self.workers.run_split(
                    HybridWorker.update_actor, batch.select(*update_fields), temperature, mini_batch_size
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
        if rewards.timed_out is not None:  # worker.reward.timeout_score: samples scored with it, not by the function
            timed_out = [flag for flag, keep in zip(rewards.timed_out, real.tolist()) if keep]
            metrics["reward/timeouts"] = float(sum(timed_out))
        metrics.update(reward_model_metrics(rewards))  # worker.reward_model: its mean score, unparseable judgements
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
        """The stage's validation of the current policy: its ``val/`` metrics; the samples it shows go to the
        trackers that keep generations."""
        validation = self.stage.validate(self.global_step)
        for tracker in self.trackers:
            log_generations = getattr(tracker, "log_generations", None)
            if log_generations is not None:
                log_generations(validation.samples, self.global_step)
        return validation.metrics

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, val_score: float | None = None) -> Path:
        """Write the full training state of ``global_step`` and commit it atomically; returns its directory (a full
        disk is a ``CheckpointError``, the previous step left as the newest)."""

        def write(staging: Path) -> None:
            self.workers.run_all(HybridWorker.save_checkpoint, str(staging), self.config.trainer.save_model_only)
            driver_state = {
                "global_step": self.global_step,
                "prompts": self.prompts.state_dict(),
                "kl_controller": self.kl_controller.state_dict(),
                "rng": rng_state(),
            }
            driver_state["schedule"] = self.config.async_training.schedule  # a resume must use the same one
            if hasattr(self.stage, "state_dict"):  # an asynchronous schedule's samples in flight (easyr1.schedules)
                driver_state["stage"] = self.stage.state_dict()
            save_durably(driver_state, staging / TRAINER_STATE_NAME)
            (staging / "config.yaml").write_text(to_yaml(self.config, redacted=True), encoding="utf-8")

        return self.checkpoints.save(self.global_step, write, val_score)

    def load_checkpoint(self, step_dir: Path, driver_state: dict[str, Any]) -> None:
        """Continue from ``step_dir``: the workers' models and optimizers, and the driver's step, data position, KL
        controller and RNGs (``driver_state``: the step's ``trainer_state.pt``, read by the builder)."""
        self.workers.run_all(HybridWorker.load_checkpoint, str(step_dir))
        self.global_step = int(driver_state["global_step"])
        self.prompts.load_state_dict(driver_state["prompts"])
        self.kl_controller.load_state_dict(driver_state["kl_controller"])
        if "stage" in driver_state:
            self.stage.load_state_dict(driver_state["stage"])
        set_rng_state(driver_state["rng"])
        print(f"easyr1: resumed from {step_dir} (step {self.global_step} of {self.total_steps})", flush=True)

    def _close_trackers(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def shutdown(self) -> None:
        """Stop the workers, the stage's own (an asynchronous schedule's generators) and the reward scorer (a Ray
        cluster itself stays up)."""
        self.workers.shutdown()
        close_stage = getattr(self.stage, "close", None)
        if close_stage is not None:
            close_stage()
        if self.scorer is not None:
            self.scorer.close()


def prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    """``{"a": 1}`` -> ``{"prefix/a": 1}``."""
    return {f"{prefix}/{key}": value for key, value in metrics.items()}
