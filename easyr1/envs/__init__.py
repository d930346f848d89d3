"""Environments for multi-turn agents: the interface (:mod:`easyr1.envs.base`), the registry of shipped ones, and
loading a user's class from a file (``env.env_class=path/to/env.py:ClassName``).

Adding an environment is one file in this package: a subclass of :class:`Environment` decorated with
``@register_env("name")``. Every module of the package is imported below, so ``env.name=name`` finds it.
"""

import importlib
import pkgutil

from easyr1.envs.base import IMAGE_MARKER, Environment, Observation, StepResult
from easyr1.envs.registry import (
    ENVIRONMENTS,
    build_environment,
    check_environment,
    environment_class,
    register_env,
)


# The shipped environments register themselves when imported: import them all, so that the registry is the one
# list of them and a new environment needs no line here.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


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
