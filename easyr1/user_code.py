"""Importing a python file the user names in the config (a reward function, an environment class), and calling
user code in a thread with a time limit (environment steps).

Each file is imported under a private module name derived from its path, so two files called ``math.py`` in
different directories do not replace each other (or the stdlib ``math``), and its directory is appended to
``sys.path`` so it can import helper modules that sit next to it. A failure becomes the caller's
:class:`~easyr1.errors.UserError` subclass, naming the config key that points at the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from easyr1.errors import UserError


def module_name_for(path: str, prefix: str) -> str:
    """A module name unique to ``path``: ``prefix``, the file's stem and a short hash of the full path."""
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    return f"{prefix}_{stem}_{digest}"


def import_user_file(
    path: str,
    *,
    config_key: str,
    what: str,
    module_prefix: str,
    error: type[UserError],
) -> ModuleType:
    """Import the python file at ``path`` (absolute) as a fresh module and return it.

    ``what`` names the file in messages ("reward file"), ``config_key`` the key that points at it; a file that is
    not python code or that raises while importing becomes ``error`` (the original exception as its cause).
    """
    module_name = module_name_for(path, module_prefix)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise error(f"`{config_key}`: cannot import {path!r} as python code; point it at a .py file")
    module = importlib.util.module_from_spec(module_spec)
    # Appended, not prepended: a file named like the stdlib (math.py) must not shadow it for the rest of the process.
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.append(directory)
    sys.modules[module_name] = module  # registered before exec: dataclasses and pickling look it up
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise error(f"Importing the {what} {path} (`{config_key}`) failed with {type(exc).__name__}: {exc}") from exc
    return module


def names_defined_in(module: ModuleType, keep: Callable[[Any], bool]) -> list[str]:
    """The public names ``module`` itself defines (not imports) whose value passes ``keep``, sorted."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__ and keep(value)
    )


class CallTimedOut(Exception):
    """A call of user code that has not returned within its time limit (not a TimeoutError it raised itself)."""


def call_with_time_limit(method: Any, args: tuple[Any, ...], seconds: float) -> Any:
    """``method(*args)`` in a daemon thread: its result or its exception; CallTimedOut when it has not returned
    within ``seconds``. The thread is left behind then, and, being a daemon, it never keeps the process from
    exiting once the run has stopped (a thread pool's worker would be joined at exit, forever if it spins)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = method(*args)
        except BaseException as error:  # handed to the caller's thread as it is
            outcome["error"] = error

    thread = threading.Thread(target=run, name="env-step", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallTimedOut(f"{getattr(method, '__name__', method)} did not return within {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
