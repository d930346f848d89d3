"""The checkpoint directory of a run: atomic commits, which step to resume from, and which steps to keep.

Layout of ``trainer.save_checkpoint_path``::

    checkpoint_tracker.json      last and best step (EasyR1's file name and keys), replaced atomically
    global_step_N/               one complete checkpoint: actor/ [critic/] trainer_state.pt config.yaml
    global_step_N.partial/       a step being written; never loaded, removed when the next run starts

A step is written under ``.partial``, every file fsynced, and then renamed to ``global_step_N``: a directory
with the final name is complete by construction, whatever moment the process was killed at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from easyr1.errors import UserError


TRACKER_NAME = "checkpoint_tracker.json"
TRAINER_STATE_NAME = "trainer_state.pt"
STEP_PATTERN = re.compile(r"^global_step_(\d+)$")
PARTIAL_SUFFIX = ".partial"
DELETING_SUFFIX = ".deleting"


def step_dir_name(step: int) -> str:
    """``global_step_<step>``."""
    return f"global_step_{step}"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (cheap for files already synced by their writers)."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            with open(Path(directory) / name, "rb") as file:
                os.fsync(file.fileno())
        fsync_dir(Path(directory))


def write_json_atomically(path: Path, content: dict[str, Any]) -> None:
    """Replace ``path`` with ``content`` so that readers see either the old or the new file, never a mix."""
    staging = path.with_name(path.name + ".tmp")
    with open(staging, "w", encoding="utf-8") as file:
        json.dump(content, file, indent=2)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staging, path)
    fsync_dir(path.parent)


class CheckpointDirectory:
    """All checkpoints of one run under ``root``; keeps the newest ``save_limit`` steps (-1: all) plus the best."""

    def __init__(self, root: str | os.PathLike, save_limit: int = -1) -> None:
        self.root = Path(root)
        self.save_limit = save_limit

    # ------------------------------------------------------------------------------------------------ reading
    def complete_steps(self) -> list[int]:
        """Committed steps, oldest first."""
        if not self.root.is_dir():
            return []
        steps = [STEP_PATTERN.match(path.name) for path in self.root.iterdir() if path.is_dir()]
        return sorted(int(match.group(1)) for match in steps if match)

    def step_dir(self, step: int) -> Path:
        """Where step ``step`` is (or would be) committed."""
        return self.root / step_dir_name(step)

    def leftovers(self) -> list[Path]:
        """Directories of interrupted writes or deletions."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.name.endswith((PARTIAL_SUFFIX, DELETING_SUFFIX)))

    def read_tracker(self) -> dict[str, Any] | None:
        """The tracker's content, ``None`` when there is none; a damaged tracker is a clear error."""
        path = self.root / TRACKER_NAME
        if not path.exists():
            return None
        try:
            tracker = json.loads(path.read_text(encoding="utf-8"))
            int(tracker["last_global_step"])
        except (ValueError, KeyError, TypeError) as error:
            raise UserError(
                f"{path} is damaged ({type(error).__name__}: {error}); the run's checkpoints are "
                f"{self.complete_steps() or 'none'}. Delete or fix the tracker to resume from the newest complete "
                "step, set trainer.load_checkpoint_path to a global_step_N directory, or use a new "
                "trainer.save_checkpoint_path"
            ) from None
        return tracker

    def resume_path(self, load_checkpoint_path: str | None, find_last_checkpoint: bool) -> Path | None:
        """The step directory this run continues from, or ``None`` for a fresh start.

        An explicit ``load_checkpoint_path`` wins; otherwise, with ``find_last_checkpoint``, the newest committed
        step. A tracker that names a step whose directory is gone is an error, never a silent fresh start.
        """
        if load_checkpoint_path:
            return check_step_dir(Path(load_checkpoint_path), "trainer.load_checkpoint_path")
        if not find_last_checkpoint:
            return None
        tracker = self.read_tracker()
        steps = self.complete_steps()
        if tracker is not None:
            last = int(tracker["last_global_step"])
            if not self.step_dir(last).is_dir() and not any(step > last for step in steps):
                raise UserError(
                    f"{self.root / TRACKER_NAME} says the last checkpoint is step {last}, but "
                    f"{self.step_dir(last)} is missing (complete steps on disk: {steps or 'none'}). Restore it, set "
                    "trainer.load_checkpoint_path to one of the steps on disk, or set trainer.find_last_checkpoint="
                    "false to start a new run"
                )
        if not steps:
            return None
        # The newest committed step, even if the tracker was not yet updated when the run was killed.
        return check_step_dir(self.step_dir(steps[-1]), f"the newest checkpoint in {self.root}")

    # ------------------------------------------------------------------------------------------------ writing
    def remove_leftovers(self) -> list[Path]:
        """Delete partial writes of an interrupted run; returns what was removed."""
        removed = self.leftovers()
        for path in removed:
            shutil.rmtree(path)
        return removed

    def staging_dir(self, step: int) -> Path:
        """An empty directory to write step ``step`` into before :meth:`commit`."""
        staging = self.root / (step_dir_name(step) + PARTIAL_SUFFIX)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        return staging

    def commit(self, step: int, staging: Path, val_score: float | None = None) -> Path:
        """Make the written step visible (atomic rename), update the tracker, and drop steps beyond the limit."""
        fsync_tree(staging)
        final = self.step_dir(step)
        if final.exists():  # a restarted run re-saving a step: keep the older copy under another name
            os.rename(final, final.with_name(f"{final.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))
        os.rename(staging, final)
        fsync_dir(self.root)
        tracker = self.read_tracker() or {}
        best_step, best_score = tracker.get("best_global_step"), tracker.get("best_val_reward_score")
        if val_score is not None and (best_score is None or val_score > best_score):
            best_step, best_score = step, val_score
        write_json_atomically(
            self.root / TRACKER_NAME,
            {
                "last_global_step": step,
                "last_actor_path": str(final / "actor"),
                "best_global_step": best_step,
                "best_val_reward_score": best_score,
            },
        )
        self.prune(best_step)
        return final

    def prune(self, best_step: int | None) -> list[int]:
        """Delete the oldest steps beyond ``save_limit``, never the best; returns the deleted steps."""
        if self.save_limit <= 0:
            return []
        steps = self.complete_steps()
        keep = set(steps[-self.save_limit :]) | ({best_step} if best_step is not None else set())
        deleted = [step for step in steps if step not in keep]
        for step in deleted:
            # Renamed first, so an interrupted deletion never leaves a half-deleted "complete" step behind.
            doomed = self.step_dir(step).with_name(step_dir_name(step) + DELETING_SUFFIX)
            os.rename(self.step_dir(step), doomed)
            shutil.rmtree(doomed)
        return deleted


def check_step_dir(path: Path, what: str) -> Path:
    """``path`` if it is a committed step directory a run can resume from; else a clear error."""
    if path.name.endswith(PARTIAL_SUFFIX):
        raise UserError(f"{what}={path} is a partial checkpoint (its write was interrupted); use a global_step_N one")
    if not path.is_dir():
        raise UserError(f"{what}={path} does not exist; point it at a global_step_N directory of a previous run")
    required = (TRAINER_STATE_NAME, "actor/model/.metadata", "actor/optimizer/.metadata")
    missing = [name for name in required if not (path / name).exists()]
    if missing == ["actor/optimizer/.metadata"]:
        raise UserError(
            f"{what}={path} holds model weights only (saved with trainer.save_model_only=true), so training cannot "
            "resume from it; export it with scripts/model_merger.py and start a new run from the exported model"
        )
    if missing:
        raise UserError(
            f"{what}={path} is not a complete easyr1 checkpoint (missing {', '.join(missing)}); point it at a "
            "global_step_N directory written by easyr1"
        )
    return path
