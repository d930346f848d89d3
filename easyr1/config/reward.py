"""The ``worker.reward`` section: the reward function that scores responses, with its checks.

Reward types are the ones :mod:`easyr1.reward.function` defines (``REWARD_TYPES``), the only list of them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from easyr1.config.fields import option
from easyr1.config.rules import AT_LEAST_ONE, POSITIVE_OR_NULL, one_of
from easyr1.errors import ConfigError
from easyr1.reward.function import REWARD_TYPES


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
    num_cpus: int = option(
        1,
        "CPUs reserved for the reward actor, which scores when worker.reward.timeout is null (with a timeout the "
        "function runs in a child process of the driver)",
    )
    timeout: float | None = option(
        300.0,
        "seconds one call of the reward function may take (a batch for REWARD_TYPE batch, one sample for "
        "sequential); the function runs in a child process that is killed past it (its start, importing the file, "
        "gets at least 60 s) (null: no limit, called in the reward actor's process)",
    )
    timeout_score: float | None = option(
        None,
        "what a call past worker.reward.timeout does: null stops the run naming the file and the sample; a number "
        "is the score (every sub-score) of the samples of that call, counted in reward/timeouts",
    )
    reward_function_name: str | None = option(
        None,
        "the function in reward_function's file, EasyR1's split form (its dumps): joined into 'file.py:name'",
        alias_for="worker.reward.reward_function",
    )


# Value rules of single keys, relative to ``worker.reward``.
REWARD_RANGES = {
    "num_cpus": AT_LEAST_ONE,
    "timeout": POSITIVE_OR_NULL,
    "timeout_score": (lambda v: v is None or math.isfinite(v), "a finite number or null"),
}


def join_reward_function_name(reward: RewardConfig) -> None:
    """Join EasyR1's split form (``reward_function`` the file, ``reward_function_name`` the function) into
    ``file.py:function``, and clear the name so that only the joined key is shown and dumped.

    A name without a file is left for :func:`check_reward_function` to report; a name that contradicts the one
    after ``:`` in ``reward_function`` is an error.
    """
    name, function = reward.reward_function_name, reward.reward_function
    if name is None or function is None:
        return
    if not name.isidentifier():
        raise ConfigError(f"worker.reward.reward_function_name={name!r} must be a python function name")
    path, colon, given = function.rpartition(":")
    if colon and given.isidentifier() and given != name:
        raise ConfigError(
            f"worker.reward.reward_function={function!r} names the function {given!r} but "
            f"worker.reward.reward_function_name={name!r}; set one of them (e.g. reward_function={path}:{name})"
        )
    if not (colon and given.isidentifier()):
        reward.reward_function = f"{function}:{name}"
    reward.reward_function_name = None


def check_reward_function(reward: RewardConfig, problems: list[str]) -> None:
    """The reward function must be given, as a python file (and optionally a function name)."""
    function = reward.reward_function
    if function is None and reward.reward_function_name is not None:
        problems.append(
            f"worker.reward.reward_function_name={reward.reward_function_name!r} names a function but "
            "worker.reward.reward_function (its file) is not set; pass worker.reward.reward_function=FILE.py"
        )
    elif function is None:
        problems.append("worker.reward.reward_function is not set; pass worker.reward.reward_function=FILE.py:FUNC")
    elif not re.search(r"\.py(:\w+)?$", function):
        problems.append(f"worker.reward.reward_function={function!r} must name a python file: 'path/to/file.py:func'")


def check_reward_names(reward: RewardConfig, problems: list[str]) -> None:
    """The reward type, when given, must be one the reward loader knows."""
    if reward.reward_type is not None:
        one_of(problems, "worker.reward.reward_type", reward.reward_type, REWARD_TYPES)
