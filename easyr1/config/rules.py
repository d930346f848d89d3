"""Value rules shared by the config sections: ranges, names from a list, dtype names.

Each section module declares a table ``{relative key: rule}`` beside its fields; :func:`check_ranges` applies one.
A rule is ``(test, requirement)``: the test takes the value, the requirement says in words what it must be.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from easyr1.config.fields import get_key


Rule = tuple[Callable[[Any], bool], str]

AT_LEAST_ONE: Rule = (lambda v: v >= 1, "at least 1")
AT_LEAST_ONE_OR_NULL: Rule = (lambda v: v is None or v >= 1, "at least 1 or null")
MINUS_ONE_OR_AT_LEAST_ONE: Rule = (lambda v: v == -1 or v >= 1, "-1 or at least 1")
NON_NEGATIVE: Rule = (lambda v: v >= 0, "non-negative")
NON_NEGATIVE_OR_NULL: Rule = (lambda v: v is None or v >= 0, "non-negative or null")
POSITIVE: Rule = (lambda v: v > 0, "positive")
POSITIVE_OR_NULL: Rule = (lambda v: v is None or v > 0, "positive or null")
UNIT: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")
UNIT_OR_NULL: Rule = (lambda v: v is None or 0 <= v <= 1, "in [0, 1] or null")
OPEN_UNIT: Rule = (lambda v: 0 < v <= 1, "in (0, 1]")

# Precision names accepted wherever a dtype is configured (the names easyr1.models.loading understands).
DTYPE_NAMES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")


def check_ranges(config: Any, rules: Mapping[str, Rule], problems: list[str]) -> None:
    """Record a problem for every dotted key of ``rules`` whose value in ``config`` breaks its rule."""
    for key, (test, requirement) in rules.items():
        value = get_key(config, key)
        if not test(value):
            shown = list(value) if isinstance(value, tuple) else value
            problems.append(f"{key}={shown!r} must be {requirement}")


def one_of(problems: list[str], key: str, value: Any, choices: Sequence[str]) -> None:
    """Record a problem when ``value`` is not among ``choices`` (a registry's names), naming the closest one."""
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    problems.append(f"{key}={value!r} is not supported{hint}; valid values: {', '.join(choices)}")


def prefixed(prefix: str, rules: Mapping[str, Rule]) -> dict[str, Rule]:
    """A section's rules keyed by their full dotted keys (``prefix`` + relative key)."""
    return {f"{prefix}.{key}": rule for key, rule in rules.items()}
