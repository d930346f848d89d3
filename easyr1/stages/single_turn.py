"""The single-turn rollout stage: a step's prompts in, one sampled and scored response per sample out.

:class:`SingleTurnStage` implements :class:`~easyr1.stages.base.RolloutStage`: ``worker.rollout.n`` samples per
prompt generated on the workers (each gets an equal consecutive chunk), DAPO refills (``algorithm.online_filtering``),
ReMax greedy baselines, and validation over ``data.val_files``. Rewards are computed by the reward scorer (user code)
while the workers go on. Seeds: :mod:`easyr1.stages.sampling`.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from easyr1.algorithms import estimator_needs, filter_groups
from easyr1.config import PPOConfig
from easyr1.data import RLDataset, collate_fn
from easyr1.data.sampler import PromptStream
from easyr1.engines import engine_traits
from easyr1.errors import UserError
from easyr1.logging.timing import timed
from easyr1.protocol import Batch
from easyr1.reward import ROW_COLUMNS, PendingRewards, Rewards, RewardScorer, build_reward_inputs
from easyr1.reward_model.client import RewardModelClient
from easyr1.stages.base import ScoredSamples, Validation
from easyr1.stages.sampling import (
    VALIDATION_ROUND,
    greedy_baseline_first_seed,
    round_first_seed,
    sampling_settings,
    validation_overrides,
)
from easyr1.workers.hybrid_worker import HybridWorker


# The per-sample python objects of a prompt (besides its tensors), as the dataset yields them.
PROMPT_OBJECTS = ("raw_prompt_ids", "multi_modal_data", "multi_modal_inputs", "ground_truth", ROW_COLUMNS)
# The processed vision tensors of a prompt (what the actor's forward reads; an engine that reads images skips them).
VISION = "multi_modal_inputs"


def prompts_of(batch: Batch) -> Batch:
    """The prompt part of a rollout batch, as the dataloader produced it (responses stripped)."""
    prompt_length = batch["prompts"].shape[1]
    return Batch(
        tensors={
            "input_ids": batch["prompts"],
            "attention_mask": batch["attention_mask"][:, :prompt_length],
            "position_ids": batch["position_ids"][..., :prompt_length],
        },
        non_tensors={key: batch[key] for key in PROMPT_OBJECTS if key in batch},
    )


class SingleTurnStage:
    """One response per sample: ``worker.rollout.n`` samples per prompt, DAPO refills, ReMax greedy baselines.

    Generation runs on the workers (each gets an equal consecutive chunk), scoring in the reward scorer.
    """

    rows_per_sample = 1

    def __init__(
        self,
        config: PPOConfig,
        workers: Any,
        scorer: RewardScorer,
        prompts: PromptStream,
        tokenizer: Any,
        val_dataset: RLDataset | None = None,
        reward_model: RewardModelClient | None = None,
    ) -> None:
        self.config = config
        self.workers = workers  # a WorkerGroup or a LocalWorkerGroup of HybridWorkers
        self.scorer = scorer
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.val_dataset = val_dataset
        self.needs = estimator_needs(config.algorithm.adv_estimator)
        # what the engine reads of a prompt's vision inputs: the images (vLLM) or the processed tensors (HF)
        self.engine_reads_images = engine_traits(config.worker.rollout.name).reads_images
        # the next sample's id: the key of its tensors in the workers' per-step cache, never reused
        self.samples_generated = 0
        # generation rounds that another round follows in the same phase keep the engines awake (see collect)
        self.stay_awake = False
        self.weight_syncs = 0  # the engines' weight syncs and sleeps so far (perf/ and val/ metrics)
        self.engine_sleeps = 0
        # the most device memory in use right after a generation round of the step, engines awake (GPU only)
        self.awake_memory_gb: float | None = None
        # worker.reward_model: scored after generation, before the reward function (on these workers, unless the
        # run gives it workers of its own)
        if reward_model is None and config.worker.reward_model.enabled:
            reward_model = RewardModelClient(config, workers)
        self.reward_model = reward_model

    def collect(self, prompts: Batch, step: int) -> ScoredSamples:
        """``n`` samples per prompt, scored; with online filtering, refilled to informative groups only.

        The engines sleep once, after the step's last generation round: between DAPO's refill rounds and ReMax's
        greedy round the actor does not change, and an engine that slept on GPU (level 2) would need the full
        weights again. ``perf/weight_syncs`` and ``perf/engine_sleeps`` count what the rounds cost."""
        metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        counts = self._engine_counts()
        self.stay_awake = self._rounds_follow()
        self.awake_memory_gb = None
        try:
            with timed(timings, "gen"):
                batch = self.generate(prompts, step, round_index=0)
            # the reward is computed by the scorer while the workers go on; DAPO needs it at once
            rewards = self.score(batch)
            if self.config.algorithm.online_filtering:
                with timed(timings, "filter"):
                    batch, rewards = self._fill_with_informative_groups(batch, rewards, step, metrics)
            if self.needs.greedy_baseline:
                with timed(timings, "gen_baseline"):
                    batch["reward_baselines"] = self._greedy_baseline_scores(batch, step)
        finally:
            self._end_rounds()
        metrics.update(self._engine_counts(since=counts, prefix="perf/"))
        if self.awake_memory_gb is not None:
            metrics["perf/generation_device_memory_used_gb"] = self.awake_memory_gb
        return ScoredSamples(batch, rewards, metrics, timings)

    def _rounds_follow(self) -> bool:
        """Whether the step may generate more than once (DAPO refills, ReMax's greedy round), so the engines stay
        awake between rounds. Not with a colocated reward model: it scores between the rounds on the same devices."""
        more = self.config.algorithm.online_filtering or self.needs.greedy_baseline
        return bool(more) and not self.config.worker.reward_model.colocated

    def _end_rounds(self) -> None:
        """Put the engines to sleep after rounds generated awake."""
        if self.stay_awake:
            self.stay_awake = False
            self.workers.run_all(HybridWorker.sleep_engine)
            self.engine_sleeps += 1

    def _engine_counts(self, since: dict[str, int] | None = None, prefix: str = "") -> dict[str, int]:
        """The weight syncs and engine sleeps so far (``since``: minus an earlier reading)."""
        counts = {"weight_syncs": self.weight_syncs, "engine_sleeps": self.engine_sleeps}
        if since is not None:
            counts = {key: value - since[key] for key, value in counts.items()}
        return {prefix + key: value for key, value in counts.items()}

    def score(self, batch: Batch) -> PendingRewards:
        """Send the samples' reward inputs to the reward scorer; the rewards may come later."""
        inputs = build_reward_inputs(batch, self.tokenizer, self.config.worker.reward.skip_special_tokens)
        if self.reward_model is not None:  # its results go into each input, then the reward function runs
            return self.reward_model.rewards(batch, inputs, self.scorer)
        return self.scorer.score(inputs)

    def generate(
        self,
        prompts: Batch,
        step: int,
        round_index: int,
        sampling: dict[str, Any] | None = None,
        n: int | None = None,
    ) -> Batch:
        """``n`` samples per prompt (default: ``worker.rollout.n``, or 1 with explicit ``sampling``) from sampling
        round ``round_index`` of ``step``, each with its own reproducible seed."""
        n = n if n is not None else (self.config.worker.rollout.n if sampling is None else 1)
        first_seed = round_first_seed(self.config.worker.rollout.seed, step, round_index, len(prompts) * n)
        return self._generate(prompts, f"{step}-{round_index}", first_seed, sampling or self.sampling(), n)

    def sampling(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """This run's sampling settings, with ``overrides``."""
        return sampling_settings(self.config, overrides)

    def _generate(self, prompts: Batch, round_id: str, first_seed: int, sampling: dict[str, Any], n: int) -> Batch:
        """Any number of prompts (the group pads the rows to a multiple of the worker count and drops the extra
        samples)."""
        prompts["uid"] = np.array([f"{round_id}-{i}" for i in range(len(prompts))], dtype=object)
        batch = prompts.repeat(n, interleave=True)
        batch["sample_seed"] = torch.arange(len(batch)) + first_seed
        batch["sample_id"] = torch.arange(len(batch)) + self.samples_generated
        self.samples_generated += len(batch)
        # what the engines do not read stays on the driver: the dataset's other columns (for the reward), and, with
        # the sample cache on, the processed vision tensors (vLLM reads the images; the tensors travel once, to the
        # rank that computes the sample's log-probs after balancing)
        held_back = [ROW_COLUMNS] if ROW_COLUMNS in batch else []
        if self.config.trainer.cache_sample_tensors and self.engine_reads_images and VISION in batch:
            held_back.append(VISION)
        kept = batch.pop(*held_back) if held_back else None
        output = self.workers.run_split(HybridWorker.generate, batch, sampling, self.stay_awake, pad=True)
        # every rank syncs and sleeps alike (collectives): rank 0's counts are the group's
        self.weight_syncs += output.meta.get("weight_syncs", 0)
        self.engine_sleeps += output.meta.get("engine_sleeps", 0)
        if "device_memory_used_gb" in output.meta:
            self.awake_memory_gb = max(self.awake_memory_gb or 0.0, output.meta["device_memory_used_gb"])
        for key in held_back:
            output[key] = kept[key]
        return output

    def _fill_with_informative_groups(
        self, batch: Batch, rewards: PendingRewards, step: int, metrics: dict[str, float]
    ) -> tuple[Batch, PendingRewards]:
        """DAPO dynamic sampling: keep groups whose mean score is strictly inside (filter_low, filter_high) and
        generate from further prompts until ``rollout_batch_size`` groups are kept."""
        algorithm, target = self.config.algorithm, self.config.data.rollout_batch_size * self.config.worker.rollout.n
        kept_batches: list[Batch] = []
        kept_rewards: list[Rewards] = []
        generated = 0
        limit = self.config.trainer.max_try_make_batch
        attempts = itertools.count() if limit == -1 else range(limit)  # -1: no limit
        rounds = tqdm(attempts, desc="rollout rounds", leave=False, disable=None)
        for attempt in rounds:
            if attempt:
                batch = self.generate(self.prompts.next(), step, round_index=attempt)
                rewards = self.score(batch)
            resolved = rewards.result()
            generated += len(batch)
            keep = filter_groups(
                resolved.sub_scores, batch["uid"], algorithm.filter_key, algorithm.filter_low, algorithm.filter_high
            )
            kept_batches.append(batch.index(keep))
            kept_rewards.append(resolved.index(keep))
            rounds.set_postfix(kept=f"{sum(len(kept) for kept in kept_batches)}/{target}")
            if sum(len(kept) for kept in kept_batches) >= target:
                break
        else:
            kept = sum(len(kept) for kept in kept_batches)
            raise UserError(
                f"online filtering kept {kept} of the {target} samples a step needs after "
                f"trainer.max_try_make_batch={self.config.trainer.max_try_make_batch} rounds of generation: too few "
                f"groups have a mean {algorithm.filter_key!r} score inside (algorithm.filter_low="
                f"{algorithm.filter_low}, algorithm.filter_high={algorithm.filter_high}). Raise max_try_make_batch, "
                "widen the filter, or use easier data"
            )
        first = list(range(target))  # groups are whole: target is a multiple of n
        metrics.update({"filter/rounds": attempt + 1, "filter/kept_ratio": target / generated})
        return Batch.concat(kept_batches).index(first), PendingRewards(Rewards.concat(kept_rewards).index(first))

    def _greedy_baseline_scores(self, batch: Batch, step: int) -> torch.Tensor:
        """ReMax's baseline: the score of one greedy response per prompt, repeated over the prompt's group."""
        n = self.config.worker.rollout.n
        prompts = prompts_of(batch.index(list(range(0, len(batch), n))))
        first_seed = greedy_baseline_first_seed(self.config.worker.rollout.seed, step, len(prompts))
        greedy = self._generate(prompts, f"{step}-greedy", first_seed, self.sampling({"greedy": True}), n=1)
        return self.score(greedy).result().scores.repeat_interleave(n)

    def close(self) -> None:
        """Stop the reward model's own workers (``worker.reward_model.placement=standalone``)."""
        if self.reward_model is not None:
            self.reward_model.close()

    # ------------------------------------------------------------------------------------------- validation
    def validate(self, step: int) -> Validation:
        """Generate for the whole validation set with ``worker.rollout.val_override_config`` and score it: ``val/``
        metrics (reward and sub-scores, response lengths) and the first ``trainer.val_generations_to_log`` samples."""
        n, overrides = validation_overrides(self.config)
        sampling = self.sampling(overrides)
        dataset = self.val_dataset
        size = self.config.data.val_batch_size
        size = len(dataset) if size == -1 else size
        scores, sub_scores, lengths, shown, timed_out = [], defaultdict(list), [], [], []
        counts = self._engine_counts()
        starts = range(0, len(dataset), size)
        # the rounds generate awake, the engines sleep once after the last (the actor does not change meanwhile)
        self.stay_awake = len(starts) > 1 and not self.config.worker.reward_model.colocated
        try:
            for start in tqdm(starts, desc="validate", leave=False, disable=None):
                rows = range(start, min(start + size, len(dataset)))
                prompts = collate_fn([dataset[i] for i in rows])
                batch = self.generate(prompts, step, VALIDATION_ROUND + start, sampling, n=n)
                rewards = self.score(batch).result()
                scores.append(rewards.scores)
                if rewards.timed_out is not None:
                    timed_out += rewards.timed_out
                for key, values in rewards.sub_scores.items():
                    sub_scores[key] += list(values)
                lengths.append(batch["response_mask"].sum(dim=-1).float())
                keep = self.config.trainer.val_generations_to_log - len(shown)
                shown += self._generation_records(batch, rewards.scores)[: max(keep, 0)]
        finally:
            self._end_rounds()
        all_scores, all_lengths = torch.cat(scores), torch.cat(lengths)
        metrics = {
            "val/reward_score": all_scores.mean().item(),
            "val/response_length/mean": all_lengths.mean().item(),
            "val/response_length/clip_ratio": (all_lengths >= sampling["max_tokens"]).float().mean().item(),
        }
        for key, values in sub_scores.items():
            if key != "overall":
                metrics[f"val/{key}"] = float(np.mean(values))
        if timed_out:  # worker.reward.timeout_score set: samples scored with it, not by the reward function
            metrics["val/reward_timeouts"] = float(sum(timed_out))
        metrics.update(self._engine_counts(since=counts, prefix="val/"))
        return Validation(metrics, shown)

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
