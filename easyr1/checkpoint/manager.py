"""The checkpoint directory of a run: atomic commits, which step to resume from, and which steps to keep.

Layout of ``trainer.save_checkpoint_path``::

    checkpoint_tracker.json      last and best step (EasyR1's file name and keys), replaced atomically
    global_step_N/               one complete checkpoint: actor/ [critic/] trainer_state.pt config.yaml
    global_step_N.partial/       a step being written; never loaded, removed when the next run starts

A step is written under ``.partial``, every file fsynced, and then renamed to ``global_step_N``: a directory
with the final name is complete by construction, whatever moment the process was killed at. A write that fills the
disk is a :class:`~easyr1.errors.CheckpointError` (the partial step removed, the previous one untouched). Files can
still be damaged after their commit (a disk error, a copy cut short), so the resume choice checks a step's files
before choosing it (:func:`step_damage`) and falls back to the newest intact step, saying so on the console.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from easyr1.checkpoint.dcp_metadata import check_dcp_metadata
from easyr1.errors import CheckpointError, UserError


TRACKER_NAME = "checkpoint_tracker.json"
TRAINER_STATE_NAME = "trainer_state.pt"
STEP_PATTERN = re.compile(r"^global_step_(\d+)$")
PARTIAL_SUFFIX = ".partial"
DELETING_SUFFIX = ".deleting"
# the DCP directories of a component (checkpoint/sharded.py: MODEL_DIR, OPTIMIZER_DIR); not imported from there,
# which would load torch.distributed into every process that only lists checkpoints
DCP_DIRS = ("model", "optimizer")
COMPONENTS = ("actor", "critic")
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


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

        An explicit ``load_checkpoint_path`` wins (a damaged one is an error that names the file and the newest
        intact step beside it); otherwise, with ``find_last_checkpoint``, the newest committed step whose files are
        intact: a damaged newer step is named on the console, never skipped silently. A tracker that names a step
        whose directory is gone is an error, never a silent fresh start.
        """
        if load_checkpoint_path:
            chosen = check_step_dir(Path(load_checkpoint_path), "trainer.load_checkpoint_path")
            problem = step_damage(chosen)
            if problem is not None:
                others = CheckpointDirectory(chosen.parent)
                intact = [step for step in others.complete_steps() if others.step_dir(step) != chosen]
                fallback = next((s for s in reversed(intact) if step_damage(others.step_dir(s)) is None), None)
                offer = (
                    f"the newest intact checkpoint beside it is step {fallback}: set "
                    f"trainer.load_checkpoint_path={others.step_dir(fallback)} to resume from it"
                    if fallback is not None
                    else "no other intact checkpoint is beside it"
                )
                raise CheckpointError(f"trainer.load_checkpoint_path={chosen} is damaged: {problem}; {offer}")
            return chosen
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
        # The newest committed step, even if the tracker was not yet updated when the run was killed; a damaged one
        # is passed over for the step before it, on the console.
        damaged: list[str] = []
        for step in reversed(steps):
            path = self.step_dir(step)
            problem = step_damage(path)
            if problem is None:
                if damaged:
                    print(
                        f"easyr1: resuming from {path} (step {step}), the newest intact checkpoint, instead of "
                        f"{'; '.join(damaged)}. The damaged directory is left as it is (a new save of its step moves "
                        "it aside); delete it once inspected",
                        flush=True,
                    )
                return check_step_dir(path, f"the newest checkpoint in {self.root}")
            damaged.append(f"step {step}, which is damaged: {problem}")
        raise CheckpointError(
            f"every checkpoint in {self.root} is damaged: {'; '.join(damaged)}. Restore one, set "
            "trainer.load_checkpoint_path to an intact global_step_N directory elsewhere, or set "
            "trainer.find_last_checkpoint=false (or a new trainer.save_checkpoint_path) to start a new run"
        )

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

    def save(self, step: int, write: Callable[[Path], None], val_score: float | None = None) -> Path:
        """Write step ``step`` with ``write(staging_directory)`` and :meth:`commit` it; returns its directory.

        A full disk (or an exhausted quota) anywhere in the write, in this process or in a worker's, is a
        :class:`CheckpointError` that says where, how much space the step needs and what to do; the partial step is
        removed and the previous step stays the newest one.
        """
        staging = self.staging_dir(step)
        try:
            write(staging)
            return self.commit(step, staging, val_score)
        except BaseException as error:  # DCP's CheckpointException is a BaseException
            # torch's zip writer reports a full disk as "unexpected pos" with no errno, so the disk is asked too
            if not (is_disk_full(error) or disk_nearly_full(self.root)):
                raise
            raise self._out_of_space(step, staging) from error

    def _out_of_space(self, step: int, staging: Path) -> CheckpointError:
        """The error of a write of step ``step`` that filled the disk, once its partial files are removed."""
        written = tree_bytes(staging)
        shutil.rmtree(staging, ignore_errors=True)
        (self.root / (TRACKER_NAME + ".tmp")).unlink(missing_ok=True)
        free = shutil.disk_usage(self.root).free
        earlier = [s for s in self.complete_steps() if s != step]
        if self.step_dir(step).is_dir() and not staging.exists():  # committed: the tracker's update failed
            state, resume = f"step {step} was committed but the tracker could not be updated", f"step {step}"
        elif earlier:
            state = f"the newest checkpoint is still step {earlier[-1]} ({self.step_dir(earlier[-1])})"
            resume = f"step {earlier[-1]}"
        else:
            state, resume = "no checkpoint of this run is on disk yet", "the start"
        needed = (
            f"a checkpoint of this run takes {format_bytes(tree_bytes(self.step_dir(earlier[-1])))}"
            if earlier
            else f"{format_bytes(written)} were written before the disk filled, and a checkpoint needs more"
        )
        fewer = "" if self.save_limit == 1 else f", keep fewer checkpoints (trainer.save_limit, now {self.save_limit})"
        return CheckpointError(
            f"out of disk space writing the checkpoint of step {step} under {self.root}: {needed}, and "
            f"{format_bytes(free)} are free there with the partial write removed; {state}. Free space on that "
            f"disk{fewer} or set trainer.save_checkpoint_path to a larger disk, then run the same command again: "
            f"it resumes from {resume}"
        )

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


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or anything it wraps, is a full disk or an exhausted quota.

    Looks through causes, DCP's per-rank failures (``CheckpointException.failures``) and Ray's task errors
    (``cause``); an error that crossed a process boundary only as text is recognised by the system's message.
    """
    pending: list[Any] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if isinstance(current, tuple):  # DCP: (exception, traceback)
            pending.extend(current)
            continue
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return True
        pending += [current.__cause__, current.__context__, getattr(current, "cause", None)]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            pending += list(failures.values())
    return any(os.strerror(code) in str(error) for code in DISK_FULL_ERRNOS)


def disk_nearly_full(path: Path) -> bool:
    """Whether the filesystem of ``path`` has (almost) no space left for this user: under a tenth of its size and
    under 64 MiB, which a write that stopped at a full disk leaves (a file's last block, a tensor that did not fit
    is not counted as written)."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return False
    return usage.free < min(64 * 2**20, usage.total // 10)


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 when it does not exist)."""
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file()) if root.is_dir() else 0


def format_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def step_damage(path: Path) -> str | None:
    """The first damaged or missing file of the committed step ``path`` and what is wrong with it; ``None`` when its
    files are intact as far as can be told without loading them.

    Checked: the files a resume reads exist; every ``.pt`` file (torch's zip format) passes its CRC check; every DCP
    directory's ``.metadata`` reads and every shard file it names holds the byte range it names (a truncated shard).
    A model-only step (no ``optimizer/`` at all) is not damage: :func:`check_step_dir` says it cannot be resumed.
    """
    for required in (TRAINER_STATE_NAME, "actor/model/.metadata"):
        if not (path / required).is_file():
            return f"{path / required} is missing"
    for pickled in sorted(path.rglob("*.pt")):
        problem = zip_damage(pickled)
        if problem is not None:
            return f"{pickled} {problem}"
    for component in COMPONENTS:
        for name in DCP_DIRS:
            directory = path / component / name
            if directory.is_dir():
                problem = dcp_damage(directory)
                if problem is not None:
                    return problem
    return None


def zip_damage(path: Path) -> str | None:
    """What is wrong with a ``torch.save`` file (a zip archive with a CRC per record), ``None`` when intact."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        return f"is not a readable torch file ({type(error).__name__}: {error}; truncated?)"
    return None if bad is None else f"is corrupted (its record {bad} fails its CRC check)"


def dcp_damage(directory: Path) -> str | None:
    """What is wrong with a DCP checkpoint directory: an unreadable ``.metadata``, or a shard file that is missing
    or shorter than the byte ranges the metadata gives it; ``None`` when none is."""
    from torch.distributed.checkpoint import FileSystemReader  # only when a checkpoint is resumed

    metadata_path = directory / ".metadata"
    if not metadata_path.is_file():
        return f"{metadata_path} is missing"
    check_dcp_metadata(directory)  # a crafted file is refused (an error), before torch's plain pickle.load of it
    try:
        metadata = FileSystemReader(str(directory)).read_metadata()
    except Exception as error:  # a truncated pickle raises any of several types
        return f"{metadata_path} is unreadable ({type(error).__name__}: {error})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative_path, end in sorted(needed.items()):
        shard = directory / relative_path
        if not shard.is_file():
            return f"{shard} is missing"
        size = shard.stat().st_size
        if size < end:
            return f"{shard} is truncated ({size} bytes; its checkpoint's metadata needs {end})"
    return None
