"""Math reward: a format bonus for ``<think>...</think>`` reasoning followed by a ``\\boxed{}`` answer, plus
accuracy of the boxed answer, graded by ``mathruler`` (symbolic equivalence, so ``0.5`` matches ``\\frac{1}{2}``).

``overall = (1 - format_weight) * accuracy + format_weight * format``; set ``format_weight`` through
``worker.reward.reward_function_kwargs``. Use with ``format_prompt/math.jinja``.
"""

import re
from typing import Any

from mathruler.grader import extract_boxed_content, grade_answer


REWARD_NAME = "math"
REWARD_TYPE = "batch"

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
# Some models write "< think >" or "</ answer>"; drop the spaces around tag punctuation before matching.
_TAG_SPACES = re.compile(r"\s*([<>/])\s*")


def format_reward(response: str) -> float:
    """1.0 if the response is reasoning in <think></think> followed by an answer containing \\boxed{...}."""
    return 1.0 if _FORMAT.fullmatch(response) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    """1.0 if the last \\boxed{...} content is mathematically equal to the ground truth."""
    return 1.0 if grade_answer(extract_boxed_content(response), str(ground_truth)) else 0.0


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    """Score a batch: one ``{"overall", "format", "accuracy"}`` dict per input."""
    if not isinstance(reward_inputs, list):
        raise TypeError("math.compute_score takes the list of inputs: use REWARD_TYPE 'batch' for this file")
    scores = []
    for reward_input in reward_inputs:
        response = _TAG_SPACES.sub(r"\1", reward_input["response"])
        format_score = format_reward(response)
        accuracy_score = accuracy_reward(response, reward_input["ground_truth"])
        scores.append(
            {
                "overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
                "format": format_score,
                "accuracy": accuracy_score,
            }
        )
    return scores
