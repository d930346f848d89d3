"""The rollout stage: a step's prompts in, its sampled and scored responses out.

:class:`RolloutStage` is the interface the trainer drives: ``collect(prompts, step) -> Rollout``. The batch it
returns holds one row per sample with the fields the rest of the step reads (``prompts``, ``responses``,
``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs``, ``uid``,
``sample_id``, the prompt's objects, and ``reward_baselines`` when the estimator needs a greedy baseline); its
rewards may still be computing, so that the workers' log-prob passes overlap the reward function.
:class:`SingleTurnRollout` is the one-prompt-one-response stage; a multi-turn stage implements the same method.

Seeds: every sample has its own sampling seed, a function of (``worker.rollout.seed``, step, generation round,
sample) only, so a step replays exactly. Sampling rounds (the step's rounds, DAPO's refills, validation) take
seeds below ``2**62``; greedy baseline rounds (ReMax) take seeds from ``2**62`` on, which no sampling round can
have whatever the number of rounds.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import ray
import torch
from tqdm import tqdm

from easyr1.algorithms import estimator_needs, filter_groups
from easyr1.config import PPOConfig
from easyr1.data.sampler import PromptStream
from easyr1.distributed import WorkerGroup
from easyr1.errors import UserError
from easyr1.logging.timing import timed
from easyr1.protocol import Batch
from easyr1.workers.reward import ROW_COLUMNS, Rewards, build_reward_inputs
from easyr1.workers.rollout.base import SamplingSettings


# The settings a call may change (engine settings such as memory are fixed at start-up).
SAMPLING_KEYS = {setting.name for setting in dataclasses.fields(SamplingSettings)}
# The per-sample python objects of a prompt (besides its tensors), as the dataset yields them.
PROMPT_OBJECTS = ("raw_prompt_ids", "multi_modal_data", "multi_modal_inputs", "ground_truth", ROW_COLUMNS)
# The processed vision tensors of a prompt (what the actor's forward reads; the engine gets the images).
VISION = "multi_modal_inputs"
# Sampling seeds stay below this; greedy baseline rounds count up from it (torch seeds are int64).
GREEDY_SEEDS_START = 2**62


def round_first_seed(rollout_seed: int, step: int, round_index: int, samples: int) -> int:
    """The seed of the first sample of a sampling round of ``samples`` samples (the others follow it).

    Raises:
        UserError: when the seeds would leave the sampling range (a ``worker.rollout.seed`` far too large).
    """
    first = ((rollout_seed * 1_000_003 + step) * 1_009 + round_index) * samples
    if not 0 <= first <= GREEDY_SEEDS_START - samples:
        raise UserError(
            f"worker.rollout.seed={rollout_seed} gives step {step} sampling seeds outside [0, 2**62); use a smaller "
            "non-negative seed (below 1000 fits rounds of up to 4 million samples)"
        )
    return first


def greedy_baseline_first_seed(rollout_seed: int, step: int, samples: int) -> int:
    """The seed of the first sample of a step's greedy baseline round: above every sampling round's seeds."""
    return GREEDY_SEEDS_START + round_first_seed(rollout_seed, step, 0, samples)


def sampling_settings(config: PPOConfig, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine's sampling settings from ``worker.rollout`` (and ``data.max_response_length``), with overrides."""
    rollout = config.worker.rollout
    settings = {
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "max_tokens": config.data.max_response_length,
        "ignore_eos": rollout.ignore_eos,
    }
    settings.update(overrides or {})
    if settings["temperature"] == 0:  # EasyR1's way of asking for greedy decoding
        settings["greedy"], settings["temperature"] = True, 1.0
    return settings


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


class PendingRewards:
    """A batch's :class:`~easyr1.workers.reward.Rewards`: being computed by the reward actor, or already known."""

    def __init__(self, source: ray.ObjectRef | Rewards) -> None:
        self._source = source

    def result(self) -> Rewards:
        """The rewards (waits for the reward actor); a user error in the reward file is re-raised as is."""
        if isinstance(self._source, Rewards):
            return self._source
        try:
            self._source = ray.get(self._source)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, UserError):
                raise error.cause from None
            raise
        return self._source


@dataclass
class Rollout:
    """What a rollout stage hands the trainer: the samples, their rewards, and the stage's metrics and timings."""

    batch: Batch
    rewards: PendingRewards
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class RolloutStage(Protocol):
    """Turns a step's prompts into samples with their rewards (see the module docstring for the batch's fields)."""

    # Training rows per sample (the unit of `global_batch_size * n`): more than 1 when a sample is split into rows.
    rows_per_sample: int

    def collect(self, prompts: Batch, step: int) -> Rollout:
        """Sample and score responses to ``prompts`` for training step ``step``."""
        ...


class SingleTurnRollout:
    """One response per sample: ``worker.rollout.n`` samples per prompt, DAPO refills, ReMax greedy baselines.

    Generation runs on the workers (each gets an equal consecutive chunk), scoring in the reward actor.
    """

    rows_per_sample = 1

    def __init__(
        self,
        config: PPOConfig,
        workers: WorkerGroup,
        reward_actor: Any,
        prompts: PromptStream,
        tokenizer: Any,
    ) -> None:
        self.config = config
        self.workers = workers
        self.reward_actor = reward_actor
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.needs = estimator_needs(config.algorithm.adv_estimator)
        # the next sample's id: the key of its tensors in the workers' per-step cache, never reused
        self.samples_generated = 0

    def collect(self, prompts: Batch, step: int) -> Rollout:
        """``n`` samples per prompt, scored; with online filtering, refilled to informative groups only."""
        metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        with timed(timings, "gen"):
            batch = self.generate(prompts, step, round_index=0)
        # the reward is computed in the reward actor while the workers go on; DAPO needs it at once
        rewards = self.score(batch)
        if self.config.algorithm.online_filtering:
            with timed(timings, "filter"):
                batch, rewards = self._fill_with_informative_groups(batch, rewards, step, metrics)
        if self.needs.greedy_baseline:
            with timed(timings, "gen_baseline"):
                batch["reward_baselines"] = self._greedy_baseline_scores(batch, step)
        return Rollout(batch, rewards, metrics, timings)

    def score(self, batch: Batch) -> PendingRewards:
        """Send the samples' reward inputs to the reward actor; the rewards come back later."""
        inputs = build_reward_inputs(batch, self.tokenizer, self.config.worker.reward.skip_special_tokens)
        return PendingRewards(self.reward_actor.score.remote(inputs))

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
        """Any number of prompts: rows are repeated up to a multiple of the worker count for the engines and the
        extra samples dropped."""
        prompts["uid"] = np.array([f"{round_id}-{i}" for i in range(len(prompts))], dtype=object)
        batch = prompts.repeat(n, interleave=True)
        batch["sample_seed"] = torch.arange(len(batch)) + first_seed
        batch["sample_id"] = torch.arange(len(batch)) + self.samples_generated
        self.samples_generated += len(batch)
        size, workers = len(batch), self.workers.num_workers
        if size % workers:
            batch = Batch.concat([batch, batch.index(list(range(workers - size % workers)))])
        # what the engines do not read stays on the driver: the dataset's other columns (for the reward), and, with
        # the sample cache on, the processed vision tensors (vLLM reads the images; the tensors travel once, to the
        # rank that computes the sample's log-probs after balancing)
        held_back = [ROW_COLUMNS] if ROW_COLUMNS in batch else []
        if self.config.trainer.cache_sample_tensors and self.config.worker.rollout.name != "hf" and VISION in batch:
            held_back.append(VISION)
        kept = batch.pop(*held_back) if held_back else None
        output = self.workers.run_split("generate", batch, sampling)
        for key in held_back:
            output[key] = kept[key]
        return output.index(slice(0, size)) if len(output) != size else output

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
