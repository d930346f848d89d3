"""The ``worker.reward`` section: the reward function that scores responses, with its checks.

Reward types are the ones :mod:`easyr1.workers.reward` defines (``REWARD_TYPES``), the only list of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from easyr1.config.fields import option
from easyr1.config.rules import AT_LEAST_ONE, one_of
from easyr1.workers.reward import REWARD_TYPES


@dataclass
class RewardConfig:
    """The reward function that scores responses."""

    reward_type: str | None = option(
        None, f"{' or '.join(REWARD_TYPES)} (null: the reward file's REWARD_TYPE, else batch)"
    )
    reward_function: str | None = option(
        None, "'path/to/file.py:function' (required; a path without ':function' means compute_score)"
    )
    reward_function_kwargs: dict[str, Any] = option({}, "extra keyword arguments passed to the reward function")
    skip_special_tokens: bool = option(True, "drop special tokens when decoding responses for scoring")
    num_cpus: int = option(1, "CPUs reserved for the reward computation")


# Value rules of single keys, relative to ``worker.reward``.
REWARD_RANGES = {"num_cpus": AT_LEAST_ONE}


def check_reward_function(reward: RewardConfig, problems: list[str]) -> None:
    """The reward function must be given, as a python file (and optionally a function name)."""
    function = reward.reward_function
    if function is None:
        problems.append("worker.reward.reward_function is not set; pass worker.reward.reward_function=FILE.py:FUNC")
    elif not re.search(r"\.py(:\w+)?$", function):
        problems.append(f"worker.reward.reward_function={function!r} must name a python file: 'path/to/file.py:func'")


def check_reward_names(reward: RewardConfig, problems: list[str]) -> None:
    """The reward type, when given, must be one the reward loader knows."""
    if reward.reward_type is not None:
        one_of(problems, "worker.reward.reward_type", reward.reward_type, REWARD_TYPES)
