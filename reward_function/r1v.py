"""R1-V reward: a format bonus for ``<think>...</think><answer>...</answer>`` plus accuracy of the answer content.

The answer is graded by ``mathruler`` (exact or symbolic match); without an ``<answer>`` tag the whole response
is graded. ``overall = (1 - format_weight) * accuracy + format_weight * format``. Use with
``format_prompt/r1v.jinja``. Scores one sample at a time (``REWARD_TYPE = "sequential"``).
"""

import re
from typing import Any

from mathruler.grader import grade_answer


REWARD_NAME = "r1v"
REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def format_reward(response: str) -> float:
    """1.0 if the whole response is <think>...</think> then <answer>...</answer>."""
    return 1.0 if _FORMAT.fullmatch(response.strip()) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    """1.0 if the <answer> content (or the whole response) matches the ground truth."""
    match = _ANSWER.search(response)
    answer = match.group(1).strip() if match else response.strip()
    return 1.0 if grade_answer(answer, str(ground_truth).strip()) else 0.0


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    """Score one sample: ``{"overall", "format", "accuracy"}``."""
    if not isinstance(reward_input, dict):
        raise TypeError("r1v.compute_score takes one input dict: use REWARD_TYPE 'sequential' for this file")
    format_score = format_reward(reward_input["response"])
    accuracy_score = accuracy_reward(reward_input["response"], reward_input["ground_truth"])
    return {
        "overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
        "format": format_score,
        "accuracy": accuracy_score,
    }
