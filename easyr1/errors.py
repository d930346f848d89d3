"""User-facing errors: raised for bad configs, data or reward files, printed without a traceback by the CLI."""


class UserError(ValueError):
    """A problem the user can fix (config, data, reward file); the message says what and how."""


class ConfigError(UserError):
    """An invalid configuration key, type or combination of values."""


class DataError(UserError):
    """A dataset file or row that cannot be used."""


class RewardError(UserError):
    """A reward function that cannot be loaded or that misbehaves."""


class EnvError(UserError):
    """An environment that cannot be loaded or that misbehaves (the message names the episode's seed and turn)."""
