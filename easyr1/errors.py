"""User-facing errors: raised for bad configs, data or reward files, printed without a traceback by the CLI."""


class UserError(ValueError):
    """A problem the user can fix (config, data, reward file); the message says what and how."""


class ConfigError(UserError):
    """An invalid configuration key, type or combination of values."""


class DataError(UserError):
    """A dataset file or row that cannot be used."""


class RewardError(UserError):
    """A reward function that cannot be loaded or that misbehaves."""


class CheckpointError(UserError):
    """A checkpoint that cannot be written (a full disk) or read back (a damaged file); the message names the file."""


class EnvError(UserError):
    """An environment that cannot be loaded or that misbehaves (the message names the episode's seed and turn)."""


class WorkerLost(RuntimeError):
    """A worker process died (killed, out of memory, a crash in native code): the run cannot go on.

    Not a :class:`UserError` (nothing in the config caused it), but printed as one easyr1 message, with the last
    intact checkpoint and the command that resumes from it (``easyr1.main``), never as a Ray traceback.
    """

    def __init__(self, rank: int, node: str, phase: str, cause: str) -> None:
        self.rank, self.node, self.phase, self.cause = rank, node, phase, cause
        self.step: int | None = None  # the training step it happened in, when the trainer knows it
        self.checkpoints: str | None = None  # the run's checkpoint directory, when the caller knows it
        super().__init__(rank, node, phase, cause)

    def __str__(self) -> str:
        """Which rank died, on which node, in which call (and step)."""
        during = f"{self.phase}" + (f" of step {self.step}" if self.step is not None else "")
        return f"worker rank {self.rank} on node {self.node} died during {during} ({self.cause})"
