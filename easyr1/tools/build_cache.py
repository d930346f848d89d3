"""Directories built once and published whole: the demo assets under ``.cache/demo`` (``demo_assets.py``,
``demo_judge.py``) and the benches' models share :func:`build_once`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


# Where the demos keep what they build (relative to the working directory, like the demo configs' paths).
DEMO_ROOT = Path(".cache/demo")
_MARKER = ".complete"


def build_once(target: Path, build: Callable[[Path], Any]) -> Path:
    """Run ``build(tmp_dir)`` unless ``target`` is complete; publish the result with a rename.

    The marker file is written last and the directory appears under its final name only when complete, so an
    interrupted build is never mistaken for a finished one.
    """
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    (tmp / _MARKER).write_text("complete\n", encoding="utf-8")
    if target.exists():  # a half-built leftover from an older, interrupted run
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        # Another process published the same assets first; theirs are equivalent (same seed), keep them.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / _MARKER).exists():
            raise
    return target
