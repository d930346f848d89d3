"""The registry of shipped environments, and building the configured one (by name, or a class from a file).

``env.env_class='path/to/env.py:ClassName'`` loads a user's class the way reward files are loaded
(:mod:`easyr1.user_code`). The class may subclass :class:`Environment` or just provide its four methods
(``system_prompt``, ``reset``, ``step``, ``close``). Every problem (missing file, import error, no such class, not
an environment, ``env.env_kwargs`` the constructor refuses) is an :class:`~easyr1.errors.EnvError` naming the key and
what to do; :func:`check_environment` finds them all at start-up, before any model loads.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from easyr1.algorithms.registry import Registry
from easyr1.envs.base import Environment
from easyr1.errors import EnvError
from easyr1.user_code import import_user_file, names_defined_in


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", "env.name")
CLASS_KEY = "env.env_class"
KWARGS_KEY = "env.env_kwargs"
REQUIRED_METHODS = ("system_prompt", "reset", "step", "close")

# Classes already loaded, by (absolute path, class name, modification time): a file is imported once per process
# however many environments are built from it, and imported again if it changed.
_loaded: dict[tuple[str, str, int], type] = {}


def register_env(name: str):
    """Class decorator registering an :class:`Environment` subclass as ``env.name=name``."""
    return ENVIRONMENTS.register(name)


def _split_spec(env_class: str) -> tuple[str, str]:
    path, _, class_name = env_class.strip().rpartition(":")
    if not path.endswith(".py") or not class_name.isidentifier():
        raise EnvError(
            f"`{CLASS_KEY}` = {env_class!r} must name a class in a python file, as 'path/to/env.py:ClassName'"
        )
    return path, class_name


def _missing_methods(cls: type) -> list[str]:
    return [name for name in REQUIRED_METHODS if not callable(getattr(cls, name, None))]


def load_environment_class(env_class: str) -> type:
    """The class ``env_class`` ('path/to/env.py:ClassName') names, checked to be an environment."""
    path, class_name = _split_spec(env_class)
    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(resolved):
        raise EnvError(
            f"Environment file {path!r} (from `{CLASS_KEY}`) does not exist (looked for {resolved}). Give the path "
            "of a python file, relative to the working directory or absolute, as 'path/to/env.py:ClassName'."
        )
    key = (resolved, class_name, os.stat(resolved).st_mtime_ns)
    if key in _loaded:
        return _loaded[key]
    module = import_user_file(
        resolved, config_key=CLASS_KEY, what="environment file", module_prefix="easyr1_env", error=EnvError
    )
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        classes = names_defined_in(module, lambda value: isinstance(value, type))
        what = "is not a class" if cls is not None else "is not defined"
        raise EnvError(
            f"`{CLASS_KEY}`: {class_name!r} {what} in {path}. Classes defined there: {', '.join(classes) or 'none'}. "
            f"Name one after the colon: '{path}:<ClassName>'."
        )
    missing = [] if issubclass(cls, Environment) else _missing_methods(cls)
    if missing:
        raise EnvError(
            f"`{CLASS_KEY}`: {class_name} in {path} is not an environment: it lacks {', '.join(missing)}. Subclass "
            "easyr1.envs.Environment, or give the class system_prompt(), reset(seed), step(action_text) and close()."
        )
    _loaded[key] = cls
    return cls


def environment_class(name: str | None, env_class: str | None) -> type[Environment]:
    """The class ``env.name`` registers, or the one ``env.env_class`` ('path/to/env.py:ClassName') names."""
    if env_class is not None:
        return load_environment_class(env_class)
    return ENVIRONMENTS.get(name)


def _describe(name: str | None, env_class: str | None) -> str:
    return f"`{CLASS_KEY}` = {env_class!r}" if env_class is not None else f"`env.name` = {name!r}"


def check_kwargs(cls: type, env_kwargs: dict[str, Any], source: str) -> None:
    """EnvError naming the keys of ``env_kwargs`` that ``cls``'s constructor does not accept."""
    if not isinstance(env_kwargs, dict):
        raise EnvError(f"`{KWARGS_KEY}` must be a mapping of keyword arguments, got {env_kwargs!r}")
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a class whose signature cannot be read: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = sorted(set(env_kwargs) - set(accepted))
    if unknown:
        raise EnvError(
            f"`{KWARGS_KEY}` has {unknown}, which {source} does not accept; its keyword parameters are "
            f"{accepted or 'none'}. Remove them or fix their names."
        )


def build_environment(name: str | None, env_class: str | None, env_kwargs: dict[str, Any]) -> Environment:
    """A new environment instance of the configured class, built with ``env_kwargs``."""
    cls = environment_class(name, env_class)
    source = _describe(name, env_class)
    check_kwargs(cls, env_kwargs, source)
    try:
        return cls(**env_kwargs)
    except EnvError:
        raise
    except Exception as error:
        raise EnvError(
            f"Building the environment of {source} with `{KWARGS_KEY}` = {env_kwargs!r} failed with "
            f"{type(error).__name__}: {error}"
        ) from error


def check_environment(name: str | None, env_class: str | None, env_kwargs: dict[str, Any]) -> None:
    """Build one environment of the configured class and close it: every loading problem, before models load."""
    environment = build_environment(name, env_class, env_kwargs)
    try:
        environment.close()
    except Exception as error:
        raise EnvError(
            f"close() of the environment of {_describe(name, env_class)} failed with {type(error).__name__}: {error}"
        ) from error
