"""Local paths in the config made absolute (Ray workers may run in another directory); hub ids left as they are."""

from __future__ import annotations

import os


_LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow", ".csv", ".py", ".jinja", ".yaml", ".yml", ".txt")


def looks_local(path: str) -> bool:
    """Whether a string names a local path rather than a hub id such as ``Qwen/Qwen2.5-VL-7B-Instruct``."""
    # Files of the CPU demo are created on first use, so existence alone cannot decide.
    return (
        path.startswith((".", "/", "~"))
        or path.lower().endswith(_LOCAL_SUFFIXES)
        or os.path.exists(os.path.expanduser(path))
    )


def absolute(path: str | None) -> str | None:
    """The absolute form of a local path (Ray workers may run in another directory)."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def resolve_path(path: str | None) -> str | None:
    """Make a local path absolute; leave hub ids and None unchanged."""
    if path is None or not looks_local(path):
        return path
    return absolute(path)


def resolve_dataset(spec: str) -> str:
    """Make the path part of ``path[@split]`` absolute when it is local."""
    base, at, split = spec.rpartition("@")
    if not at or "/" in split:  # no split suffix, or the '@' belongs to a directory name
        return resolve_path(spec)
    return f"{resolve_path(base)}@{split}" if looks_local(base) else spec


def resolve_function(spec: str | None) -> str | None:
    """Make the file part of ``file.py[:function]`` absolute."""
    if spec is None:
        return None
    base, colon, name = spec.rpartition(":")
    if colon and name.isidentifier():
        return f"{absolute(base)}:{name}"
    return absolute(spec)
