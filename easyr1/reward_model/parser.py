"""Turning a judgement's text into a score: a regex with one group (a number, or a word looked up in a table), or a
user function ``path/to/file.py:function`` (text -> float, or None when it cannot read it).

A judgement the parser cannot read is not an error: it gets ``worker.reward_model.unparseable_score`` and is counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from easyr1.errors import ConfigError
from easyr1.user_code import import_user_file


PARSER_KEY = "worker.reward_model.parser"


class JudgementParser:
    """``parse(text) -> float | None``: the score a judgement gives, or None when it gives none."""

    def __init__(self, spec: str, words: Mapping[str, float] | None = None) -> None:
        self.spec = spec
        self.words = {str(word).lower(): float(score) for word, score in (words or {}).items()}
        self.function: Callable[[str], float | None] | None = None
        self.pattern: re.Pattern[str] | None = None
        path, colon, name = spec.rpartition(":")
        if colon and path.endswith(".py") and name.isidentifier():
            module = import_user_file(
                path, config_key=PARSER_KEY, what="judgement parser", module_prefix="easyr1_parser", error=ConfigError
            )
            function = getattr(module, name, None)
            if not callable(function):
                raise ConfigError(f"{PARSER_KEY}={spec!r}: {path} defines no function {name!r}")
            self.function = function
        else:
            try:
                self.pattern = re.compile(spec)
            except re.error as error:
                raise ConfigError(f"{PARSER_KEY}={spec!r} is not a valid regex ({error})") from None
            if self.pattern.groups != 1:
                raise ConfigError(f"{PARSER_KEY}={spec!r} has {self.pattern.groups} groups; it needs exactly one")

    def __reduce__(self):
        return (JudgementParser, (self.spec, self.words))

    def parse(self, text: str) -> float | None:
        """The score of ``text``, or None. A parser function that raises or returns something other than a finite
        number reads as None (its judgement is unparseable), never as a crash of the run."""
        if self.function is not None:
            try:
                value = self.function(text)
                return None if value is None else _finite(float(value))
            except Exception:  # user code on model output: any failure is an unreadable judgement
                return None
        match = self.pattern.search(text)
        if match is None or match.group(1) is None:
            return None
        captured = match.group(1).strip()
        if captured.lower() in self.words:
            return self.words[captured.lower()]
        try:
            return _finite(float(captured))
        except ValueError:
            return None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
