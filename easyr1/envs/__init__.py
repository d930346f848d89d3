"""Environments for multi-turn agents: the interface (:mod:`easyr1.envs.base`), the registry of shipped ones, and
loading a user's class from a file (``env.env_class=path/to/env.py:ClassName``).

Adding an environment is one file: a subclass of :class:`Environment` decorated with ``@register_env("name")``,
imported below so that ``env.name=name`` finds it.
"""

from easyr1.envs.base import IMAGE_MARKER, Environment, Observation, StepResult
from easyr1.envs.registry import (
    ENVIRONMENTS,
    build_environment,
    check_environment,
    environment_class,
    register_env,
)


__all__ = [
    "ENVIRONMENTS",
    "IMAGE_MARKER",
    "Environment",
    "Observation",
    "StepResult",
    "build_environment",
    "check_environment",
    "environment_class",
    "register_env",
]
