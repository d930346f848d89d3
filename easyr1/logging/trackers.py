"""Trackers receive one flat ``{name: float}`` dict per step.

``console`` prints one short line per step; ``file`` appends one JSON object per step (with a ``step``
field) to ``<log_dir>/metrics.jsonl``, flushed after every write so a crash loses nothing logged.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from easyr1.errors import ConfigError


class Tracker(Protocol):
    """Where per-step metrics go."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` for training step ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


# Keys shown by the console tracker, in order, with the label it prints.
CONSOLE_KEYS = (
    ("reward/overall", "reward"),
    ("reward/accuracy", "acc"),
    ("response_length/mean", "len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("rollout/log_prob_gap", "lp_gap"),
    ("timing/step", "s/step"),
)


class ConsoleTracker:
    """One line per step with the key numbers; everything else stays in the file tracker."""

    def __init__(self, print_fn=print) -> None:
        self._print = print_fn

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print the step's headline metrics."""
        parts = [f"step {step}"]
        parts += [f"{label} {metrics[key]:.4g}" for key, label in CONSOLE_KEYS if key in metrics]
        self._print(" | ".join(parts), flush=True)

    def close(self) -> None:
        """Nothing to release."""


def _json_value(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the file stays valid JSON lines."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class FileTracker:
    """Append-only JSON lines, one object per step: ``{"step": N, "metric": value, ...}``.

    A new run never writes into an older run's file: an existing file is first renamed to
    ``metrics.<time>.jsonl`` (nothing is deleted). With ``resume=True`` the run appends to it instead.
    """

    def __init__(self, log_dir: str | os.PathLike, filename: str = "metrics.jsonl", resume: bool = False) -> None:
        self.path = Path(log_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and not resume:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.path.stat().st_mtime))
            kept = self.path.with_name(f"{self.path.stem}.{stamp}{self.path.suffix}")
            os.replace(self.path, kept)
            print(f"easyr1: an earlier run's metrics were moved to {kept}", flush=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one line and flush it to disk."""
        record = {"step": step, **{key: _json_value(value) for key, value in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def build_trackers(names: list[str], log_dir: str | os.PathLike) -> list[Tracker]:
    """Instantiate the trackers named in ``trainer.logger``."""
    trackers: list[Tracker] = []
    for name in names:
        if name == "console":
            trackers.append(ConsoleTracker())
        elif name == "file":
            trackers.append(FileTracker(log_dir))
        else:
            raise ConfigError(
                f"trainer.logger: '{name}' is not available in this version; use any of ['console', 'file']"
            )
    return trackers
