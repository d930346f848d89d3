"""The driver's side: :class:`RewardModelClient` renders each sample's judge request, has the reward model score
every sample, then calls the reward function, whose :class:`~easyr1.reward.rewards.Rewards` carry the results (for
the ``reward_model/`` metrics and the rollout log, where the judge's text sits next to the response). Each reward
input gets its result in its ``reward_model`` entry (what the reward function reads,
:mod:`easyr1.reward_model.results`).

Where the reward model runs (``worker.reward_model.placement``):

- ``colocated``: on the hybrid workers (``HybridWorker.score_with_reward_model`` through ``run_split``), at once,
  before the reward function is sent its inputs;
- ``standalone``: on its own workers (:class:`~easyr1.reward_model.worker.RewardModelWorker`), in a driver thread
  that then waits for the reward function: the trainer goes on to the log-prob passes meanwhile, and the step waits
  for both only where it needs the rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from easyr1.data.prompt import IMAGE_MARKER
from easyr1.errors import ConfigError
from easyr1.protocol import Batch
from easyr1.reward.rewards import PendingRewards, Rewards
from easyr1.reward.scorer import RewardScorer
from easyr1.reward_model.results import RESULT_KEY, RewardModelResult
from easyr1.reward_model.scorer import PARSED, REQUEST, SCORE, TEXT, _objects
from easyr1.reward_model.template import TEMPLATE_KEY, JudgeTemplate


# reward_model/ metrics of a step: the mean score and the judgements the parser could not read
METRIC_PREFIX = "reward_model"


def image_counts(batch: Batch) -> list[int]:
    """How many images each sample's prompt has."""
    if "multi_modal_data" not in batch:
        return [0] * len(batch)
    return [len((data or {}).get("images") or []) for data in batch["multi_modal_data"]]


def render_requests(template: JudgeTemplate, inputs: Sequence[dict[str, Any]], counts: list[int]) -> list[str]:
    """Each sample's judge request (ConfigError naming the template when it places some but not all images)."""
    basic = ("response", "response_length", "ground_truth", "prompt", RESULT_KEY)
    requests = []
    for reward_input, count in zip(inputs, counts):
        row = {key: value for key, value in reward_input.items() if key not in basic}
        text = template.render(
            reward_input["prompt"], count, reward_input["response"], reward_input["ground_truth"], row
        )
        markers = text.count(IMAGE_MARKER)
        if markers not in (0, count):
            raise ConfigError(
                f"{TEMPLATE_KEY}={template.path} placed {markers} of a sample's {count} images; place "
                "{{ images[i] }} for every image (e.g. {% for image in images %}{{ image }}{% endfor %}) or none "
                "(then they go first)"
            )
        requests.append(text)
    return requests


class RewardModelClient:
    """The reward model of a run, seen from the driver: on the hybrid ``workers`` (colocated) or on ``own_workers``
    (a group of :class:`~easyr1.reward_model.worker.RewardModelWorker`, standalone)."""

    def __init__(self, config: Any, workers: Any, own_workers: Any = None) -> None:
        self.settings = config.worker.reward_model
        self.workers = workers
        self.own_workers = own_workers
        self.template = JudgeTemplate(self.settings.template) if self.settings.kind == "judge" else None
        # standalone: one thread, so batches are scored in the order they were generated
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="reward-model") if own_workers is not None else None

    def rewards(self, batch: Batch, inputs: Sequence[dict[str, Any]], scorer: RewardScorer) -> PendingRewards:
        """The batch's rewards: the reward model's results first, then the reward function on ``inputs`` (each
        given its result); colocated, the results are computed before this returns, standalone they may still be
        computing."""
        if self.thread is not None:
            return PendingRewards(self.thread.submit(self._score_then_reward, batch, inputs, scorer).result)
        results = self.score(batch, inputs)
        pending = scorer.score(inputs)
        return PendingRewards(lambda: replace(pending.result(), reward_model=results))

    def _score_then_reward(self, batch: Batch, inputs: Sequence[dict[str, Any]], scorer: RewardScorer) -> Rewards:
        results = self.score(batch, inputs)
        return replace(scorer.score(inputs).result(), reward_model=results)

    def score(self, batch: Batch, inputs: Sequence[dict[str, Any]]) -> list[RewardModelResult]:
        """Score ``batch`` where the reward model lives; each input gets its result, which are also returned."""
        from easyr1.reward_model.worker import RewardModelWorker
        from easyr1.workers.hybrid_worker import HybridWorker

        sent = batch.union(Batch())  # a shallow copy: the request field stays off the driver's batch
        if self.template is not None:
            sent[REQUEST] = _objects(render_requests(self.template, inputs, image_counts(batch)))
        if self.own_workers is not None:
            scored = self.own_workers.run_split(RewardModelWorker.score, sent, pad=True)
        else:
            scored = self.workers.run_split(HybridWorker.score_with_reward_model, sent, pad=True)
        results: list[RewardModelResult] = []
        for reward_input, score, ok, text in zip(
            inputs, scored[SCORE].tolist(), scored[PARSED].tolist(), list(scored[TEXT])
        ):
            result = RewardModelResult(score=float(score), text=text, parsed=bool(ok))
            reward_input[RESULT_KEY] = result
            results.append(result)
        return results

    def close(self) -> None:
        """Stop the thread and the reward model's own workers (standalone)."""
        if self.thread is not None:
            self.thread.shutdown(wait=True)
            self.thread = None
        if self.own_workers is not None:
            self.own_workers.shutdown()
            self.own_workers = None


def reward_model_metrics(rewards: Rewards) -> dict[str, float]:
    """``reward_model/score_mean`` and ``reward_model/unparseable`` (how many judgements got the unparseable score)
    of a step's rewards; none without a reward model."""
    if not rewards.reward_model:
        return {}
    results = rewards.reward_model
    return {
        f"{METRIC_PREFIX}/score_mean": sum(result["score"] for result in results) / len(results),
        f"{METRIC_PREFIX}/unparseable": float(sum(not result["parsed"] for result in results)),
    }
