"""Wall-time measurement of the blocks of a step, for the ``timing/`` metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the block to ``timings[name]``."""
    start = time.perf_counter()
    yield
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
