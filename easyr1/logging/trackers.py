"""Trackers receive one flat ``{name: float}`` dict per step.

``console`` prints one short line per step; ``file`` appends one JSON object per step (with a ``step``
field) to ``<log_dir>/metrics.jsonl``, flushed after every write so a crash loses nothing logged;
``tensorboard``, ``mlflow``, ``wandb`` and ``swanlab`` hand the same dicts to those libraries, each imported
only when selected.
"""

from __future__ import annotations

import json
import math
import os
import shutil
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
    ("env/success_rate", "success"),
    ("env/turns", "turns"),
    ("response_length/mean", "len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("rollout/log_prob_gap", "lp_gap"),
    ("timing/step", "s/step"),
    ("val/reward_score", "val_reward"),
    ("val/success_rate", "val_success"),
)


# Steps whose wall time the console's time-left estimate averages (recent ones: later steps can be longer).
RECENT_STEPS = 10


def duration_text(seconds: float) -> str:
    """``3h05m``, ``12m30s`` or ``45s``: a duration at the precision a person reads it."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ConsoleTracker:
    """One line per step with the key numbers, ``step N/total`` and the time left; everything else stays in the file
    tracker.

    The time left is the mean wall time of the last :data:`RECENT_STEPS` steps (between consecutive lines: generation,
    update, validation and checkpoints included) times the steps still to go; the first step of a process counts its
    ``timing/step``.
    """

    def __init__(self, print_fn=print, total_steps: int | None = None, clock=time.monotonic) -> None:
        self._print = print_fn
        self.total_steps = total_steps
        self._clock = clock
        self._last: float | None = None
        self._recent: list[float] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print the step's headline metrics."""
        now = self._clock()
        if step > 0 and self._last is not None:
            self._recent = [*self._recent, now - self._last][-RECENT_STEPS:]
        elif step > 0 and "timing/step" in metrics:
            self._recent = [float(metrics["timing/step"])]
        self._last = now
        parts = [f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"]
        parts += [f"{label} {metrics[key]:.4g}" for key, label in CONSOLE_KEYS if key in metrics]
        if self.total_steps and self._recent and step > 0:
            left = (self.total_steps - step) * sum(self._recent) / len(self._recent)
            parts.append(f"{duration_text(left)} left")
        self._print(" | ".join(parts), flush=True)

    def log_generations(self, samples: list[Mapping[str, Any]], step: int) -> None:
        """Print a few validation samples: answer, score and the response."""
        for sample in samples:
            response = str(sample["response"]).replace("\n", " ")[:200]
            self._print(f"  val sample | answer {sample['ground_truth']!r} | score {sample['score']:.3g} | {response}",
                        flush=True)  # fmt: skip

    def close(self) -> None:
        """Nothing to release."""


def _step_of(line: str) -> int | None:
    """The ``step`` of one metrics line; ``None`` for a line cut short by a crash."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


def _json_value(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the file stays valid JSON lines."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class FileTracker:
    """Append-only JSON lines, one object per step: ``{"step": N, "metric": value, ...}``.

    A run never writes into an older run's file: an existing file is first renamed to
    ``metrics.<time>.jsonl`` (nothing is deleted). A run resumed from step ``resume_step`` starts its file with
    the older file's records up to that step, so the file reads as one uninterrupted run.
    """

    def __init__(
        self, log_dir: str | os.PathLike, filename: str = "metrics.jsonl", resume_step: int | None = None
    ) -> None:
        self.path = Path(log_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            earlier = self._aside_name()
            if resume_step is None:
                os.replace(self.path, earlier)
            else:
                # Copy aside, then atomically replace the file by its records up to the resume step: whenever this
                # is interrupted, metrics.jsonl still holds every record a later resume needs.
                shutil.copyfile(self.path, earlier)
                steps = [(_step_of(line), line) for line in self.path.read_text(encoding="utf-8").splitlines()]
                kept = [line for step, line in steps if step is not None and step <= resume_step]
                staging = self.path.with_name(self.path.name + ".tmp")
                with staging.open("w", encoding="utf-8") as file:
                    file.write("".join(line + "\n" for line in kept))
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(staging, self.path)
            kept = "moved" if resume_step is None else "copied"
            print(f"easyr1: an earlier run's metrics were {kept} to {earlier}", flush=True)
        self._file = self.path.open("a", encoding="utf-8")

    def _aside_name(self) -> Path:
        """``metrics.<time of the old file>[-k].jsonl``, never an existing name."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.path.stat().st_mtime))
        aside, copy = self.path.with_name(f"{self.path.stem}.{stamp}{self.path.suffix}"), 1
        while aside.exists():  # two runs within one second must not overwrite each other's file
            aside, copy = self.path.with_name(f"{self.path.stem}.{stamp}-{copy}{self.path.suffix}"), copy + 1
        return aside

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one line and flush it to disk."""
        record = {"step": step, **{key: _json_value(value) for key, value in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def log_generations(self, samples: list[Mapping[str, Any]], step: int) -> None:
        """Append the samples to ``generations.jsonl`` beside the metrics, one object per sample with its step."""
        with (self.path.parent / "generations.jsonl").open("a", encoding="utf-8") as file:
            for sample in samples:
                file.write(json.dumps({"step": step, **{k: _json_value(v) for k, v in sample.items()}}) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class TensorBoardTracker:
    """Scalars in TensorBoard event files under ``<log_dir>/tensorboard``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``."""
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class MLflowTracker:
    """An MLflow run: experiment ``project_name``, run ``experiment_name``. Without ``MLFLOW_TRACKING_URI`` the
    runs go to a local file store, ``<log_dir>/mlruns``."""

    def __init__(self, log_dir: Path, project: str, experiment: str, config: Mapping[str, Any]) -> None:
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{log_dir / 'mlruns'}"
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store opt-in
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(project)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=experiment)
        mlflow.log_params({key: str(value)[:500] for key, value in _flatten(config).items()})

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the step's metrics."""
        self.mlflow.log_metrics({key: float(value) for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        """End the run."""
        self.mlflow.end_run()


class WandbTracker:
    """A Weights & Biases run under ``<log_dir>/wandb`` (``WANDB_MODE=offline`` keeps it on disk)."""

    def __init__(self, log_dir: Path, project: str, experiment: str, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=project, name=experiment, dir=str(log_dir), config=dict(config))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the step's metrics."""
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        """Finish the run and stop wandb's service, so that the run's files are complete when this returns.

        ``finish`` alone can return before the service has written the last records of an offline run (seen under
        load: a run file without its history); the atexit hook that would stop the service runs only at exit.
        """
        import wandb

        self.run.finish()
        wandb.teardown()


class SwanLabTracker:
    """A SwanLab run under ``<log_dir>/swanlab`` (``SWANLAB_MODE=offline`` or ``local`` keeps it on disk)."""

    def __init__(self, log_dir: Path, project: str, experiment: str, config: Mapping[str, Any]) -> None:
        import swanlab

        self.swanlab = swanlab
        swanlab.init(
            project=project,
            experiment_name=experiment,
            logdir=str(log_dir / "swanlab"),
            config=dict(config),
            mode=os.environ.get("SWANLAB_MODE") or None,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the step's metrics."""
        self.swanlab.log(dict(metrics), step=step)

    def close(self) -> None:
        """Finish the run."""
        self.swanlab.finish()


# The package each optional tracker needs, for the install hint.
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny", "wandb": "wandb", "swanlab": "swanlab"}
TRACKERS = ("console", "file", *_PACKAGES)


def build_trackers(
    names: list[str],
    log_dir: str | os.PathLike,
    resume_step: int | None = None,
    project: str = "easyr1",
    experiment: str = "run",
    config: Mapping[str, Any] | None = None,
    total_steps: int | None = None,
) -> list[Tracker]:
    """Instantiate the trackers named in ``trainer.logger`` (``resume_step``: the run continues from that step;
    ``total_steps``: the run's length, which the console shows with each step and its time left).

    Optional libraries are imported only when selected; a missing one is a clear error with the install command.
    """
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ConfigError(f"trainer.logger: {unknown} unknown; choose from {list(TRACKERS)}")
    log_dir, config = Path(log_dir), dict(config or {})
    trackers: list[Tracker] = []
    for name in names:
        if name == "console":
            trackers.append(ConsoleTracker(total_steps=total_steps))
        elif name == "file":
            trackers.append(FileTracker(log_dir, resume_step=resume_step))
        else:
            try:
                if name == "tensorboard":
                    trackers.append(TensorBoardTracker(log_dir))
                elif name == "mlflow":
                    trackers.append(MLflowTracker(log_dir, project, experiment, config))
                elif name == "wandb":
                    trackers.append(WandbTracker(log_dir, project, experiment, config))
                else:
                    trackers.append(SwanLabTracker(log_dir, project, experiment, config))
            except ImportError as error:
                raise ConfigError(
                    f"trainer.logger: '{name}' needs the {_PACKAGES[name]} package ({error}); "
                    f"install it with `pip install {_PACKAGES[name]}` or remove '{name}' from trainer.logger"
                ) from None
    return trackers
