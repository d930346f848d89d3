"""Where a run's start-up goes: the seconds from the interpreter's start to the end of the first training step, by
phase.

``easyr1.main`` calls :func:`begin`, then it and ``build.build_trainer`` call :func:`mark` as each phase ends (the
config read and checked, the plan and the data, Ray, the worker processes, the models and engines); the trainer marks
the end of the first step this run takes and adds :func:`startup_metrics` to that step's metrics:
``timing/startup/<phase>`` seconds each, and ``timing/startup/total`` from the interpreter's start (imports
included) to the end of that step, and prints them on one line.
"""

from __future__ import annotations

import os
import time


PREFIX = "timing/startup/"  # a measurement like the step's timings: left out wherever runs are compared
_marks: list[tuple[str, float]] = []
_reported = False
_origin: float | None = None  # where the first phase starts: the process's start, or a later run's (begin)


def process_start_time() -> float:
    """When this process started (wall clock, seconds since the epoch): from ``/proc`` on Linux, else when this module
    was imported."""
    try:
        with open("/proc/self/stat") as stat:
            ticks_after_boot = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as machine:
            boot = next(int(line.split()[1]) for line in machine if line.startswith("btime"))
        return boot + ticks_after_boot / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()


def begin() -> None:
    """Start timing a run: from the process's start for its first run, from now for a later run in the same process
    (a test calling the CLI's ``run`` again)."""
    global _origin, _reported
    _origin = process_start_time() if _origin is None else time.time()
    _marks.clear()
    _reported = False


def mark(phase: str) -> None:
    """Record that start-up phase ``phase`` ends now."""
    _marks.append((phase, time.time()))


def startup_metrics() -> dict[str, float]:
    """``timing/startup/<phase>`` seconds per marked phase and ``timing/startup/total``, once per run (empty
    afterwards, or when nothing was marked: a trainer built by a test rather than the CLI)."""
    global _reported
    if _reported or not _marks or _origin is None:
        return {}
    _reported = True
    metrics, previous = {}, _origin
    for phase, when in _marks:
        metrics[f"{PREFIX}{phase}"] = max(when - previous, 0.0)
        previous = when
    metrics[f"{PREFIX}total"] = max(_marks[-1][1] - _origin, 0.0)
    return metrics


def summary(metrics: dict[str, float]) -> str:
    """One line of :func:`startup_metrics`' result: the total, then each phase."""
    parts = ", ".join(
        f"{key[len(PREFIX) :].replace('_', ' ')} {value:.1f}"
        for key, value in metrics.items()
        if key != f"{PREFIX}total"
    )
    return f"start-up {metrics[f'{PREFIX}total']:.1f} s to the end of the first step: {parts}"
