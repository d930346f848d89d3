"""DAPO's math reward: +1 / -1 for a right / wrong boxed answer, plus the soft overlong punishment.

The overlong punishment (DAPO, arXiv:2503.14476, section 3.4) leaves responses shorter than
``max_response_length - overlong_buffer_length`` alone and subtracts a penalty that grows linearly from 0 to
``overlong_penalty_factor`` over the last ``overlong_buffer_length`` tokens, so the policy learns to stop before it
is truncated instead of being punished abruptly. Pass the three numbers through
``worker.reward.reward_function_kwargs``; ``max_response_length`` should equal ``data.max_response_length``.
"""

from typing import Any

from mathruler.grader import extract_boxed_content, grade_answer


REWARD_NAME = "dapo"
REWARD_TYPE = "batch"


def overlong_penalty(response_length: int, max_response_length: int, buffer_length: int, factor: float) -> float:
    """0 before the buffer starts, then ``-factor * (tokens into the buffer) / buffer_length``, capped at -factor."""
    if buffer_length <= 0:
        return 0.0
    expected = max_response_length - buffer_length
    exceed = response_length - expected
    return -min(max(exceed, 0) / buffer_length, 1.0) * factor


def compute_score(
    reward_inputs: list[dict[str, Any]],
    max_response_length: int = 20480,
    overlong_buffer_length: int = 4096,
    overlong_penalty_factor: float = 1.0,
) -> list[dict[str, float]]:
    """One ``{"overall", "accuracy", "overlong"}`` dict per input; ``overall = (+1 | -1) + overlong``."""
    if not isinstance(reward_inputs, list):
        raise TypeError("dapo.compute_score takes the list of inputs: use REWARD_TYPE 'batch' for this file")
    scores = []
    for reward_input in reward_inputs:
        correct = grade_answer(extract_boxed_content(reward_input["response"]), str(reward_input["ground_truth"]))
        penalty = overlong_penalty(
            int(reward_input["response_length"]), max_response_length, overlong_buffer_length, overlong_penalty_factor
        )
        scores.append(
            {"overall": (1.0 if correct else -1.0) + penalty, "accuracy": float(correct), "overlong": penalty}
        )
    return scores
