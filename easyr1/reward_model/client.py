"""The driver's side: :class:`RewardModelClient` renders each sample's judge request, has the workers score their
shares (``HybridWorker.score_with_reward_model`` through ``run_split``), and hands the results on: as batch fields
(the rollout log shows the judge's text next to the response) and in each reward input's ``reward_model`` entry
(what the reward function reads, :mod:`easyr1.reward_model.results`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from easyr1.data.prompt import IMAGE_MARKER
from easyr1.errors import ConfigError
from easyr1.protocol import Batch
from easyr1.reward_model.results import RESULT_KEY
from easyr1.reward_model.scorer import PARSED, REQUEST, SCORE, TEXT, _objects
from easyr1.reward_model.template import TEMPLATE_KEY, JudgeTemplate


RESULT_FIELDS = (SCORE, PARSED, TEXT)
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
    """The reward model of a run, seen from the driver."""

    def __init__(self, config: Any, workers: Any) -> None:
        self.settings = config.worker.reward_model
        self.workers = workers
        self.template = JudgeTemplate(self.settings.template) if self.settings.kind == "judge" else None

    def score(self, batch: Batch, inputs: Sequence[dict[str, Any]]) -> None:
        """Score ``batch`` on the workers; its result fields are set on ``batch`` and each input gets its result."""
        from easyr1.workers.hybrid_worker import HybridWorker

        sent = batch
        if self.template is not None:
            sent = batch.union(Batch())  # a shallow copy: the request field stays off the driver's batch
            sent[REQUEST] = _objects(render_requests(self.template, inputs, image_counts(batch)))
        results = self.workers.run_split(HybridWorker.score_with_reward_model, sent, pad=True)
        for key in RESULT_FIELDS:
            batch[key] = results[key]
        scores, parsed, texts = results[SCORE].tolist(), results[PARSED].tolist(), list(results[TEXT])
        for reward_input, score, ok, text in zip(inputs, scores, parsed, texts):
            reward_input[RESULT_KEY] = {"score": float(score), "text": text, "parsed": bool(ok)}

    @staticmethod
    def metrics(batch: Batch) -> dict[str, float]:
        """``reward_model/score_mean`` and ``reward_model/unparseable`` (how many judgements got the unparseable
        score) of a scored batch."""
        if SCORE not in batch:
            return {}
        return {
            f"{METRIC_PREFIX}/score_mean": batch[SCORE].float().mean().item(),
            f"{METRIC_PREFIX}/unparseable": float((~batch[PARSED]).sum().item()),
        }
