"""Partial rollout on colocated workers (``async_training.schedule=partial_rollout``).

More prompts generate than a step trains on (``async_training.in_flight_prompts``, twice ``data.rollout_batch_size``
by default). Each step the workers continue every unfinished response and stop once the step's
``rollout_batch_size`` groups are complete; the step trains on them, and the responses still running are kept as
data (tokens, the engine's log-probs, the versions they were sampled under) and continued after the update, under
the new weights, with their images. A step therefore never waits for the longest response of its batch: the long
tail finishes during later steps while shorter responses fill the batch.

Everything is decided deterministically, never by timing:

- groups are kept in a canonical order (the version they were admitted under, then their admission number); each
  round deals the unfinished groups to the workers in that order, and every worker stops at its share of the groups
  still needed (``StopRule``), so the groups that finish depend only on the tokens sampled;
- the step trains on the first complete groups in canonical order (the oldest first); further complete groups are
  carried to the next step;
- every segment of a response is sampled with its own seed, a function of (``worker.rollout.seed``, the group's
  admission number, the sample, the segment);
- the staleness bound: a group admitted under version ``v`` may train at a step that trains from version
  ``v + max_staleness`` at the latest. With ``stale_samples=wait`` a group at the bound must finish in that step's
  generation (the stop waits for it); with ``drop`` a group at the bound that is still running when the step stops
  is discarded and its prompt generated again. More groups at the bound than a step trains on (possible only while
  the first admitted prompts drain) are restarted too; ``async/evicted_groups`` counts both.

The pool is saved with each checkpoint (``state_dict``: dataset indices, tokens, log-probs, versions; the prompts and
their images are read again from the dataset on resume), so a resumed run continues exactly where the uninterrupted
one would have been.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from easyr1.config import PPOConfig
from easyr1.data import RLDataset, collate_fn
from easyr1.data.sampler import PromptStream
from easyr1.engines import engine_traits
from easyr1.engines.base import pack_responses
from easyr1.logging.timing import timed
from easyr1.models.loading import pad_token_id
from easyr1.protocol import Batch
from easyr1.reward import ROW_COLUMNS, RewardScorer
from easyr1.schedules.versions import staleness, trained_version, version_metrics
from easyr1.stages.base import ScoredSamples, Validation
from easyr1.stages.sampling import GREEDY_SEEDS_START
from easyr1.stages.single_turn import VISION, SingleTurnStage
from easyr1.workers.hybrid_worker import HybridWorker


@dataclass
class Sample:
    """One response of a group, as far as it has been generated."""

    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)  # the engine's, each under the version that sampled it
    version_first: int | None = None  # the weight version of the first token (None: no token yet)
    version_last: int | None = None
    finished: bool = False
    segments: int = 0  # generation calls that added tokens to it


@dataclass
class Group:
    """A prompt and its ``worker.rollout.n`` samples, from admission until a step trains on them."""

    number: int  # admission order over the run: the group's identity
    dataset_index: int
    admitted_version: int  # the weight version when the prompt was admitted (its samples' oldest possible version)
    prompt: Batch  # the dataset's row, collated (one row)
    samples: list[Sample]

    @property
    def uid(self) -> str:
        """The group's ``uid`` in the batch (its samples' advantage group)."""
        return f"p{self.number}"

    @property
    def complete(self) -> bool:
        """Whether every sample has finished."""
        return all(sample.finished for sample in self.samples)


def segment_seed(rollout_seed: int, group: int, sample: int, segment: int) -> int:
    """The sampling seed of one segment of one response: a hash of its coordinates, below ``2**62`` (the range of
    sampling seeds, :mod:`easyr1.stages.sampling`)."""
    digest = hashlib.blake2b(f"{rollout_seed}/{group}/{sample}/{segment}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % GREEDY_SEEDS_START


def objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (lists stay lists, not a 2-D array)."""
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


class PartialRolloutStage:
    """A :class:`~easyr1.stages.base.RolloutStage` whose responses may span several steps' weights.

    It draws its prompts from the prompt stream itself (``draws_prompts``): it admits ahead of the step. Scoring and
    validation are the single-turn stage's.
    """

    rows_per_sample = 1
    draws_prompts = True

    def __init__(
        self,
        config: PPOConfig,
        workers: Any,
        scorer: RewardScorer,
        prompts: PromptStream,
        tokenizer: Any,
        val_dataset: RLDataset | None = None,
        reward_model: Any = None,
    ) -> None:
        self.config = config
        self.workers = workers
        self.prompts = prompts
        self.single_turn = SingleTurnStage(config, workers, scorer, prompts, tokenizer, val_dataset, reward_model)
        self.pad_token_id = pad_token_id(tokenizer)
        schedule = config.async_training
        self.batch_groups = config.data.rollout_batch_size
        self.in_flight = schedule.in_flight_prompts or 2 * self.batch_groups
        self.max_staleness = schedule.max_staleness
        self.wait_for_stale = schedule.stale_samples == "wait"
        self.n = config.worker.rollout.n
        # what the engine does not read stays on the driver (as in the single-turn stage)
        self.held_back = [ROW_COLUMNS]
        if config.trainer.cache_sample_tensors and engine_traits(config.worker.rollout.name).reads_images:
            self.held_back.append(VISION)
        self.pool: list[Group] = []
        self.admitted = 0

    # ------------------------------------------------------------------------------------------------ a step
    def collect(self, prompts: Batch | None, step: int) -> ScoredSamples:
        """Admit prompts up to ``in_flight_prompts``, generate until the step's groups are complete, return them
        scored; the rest stay in the pool."""
        version = trained_version(step)
        metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        self._admit(version)
        rounds = reprefill = generated = 0
        with timed(timings, "gen"):
            while sum(group.complete for group in self.pool) < self.batch_groups:
                sent, new = self._generate_round(step)
                rounds, reprefill, generated = rounds + 1, reprefill + sent, generated + new
        trained, evicted = self._select(version)
        evicted += self._drop_stale(version)
        batch = self._training_batch(trained, step)
        metrics.update(version_metrics(batch["version_first"], batch["version_last"], step))
        metrics.update(
            {
                "async/rounds": float(rounds),
                "async/reprefill_tokens": float(reprefill),
                "async/generated_tokens": float(generated),
                "async/evicted_groups": float(evicted),
                "async/carried_groups": float(sum(group.complete for group in self.pool)),
                "async/inflight_groups": float(len(self.pool)),
            }
        )
        return ScoredSamples(batch, self.single_turn.score(batch), metrics, timings)

    def _admit(self, version: int) -> None:
        """Fill the pool up to ``in_flight_prompts`` groups with prompts from the stream (whole batches)."""
        while len(self.pool) + self.batch_groups <= self.in_flight:
            batch = self.prompts.next()
            for row in range(len(batch)):
                self.pool.append(self._group(batch.index([row]), version))

    def _group(self, prompt: Batch, version: int) -> Group:
        group = Group(
            number=self.admitted,
            dataset_index=int(prompt["dataset_index"][0]),
            admitted_version=version,
            prompt=prompt,
            samples=[Sample() for _ in range(self.n)],
        )
        self.admitted += 1
        return group

    def _at_bound(self, group: Group, version: int) -> bool:
        """Whether ``group`` is as old as a trained group may be at the step that trains from ``version``."""
        return version - group.admitted_version >= self.max_staleness

    def _generate_round(self, step: int) -> tuple[int, int]:
        """One generation call over every unfinished sample; returns the partial tokens re-sent and the new ones."""
        version = trained_version(step)
        needed = self.batch_groups - sum(group.complete for group in self.pool)
        running = sorted((group for group in self.pool if not group.complete), key=self._order)
        workers = self.workers.num_workers
        shares: list[list[tuple[Group, int]]] = [[] for _ in range(workers)]
        for position, group in enumerate(running):  # whole groups, dealt in canonical order
            shares[position % workers] += [(group, j) for j, sample in enumerate(group.samples) if not sample.finished]
        width = max(len(share) for share in shares)
        rows: list[Batch] = []
        for share in shares:
            rows += [self._row(group, j, step, active=True) for group, j in share]
            filler = share[0] if share else (running[0], 0)
            rows += [self._row(*filler, step, active=False) for _ in range(width - len(share))]
        batch = Batch.concat(rows)
        batch["sample_id"] = torch.arange(len(batch)) + self.single_turn.samples_generated
        self.single_turn.samples_generated += len(batch)
        batch.pop(*[key for key in self.held_back if key in batch])  # the engine reads neither; the pool keeps them
        quota = -(-needed // workers)
        output = self.workers.run_split(HybridWorker.generate, batch, self.single_turn.sampling(), stop_groups=quota)
        sent = new = 0
        for position, (group, j) in enumerate(pair for share in shares for pair in self._padded(share, width)):
            if group is None:
                continue
            sample, tokens = group.samples[j], int(output["new_tokens"][position])
            sent += len(sample.ids)
            length = int(output["response_mask"][position].sum())
            sample.ids = output["responses"][position, :length].tolist()
            sample.log_probs = output["rollout_log_probs"][position, :length].tolist()
            sample.finished = bool(output["finished"][position])
            if tokens:
                sample.version_first = version if sample.version_first is None else sample.version_first
                sample.version_last = version
                sample.segments += 1
                new += tokens
        return sent, new

    @staticmethod
    def _padded(share: list[tuple[Group, int]], width: int) -> list[tuple[Group | None, int]]:
        return [*share, *[(None, 0)] * (width - len(share))]

    @staticmethod
    def _order(group: Group) -> tuple[int, int]:
        """The canonical order: oldest admission version first, then admission number."""
        return group.admitted_version, group.number

    def _row(self, group: Group, j: int, step: int, active: bool) -> Batch:
        """The generation row of sample ``j`` of ``group``: its prompt, its partial response, its segment's seed."""
        sample = group.samples[j]
        row = group.prompt.union(Batch())
        row["uid"] = objects([group.uid])
        row["partial_ids"] = objects([list(sample.ids)])
        row["partial_log_probs"] = objects([list(sample.log_probs)])
        seed = segment_seed(self.config.worker.rollout.seed, group.number, j, sample.segments)
        row["sample_seed"] = torch.tensor([seed])
        row["active"] = torch.tensor([active])
        row["must_finish"] = torch.tensor([active and self.wait_for_stale and self._at_bound(group, step - 1)])
        return row

    def _select(self, version: int) -> tuple[list[Group], int]:
        """The step's groups: the first complete ones in canonical order. Complete groups at the bound beyond them
        cannot wait another step: they are restarted (returns how many)."""
        complete = sorted((group for group in self.pool if group.complete), key=self._order)
        trained = complete[: self.batch_groups]
        over = [group for group in complete[self.batch_groups :] if self._at_bound(group, version)]
        for group in over:
            self._restart(group, version)
        chosen = {id(group) for group in trained}
        self.pool = [group for group in self.pool if id(group) not in chosen]
        return trained, len(over)

    def _drop_stale(self, version: int) -> int:
        """Groups still running at the bound (``stale_samples=drop``, or any left by ``wait``): restarted."""
        stale = [group for group in self.pool if not group.complete and self._at_bound(group, version)]
        for group in stale:
            self._restart(group, version)
        return len(stale)

    def _restart(self, group: Group, version: int) -> None:
        """Discard a group's samples; its prompt is generated again from the next step, as newly admitted."""
        group.samples = [Sample() for _ in range(self.n)]
        group.admitted_version = version + 1

    def _training_batch(self, groups: list[Group], step: int) -> Batch:
        """The rows of ``groups`` as the single-turn stage returns them, with their versions."""
        prompts = Batch.concat([group.prompt for group in groups]).repeat(self.n, interleave=True)
        prompts["uid"] = objects([group.uid for group in groups for _ in range(self.n)])
        samples = [sample for group in groups for sample in group.samples]
        batch = pack_responses(
            prompts,
            [sample.ids for sample in samples],
            [sample.log_probs for sample in samples],
            self.config.data.max_response_length,
            self.pad_token_id,
        )
        batch["sample_id"] = torch.arange(len(batch)) + self.single_turn.samples_generated
        self.single_turn.samples_generated += len(batch)
        batch["version_first"] = torch.tensor([sample.version_first for sample in samples], dtype=torch.long)
        batch["version_last"] = torch.tensor([sample.version_last for sample in samples], dtype=torch.long)
        batch["staleness"] = staleness(batch["version_first"], step)
        return batch

    def close(self) -> None:
        """Stop what the single-turn stage started (a standalone reward model's workers)."""
        self.single_turn.close()

    # ------------------------------------------------------------------------------------------- validation
    def validate(self, step: int) -> Validation:
        """The single-turn stage's validation (between steps, when no generation is running)."""
        return self.single_turn.validate(step)

    def sampling(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """This run's sampling settings, with ``overrides``."""
        return self.single_turn.sampling(overrides)

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The pool as plain data (read back with ``torch.load(weights_only=True)``): each group's dataset index,
        admission, and samples; the prompts themselves are read again from the dataset."""
        return {
            "admitted": self.admitted,
            "samples_generated": self.single_turn.samples_generated,
            "groups": [
                {
                    "number": group.number,
                    "dataset_index": group.dataset_index,
                    "admitted_version": group.admitted_version,
                    "samples": [
                        {
                            "ids": torch.tensor(sample.ids, dtype=torch.long),
                            "log_probs": torch.tensor(sample.log_probs, dtype=torch.float32),
                            "version_first": -1 if sample.version_first is None else sample.version_first,
                            "version_last": -1 if sample.version_last is None else sample.version_last,
                            "finished": sample.finished,
                            "segments": sample.segments,
                        }
                        for sample in group.samples
                    ],
                }
                for group in self.pool
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the pool saved by :meth:`state_dict`, reading each prompt from the training dataset again."""
        dataset = self.prompts.loader.dataset
        self.admitted = int(state["admitted"])
        self.single_turn.samples_generated = int(state["samples_generated"])
        self.pool = []
        for saved in state["groups"]:
            samples = [
                Sample(
                    ids=saved_sample["ids"].tolist(),
                    log_probs=saved_sample["log_probs"].tolist(),
                    version_first=None if saved_sample["version_first"] < 0 else int(saved_sample["version_first"]),
                    version_last=None if saved_sample["version_last"] < 0 else int(saved_sample["version_last"]),
                    finished=bool(saved_sample["finished"]),
                    segments=int(saved_sample["segments"]),
                )
                for saved_sample in saved["samples"]
            ]
            prompt = collate_fn([dataset[int(saved["dataset_index"])]])
            self.pool.append(
                Group(
                    int(saved["number"]), int(saved["dataset_index"]), int(saved["admitted_version"]), prompt, samples
                )
            )
