"""The ``trainer`` section: length of the run, workers, logging, validation and checkpoints, with its checks.

Logger names are the trackers :mod:`easyr1.logging.trackers` can build (``TRACKERS``), the only list of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.config.fields import option
from easyr1.config.rules import (
    AT_LEAST_ONE,
    AT_LEAST_ONE_OR_NULL,
    MINUS_ONE_OR_AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE_OR_NULL,
    one_of,
)
from easyr1.logging.trackers import TRACKERS


DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainerConfig:
    """The training loop: length, workers, logging, validation and checkpoints."""

    total_epochs: int = option(15, "passes over the training data")
    max_steps: int | None = option(None, "stop after this many steps (null: total_epochs decides)")
    project_name: str = option("easy_r1", "project name for loggers and the checkpoint path")
    experiment_name: str = option("demo", "experiment name for loggers and the checkpoint path")
    logger: list[str] = option(["console", "file"], f"loggers: any of {', '.join(TRACKERS)}")
    nnodes: int = option(1, "number of machines")
    n_gpus_per_node: int = option(8, "workers per machine: one per GPU, or CPU worker processes on a CPU machine")
    max_try_make_batch: int = option(20, "online filtering: most generation rounds per step (-1: no limit)")
    critic_warmup: int = option(0, "steps that train only the critic")
    balance_batch: bool = option(True, "reorder each step's samples so every worker gets a similar token count")
    cache_sample_tensors: bool = option(
        True,
        "send each sample's vision and token tensors to a worker once per step (not to vLLM, which reads the images) "
        "and reuse them there; false: every call sends its own copy",
    )
    val_freq: int = option(-1, "validate every this many steps (-1: never)")
    val_before_train: bool = option(True, "validate before the first step")
    val_only: bool = option(False, "validate and stop without training")
    val_generations_to_log: int = option(0, "validation samples shown in the logs")
    rollouts_to_log: int = option(2, "prompts (with all their responses and images) kept for the report's viewer")
    rollout_log_freq: int = option(10, "keep rollouts every this many steps (and at the first step)")
    save_freq: int = option(-1, "save a checkpoint every this many steps (-1: only after the last step)")
    save_limit: int = option(-1, "newest checkpoints kept on disk, plus the best by validation reward (-1: all)")
    save_model_only: bool = option(False, "save the model weights only (smaller, but training cannot resume from it)")
    save_checkpoint_path: str | None = option(None, "checkpoint directory (null: checkpoints/<project>/<experiment>)")
    load_checkpoint_path: str | None = option(None, "a global_step_N directory to resume from")
    ray_timeline: str | None = option(
        None, "file the driver writes Ray's task timeline to at the end of the run (chrome://tracing JSON; null: none)"
    )
    find_last_checkpoint: bool = option(True, "resume from the latest checkpoint in save_checkpoint_path if any")
    device: str = option("auto", f"device: {', '.join(DEVICES)} (auto: cuda when available)")
    single_process: bool = option(
        False,
        "run the whole loop in this one Python process, without Ray (one worker: n_gpus_per_node=1, nnodes=1): "
        "for stepping through train_step in a debugger",
    )
    peak_flops_per_device: float | None = option(
        None,
        "peak FLOP/s of one worker's device for perf/mfu (null: the GPU's data-sheet bf16 figure, or on CPU a "
        "matmul timing at the actor's compute dtype taken once per worker)",
    )
    skip_plan_check: bool = option(
        False,
        "start even when the memory plan (python -m easyr1.tools.plan) says the run does not fit; the plan's line is "
        "still printed",
    )
    seed: int = option(
        1,
        "seed of python's, numpy's and torch's generators on the driver and every worker (sampling uses "
        "worker.rollout.seed)",
    )
    log_dir: str | None = option(None, "directory of the file logger (null: save_checkpoint_path)")

    @property
    def world_size(self) -> int:
        """The number of workers: ``nnodes * n_gpus_per_node``."""
        return self.nnodes * self.n_gpus_per_node


# Value rules of single keys, relative to ``trainer``.
TRAINER_RANGES = {
    "peak_flops_per_device": POSITIVE_OR_NULL,
    "total_epochs": AT_LEAST_ONE,
    "max_steps": AT_LEAST_ONE_OR_NULL,
    "nnodes": AT_LEAST_ONE,
    "n_gpus_per_node": AT_LEAST_ONE,
    "max_try_make_batch": MINUS_ONE_OR_AT_LEAST_ONE,
    "critic_warmup": NON_NEGATIVE,
    "val_generations_to_log": NON_NEGATIVE,
    "rollouts_to_log": NON_NEGATIVE,
    "rollout_log_freq": AT_LEAST_ONE,
    "save_limit": MINUS_ONE_OR_AT_LEAST_ONE,
}


def check_trainer_names(trainer: TrainerConfig, problems: list[str]) -> None:
    """The device and every logger name."""
    one_of(problems, "trainer.device", trainer.device, DEVICES)
    for name in trainer.logger:
        one_of(problems, "trainer.logger entry", name, TRACKERS)
