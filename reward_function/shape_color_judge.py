"""Reward of the reward-model demo (``python -m easyr1.tools.demo --judge``): the judge's score is the reward.

* ``overall`` = ``judge`` = the reward model's score (the demo's classifier: its probability, through a sigmoid, that
  the response names the colour of the shape it sees);
* ``accuracy`` and ``format`` = the rule of ``shape_color.py`` against the dataset's answer, computed and logged as
  ``reward/accuracy`` and ``reward/format`` but never trained on: they show whether the judge taught the task.
"""

import importlib.util
from pathlib import Path
from typing import Any


REWARD_TYPE = "batch"


def _rule() -> Any:
    """``shape_color.py`` beside this file, loaded by path (whatever the reward process's import path holds)."""
    spec = importlib.util.spec_from_file_location("shape_color_rule", Path(__file__).with_name("shape_color.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SHAPE_COLOR = _rule()


def compute_score(reward_inputs: list[dict[str, Any]], reward_model: Any) -> list[dict[str, float]]:
    """One ``{"overall", "judge", "accuracy", "format"}`` dict per input; only ``overall`` (the judge) trains."""
    judged = reward_model(reward_inputs)
    rule = _SHAPE_COLOR.compute_score(reward_inputs)
    return [
        {
            "overall": result["score"],
            "judge": result["score"],
            "accuracy": check["accuracy"],
            "format": check["format"],
        }
        for result, check in zip(judged, rule)
    ]
