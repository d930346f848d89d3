"""Reading an action word out of the model's text for one turn.

The shipped environments accept one word out of a small set (``up``, ``down``, ...). The model may answer with the
bare word, with a sentence around it, or inside ``<answer>...</answer>`` after some reasoning; the action is the
first allowed word inside the first answer block that holds one, else the first allowed word of the whole text.
Words match whole and case-insensitively ("Up." and "UP" read as ``up``; "upward" does not). Text without an
allowed word gives ``None``: the environment counts an invalid action and leaves its state unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def _first_in(text: str, pattern: re.Pattern[str]) -> str | None:
    match = pattern.search(text)
    return match.group(1).lower() if match else None


def first_word(text: str, words: Sequence[str]) -> str | None:
    """The first of ``words`` (lower case) that ``text`` holds as a whole word, preferring answer blocks; or None."""
    if not isinstance(text, str) or not words:
        return None
    alternatives = "|".join(re.escape(word) for word in sorted(words, key=len, reverse=True))
    pattern = re.compile(rf"(?<!\w)({alternatives})(?!\w)", re.IGNORECASE)
    for block in _ANSWER_BLOCK.findall(text):
        found = _first_in(block, pattern)
        if found is not None:
            return found
    return _first_in(text, pattern)
