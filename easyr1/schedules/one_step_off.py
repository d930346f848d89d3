"""``async_training.schedule=one_step_off``: the batch of step ``k + 1`` generates while step ``k`` trains.

Generation and training run on different workers (``placement=split``): the generator group holds only engines, the
trainer group the models. :class:`OneStepOffStage` is the step's rollout stage; in ``collect(None, k)`` it

1. waits for the batch launched during step ``k - 1`` (at step 1, or after a resume without a saved batch, it
   generates one now, with the weights step ``k`` trains from);
2. pushes the trainers' current weights (version ``k - 1``) to the generators (``HybridWorker.push_weights`` /
   ``receive_weights``; ``timing/weight_push``, ``perf/weight_push_bytes``);
3. launches the next batch (prompts drawn from the stream, sampling seeds of step ``k + 1``) on the generators, in a
   driver thread around the single-turn stage's own ``generate``, so it runs while the trainers compute the
   experience and update (the trainer group's calls and the generator group's are separate actors);
4. scores the waited batch and returns it, stamped with the version it was generated with (``k - 2``: staleness 1;
   0 at step 1), its ``async/`` metrics, ``async/trainer_wait_ratio`` (the share of the step the driver waited for
   generation) and ``async/generator_idle_ratio`` (the generators' time between finishing a batch and being handed
   the next one, over the step).

Validation waits for the batch in flight, pushes the current weights and validates on the generators. A checkpoint
waits for the batch in flight too and saves it as data (:meth:`OneStepOffStage.state_dict`: dataset indices, uids,
seeds, response ids, the engine's log-probs, the version), and a resumed run rebuilds it from the dataset and trains
on it: the resumed run's metrics equal the uninterrupted run's. The prompt stream's position is the trainer's (the
batch in flight's prompts were drawn before the checkpoint). The batch is launched at the last step too, so a run
continued past its ``trainer.max_steps`` is as exact.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from easyr1.config import PPOConfig
from easyr1.data import RLDataset, collate_fn
from easyr1.data.sampler import PromptStream
from easyr1.engines.base import pack_responses
from easyr1.logging.timing import timed
from easyr1.models.loading import pad_token_id
from easyr1.protocol import Batch
from easyr1.reward import RewardScorer
from easyr1.schedules.versions import trained_version, version_metrics
from easyr1.stages.base import ScoredSamples, Validation
from easyr1.stages.single_turn import SingleTurnStage
from easyr1.workers.hybrid_worker import HybridWorker


@dataclass
class GeneratedBatch:
    """A batch generated ahead of the step that trains on it."""

    batch: Batch
    step: int  # the step that trains on it (its sampling seeds are that step's)
    version: int  # the weight version it was generated with
    seconds: float = 0.0  # the generation's duration
    finished_at: float = 0.0  # time.perf_counter() when it was done


class OneStepOffStage:
    """The one-step-off schedule on a split placement (see the module's docstring).

    Args:
        config: the run's settled config.
        trainers: the trainer group (the trainer's ``workers``).
        generators: the generator group, whose engines generate and validate.
        scorer: the reward scorer.
        prompts: the run's prompt stream (this stage draws from it; the trainer saves its position).
        tokenizer: decodes responses for the reward.
        val_dataset: the validation set, if the run validates.
    """

    draws_prompts = True
    rows_per_sample = 1

    def __init__(
        self,
        config: PPOConfig,
        trainers: Any,
        generators: Any,
        scorer: RewardScorer,
        prompts: PromptStream,
        tokenizer: Any,
        val_dataset: RLDataset | None = None,
        reward_model: Any = None,
    ) -> None:
        self.config = config
        self.trainers = trainers
        self.generators = generators
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.single_turn = SingleTurnStage(config, generators, scorer, prompts, tokenizer, val_dataset, reward_model)
        self.rounds = config.data.rollout_batch_size // (
            config.data.mini_rollout_batch_size or config.data.rollout_batch_size
        )
        # one generation in flight at a time, in this thread: its Ray calls wait while the trainers' run
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="one-step-off-generation")
        self._in_flight: Future | None = None
        self._ready: GeneratedBatch | None = None  # waited for (by validation or a checkpoint) or restored
        self.pushed_version: int | None = None  # the weight version the generators hold (None: not pushed yet)
        self.push_results: dict[str, list[dict[str, float]]] = {}  # the last push, as each side reported it
        self._last_collect_end: float | None = None

    # ------------------------------------------------------------------------------------------------ step
    def sampling(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """This run's sampling settings, with ``overrides``."""
        return self.single_turn.sampling(overrides)

    def collect(self, prompts: Batch | None, step: int) -> ScoredSamples:
        """Step ``step``'s scored samples: the batch generated during the previous step (see the module's
        docstring). ``prompts`` is ``None``: this stage draws its own."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        generated = self._take(step)
        if generated is None:  # nothing generated ahead (step 1, or a resume without a saved batch): generate now
            self._push(trained_version(step), timings, metrics)
            generated = self._generate(self._draw(), step, trained_version(step))
        ready = time.perf_counter()
        self._push(trained_version(step), timings, metrics)
        self._in_flight = self._executor.submit(self._generate, self._draw(), step + 1, trained_version(step))
        launched = time.perf_counter()

        batch = generated.batch
        batch["version_first"] = torch.full((len(batch),), generated.version, dtype=torch.int64)
        batch["version_last"] = batch["version_first"].clone()
        rewards = self.single_turn.score(batch)
        # the step, as the driver sees it: from the end of the previous collect to the end of this one's wait
        interval = max(ready - (self._last_collect_end or start), 1e-9)
        self._last_collect_end = time.perf_counter()
        timings["gen"] = generated.seconds
        timings["gen_wait"] = ready - start
        metrics.update(version_metrics(batch["version_first"], batch["version_last"], step))
        metrics["async/trainer_wait_ratio"] = min(timings["gen_wait"] / interval, 1.0)
        metrics["async/generator_idle_ratio"] = min(max(launched - generated.finished_at, 0.0) / interval, 1.0)
        return ScoredSamples(batch, rewards, metrics, timings)

    def _draw(self) -> Batch:
        """A step's prompts from the stream (in rounds of ``data.mini_rollout_batch_size``, as the trainer draws)."""
        return Batch.concat([self.prompts.next() for _ in range(self.rounds)])

    def _generate(self, prompts: Batch, step: int, version: int) -> GeneratedBatch:
        """Generate ``step``'s samples of ``prompts`` on the generators (with the weights they hold: ``version``)."""
        start = time.perf_counter()
        batch = self.single_turn.generate(prompts, step, round_index=0)
        finished = time.perf_counter()
        return GeneratedBatch(batch, step, version, finished - start, finished)

    def _take(self, step: int) -> GeneratedBatch | None:
        """The batch generated ahead for ``step`` (waiting for it), or ``None`` if there is none."""
        self._wait()
        generated, self._ready = self._ready, None
        if generated is not None and generated.step != step:
            raise RuntimeError(f"the batch generated ahead is for step {generated.step}, not step {step}")
        return generated

    def _wait(self) -> None:
        """Wait for the generation in flight, if any; its batch becomes the ready one."""
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            self._ready = future.result()

    def _push(self, version: int, timings: dict[str, float], metrics: dict[str, float]) -> None:
        """Send the trainers' weights (``version``) to the generators unless they hold them already. The generators
        must be idle: a push waits for both sides, and a generator busy generating would hold trainer rank 0."""
        if self.pushed_version == version:
            return
        from easyr1.distributed.worker_group import collect_together

        with timed(timings, "weight_push"):
            sent, received = collect_together(
                [
                    (self.trainers, self.trainers.submit(HybridWorker.push_weights)),
                    (self.generators, self.generators.submit(HybridWorker.receive_weights)),
                ]
            )
        self.pushed_version = version
        self.push_results = {"sent": sent, "received": received}
        metrics["perf/weight_push_bytes"] = float(sent[0]["bytes"])

    # ------------------------------------------------------------------------------------------ validation
    def validate(self, step: int) -> Validation:
        """Validate the current weights on the generators: the batch in flight is waited for (kept for its step),
        the weights after ``step`` updates pushed, then the single-turn stage's validation."""
        self._wait()
        self._push(step, {}, {})
        return self.single_turn.validate(step)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The batch generated ahead (waited for), as plain data: empty when there is none."""
        self._wait()
        if self._ready is None:
            return {}
        generated, batch = self._ready, self._ready.batch
        return {
            "step": generated.step,
            "version": generated.version,
            "dataset_index": batch["dataset_index"].clone(),
            "uid": [str(uid) for uid in batch["uid"]],
            "sample_seed": batch["sample_seed"].clone(),
            "responses": batch["responses"].clone(),
            "response_mask": batch["response_mask"].clone(),
            "rollout_log_probs": batch["rollout_log_probs"].clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the batch generated ahead from ``state`` (:meth:`state_dict`): its prompts read again from the
        dataset, its responses and the engine's log-probs as saved. The generators get the restored weights at the
        next push."""
        self._in_flight, self._ready, self.pushed_version = None, None, None
        if not state:
            return
        n = self.config.worker.rollout.n
        dataset = self.prompts.loader.dataset
        prompt_rows = state["dataset_index"][::n].tolist()
        prompts = collate_fn([dataset[index] for index in prompt_rows])
        prompts["uid"] = np.array(state["uid"][::n], dtype=object)
        rows = prompts.repeat(n, interleave=True)
        rows["sample_seed"] = state["sample_seed"]
        rows["sample_id"] = torch.arange(len(rows)) + self.single_turn.samples_generated
        self.single_turn.samples_generated += len(rows)
        mask, responses, log_probs = state["response_mask"], state["responses"], state["rollout_log_probs"]
        lengths = mask.sum(dim=-1).tolist()
        batch = pack_responses(
            rows,
            [responses[row, :length].tolist() for row, length in enumerate(lengths)],
            [log_probs[row, :length].tolist() for row, length in enumerate(lengths)],
            responses.shape[1],
            pad_token_id(self.tokenizer),
        )
        self._ready = GeneratedBatch(batch, int(state["step"]), int(state["version"]))

    def close(self) -> None:
        """Stop the generator group and the generation thread (a generation in flight ends with its actors), and what
        the single-turn stage started (a standalone reward model's workers)."""
        self.generators.shutdown()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.single_turn.close()
