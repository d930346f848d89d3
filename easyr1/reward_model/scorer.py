"""The worker's side: :class:`RewardModelScorer` scores a share of the rollout batch with the classifier or the
judge (``HybridWorker.score_with_reward_model``) and returns the per-sample results as batch fields:

- ``reward_model_score`` (B,) float32: the score (a judgement the parser could not read: ``unparseable_score``);
- ``reward_model_parsed`` (B,) bool: whether the judgement was read (always true for a classifier);
- ``reward_model_text`` (B,) objects: the judge's raw text (None for a classifier).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from easyr1.config.reward_model import judge_engine
from easyr1.protocol import Batch
from easyr1.reward_model.classifier import classifier_scores, load_classifier
from easyr1.reward_model.judge import HFJudge, JudgeRequest, VLLMJudge
from easyr1.reward_model.parser import JudgementParser


SCORE, PARSED, TEXT = "reward_model_score", "reward_model_parsed", "reward_model_text"
# The driver's rendered judge request of each sample (a non-tensor field of the batch the workers get).
REQUEST = "reward_model_request"


class RewardModelScorer:
    """A worker's reward model: colocated with the policy, asleep between steps; on a worker of its own
    (``stays_awake``), on its device for the whole run."""

    def __init__(self, config: Any, dtype: torch.dtype, device: str, stays_awake: bool = False) -> None:
        self.settings = config.worker.reward_model
        self.device = device
        self.stays_awake = stays_awake
        self.classifier = None
        self.judge = None
        self.parser = None
        if self.settings.kind == "classifier":
            self.classifier = load_classifier(self.settings.model_path, dtype)
            self.classifier_on_device = False
        else:
            self.parser = JudgementParser(self.settings.parser, self.settings.parser_words)
            engine = HFJudge if judge_engine(config) == "hf" else VLLMJudge
            self.judge = engine(self.settings.model_path, self.settings, dtype, device)
        if stays_awake and self.classifier is not None:
            self.classifier.to(device)
        self.sleep()

    def score(self, batch: Batch) -> Batch:
        """This share's results (see the module docstring)."""
        if self.classifier is not None:
            return self._classify(batch)
        images = batch["multi_modal_data"] if "multi_modal_data" in batch else [None] * len(batch)
        requests = [
            JudgeRequest(str(text), list((images[row] or {}).get("images") or []))
            for row, text in enumerate(batch[REQUEST])
        ]
        texts = self.judge.judge(requests) if requests else []
        self.sleep()
        parsed = [self.parser.parse(text) for text in texts]
        scores = [self.settings.unparseable_score if value is None else value for value in parsed]
        return Batch(
            tensors={
                SCORE: torch.tensor(scores, dtype=torch.float32),
                PARSED: torch.tensor([value is not None for value in parsed], dtype=torch.bool),
            },
            non_tensors={TEXT: _objects(texts)},
        )

    def _classify(self, batch: Batch) -> Batch:
        self.classifier.to(self.device)
        micro = self.settings.micro_batch_size
        scores = [
            classifier_scores(self.classifier, part, self.device, self.settings.normalize)
            for part in batch.split(micro)
        ]
        self.sleep()
        return Batch(
            tensors={SCORE: torch.cat(scores), PARSED: torch.ones(len(batch), dtype=torch.bool)},
            non_tensors={TEXT: _objects([None] * len(batch))},
        )

    def sleep(self) -> None:
        """Free the device memory while the policy generates and trains (GPU); a worker of its own keeps it."""
        if self.stays_awake:
            return
        if self.classifier is not None and self.device != "cpu":
            self.classifier.to("cpu")
            torch.cuda.empty_cache()
        elif self.judge is not None:
            self.judge.sleep()

    def close(self) -> None:
        """Release the engine."""
        if self.judge is not None:
            self.judge.close()
        self.judge = self.classifier = None


def _objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (strings stay whole)."""
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array
