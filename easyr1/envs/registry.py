"""The registry of shipped environments, and building the configured one (by name, or a class from a file)."""

from __future__ import annotations

from typing import Any

from easyr1.algorithms.registry import Registry
from easyr1.envs.base import Environment


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", "env.name")


def register_env(name: str):
    """Class decorator registering an :class:`Environment` subclass as ``env.name=name``."""
    return ENVIRONMENTS.register(name)


def environment_class(name: str | None, env_class: str | None) -> type[Environment]:
    """The class ``env.name`` registers, or the one ``env.env_class`` ('path/to/env.py:ClassName') names."""
    if env_class is not None:
        raise NotImplementedError("loading an environment class from a file")
    return ENVIRONMENTS.get(name)


def build_environment(name: str | None, env_class: str | None, env_kwargs: dict[str, Any]) -> Environment:
    """A new environment instance of the configured class, built with ``env_kwargs``."""
    return environment_class(name, env_class)(**env_kwargs)


def check_environment(name: str | None, env_class: str | None, env_kwargs: dict[str, Any]) -> None:
    """Build one environment and close it: a bad class or keyword argument fails before any model loads."""
    build_environment(name, env_class, env_kwargs).close()
