"""Checks of one dataset row's columns, and the error an unusable row raises.

Every problem with a row is a :class:`RowError`: a :class:`~easyr1.errors.DataError` whose message names the row
(``file line N`` / ``file row N``), says what is wrong and how to fix it, and whose short ``reason`` is what
``RLDataset`` counts when ``data.skip_bad_rows`` drops such rows.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from easyr1.errors import DataError


SKIP_HINT = "or set data.skip_bad_rows=true to drop bad rows"


class RowError(DataError):
    """One dataset row that cannot be used.

    ``where`` is the row's place (``file line N``), ``reason`` a short name of the kind of problem (the key of
    ``RLDataset.skipped``), and the message reads ``"<where>: <problem>; <fix>, or set data.skip_bad_rows=true
    ..."``. Called with the message alone (as torch's DataLoader does when it re-raises a worker's error), it
    keeps that message.
    """

    def __init__(self, where: str, reason: str = "bad row", problem: str = "", fix: str = "") -> None:
        self.where, self.reason, self.problem, self.fix = where, reason, problem, fix
        super().__init__(f"{where}: {problem}; {fix}, {SKIP_HINT}" if problem else where)

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        # pickled with its parts (not the message), so a copy from another process keeps its reason
        return type(self), (self.where, self.reason, self.problem, self.fix)


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about values of the wrong type."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_columns(data: Mapping[str, Any], where: str, keys: Mapping[str, str]) -> None:
    """Raise a ``missing column`` RowError when ``data`` lacks one of ``keys`` ({option name: column})."""
    for option, key in keys.items():
        if key not in data:
            raise RowError(
                where,
                "missing column",
                f"missing key {key!r} (data.{option}); the row has keys {sorted(data)}",
                f"add {key!r} to the row or point data.{option} at the right column",
            )


def check_prompt(data: Mapping[str, Any], key: str, where: str) -> str:
    """The row's prompt: a string with some non-space text in it."""
    prompt = data[key]
    if not isinstance(prompt, str):
        raise RowError(
            where,
            "prompt not a string",
            f"{key!r} must be a string, got {type(prompt).__name__} {_short(prompt)}",
            "give the row a text prompt",
        )
    if not prompt.strip():
        raise RowError(where, "empty prompt", f"{key!r} is empty", "give the row a prompt or remove it")
    return prompt


def check_answer(data: Mapping[str, Any], key: str, where: str) -> str:
    """The row's ground truth as a string: a string, or a number (booleans and NaN are refused)."""
    answer = data[key]
    if isinstance(answer, str):
        return answer
    # bool is a number to Python, but True as a ground truth is almost always a broken column
    is_number = isinstance(answer, numbers.Real) and not isinstance(answer, (bool, np.bool_))
    if is_number and not math.isnan(float(answer)):
        return str(answer)
    problem = "is NaN (a missing value)" if is_number else f"is {type(answer).__name__} {_short(answer)}"
    raise RowError(
        where,
        "answer not a string or number",
        f"{key!r} must be a string or a number, but {problem}",
        "give the row its ground-truth answer as text",
    )


# One image may be given as any of these; a list of them is several images.
_IMAGE_TYPES = (str, Path, bytes, bytearray, memoryview, Mapping, Image.Image)


def vision_values(data: Mapping[str, Any], key: str, kind: str, where: str) -> list[Any]:
    """The row's images (``kind="image"``) or videos (``kind="video"``) as a list; none when the key is absent.

    A single value stands for one image / video; a list (or an object array, as parquet gives) for several.
    Each item's own type is checked when it is read (see ``easyr1.data.vision``).
    """
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, np.ndarray) and value.dtype == object:
        return list(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    single = _IMAGE_TYPES if kind == "image" else (str, Path)
    if isinstance(value, single):
        return [value]
    allowed = "paths, bytes, {'bytes', 'path'} dicts or PIL images" if kind == "image" else "paths or frame lists"
    raise RowError(
        where,
        f"bad {kind} value",
        f"{key!r} must be a list of {allowed}, got {type(value).__name__} {_short(value)}",
        f"fix the {key!r} column",
    )
