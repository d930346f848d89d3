"""Experiment trackers (console, JSONL file, ...) selected by ``trainer.logger``."""

from easyr1.logging.trackers import Tracker, build_trackers


__all__ = ["Tracker", "build_trackers"]
