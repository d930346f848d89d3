"""Reward of the CPU demo task "What colour is the shape?" (red, green, blue or yellow), in [0, 1].

* ``format`` = 1 if the response contains any colour word (case-insensitive, whole words only);
* ``accuracy`` = 1 if the *first* colour word in the response is the ground truth;
* ``overall = format_weight * format + (1 - format_weight) * accuracy`` (0.2 and 0.8 by default).

The format part gives a tiny random policy a gradient long before it is ever right. A policy that ignores the
image cannot beat ``0.2 + 0.8 * 0.25 = 0.4`` on a dataset with balanced colours, so a mean reward clearly above
0.4 shows that the model looks at the image.
"""

import re
from typing import Any


REWARD_NAME = "shape_color"
REWARD_TYPE = "batch"

COLOURS = ("red", "green", "blue", "yellow")
_COLOUR_WORD = re.compile(r"\b(" + "|".join(COLOURS) + r")\b", re.IGNORECASE)


def first_colour(response: str) -> str | None:
    """The first colour word in the response, lower-cased, or None."""
    match = _COLOUR_WORD.search(response)
    return match.group(1).lower() if match else None


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.2) -> list[dict[str, float]]:
    """Score a batch: one ``{"overall", "format", "accuracy"}`` dict per input."""
    scores = []
    for reward_input in reward_inputs:
        truth = str(reward_input["ground_truth"]).strip().lower()
        if truth not in COLOURS:
            raise ValueError(f"ground truth {reward_input['ground_truth']!r} is not one of the colours {COLOURS}")
        colour = first_colour(reward_input["response"])
        format_score = 0.0 if colour is None else 1.0
        accuracy_score = 1.0 if colour == truth else 0.0
        scores.append(
            {
                "overall": format_weight * format_score + (1 - format_weight) * accuracy_score,
                "format": format_score,
                "accuracy": accuracy_score,
            }
        )
    return scores
