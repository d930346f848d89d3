"""Declaring config fields and walking the tree of config dataclasses.

Every field of a config section is declared with :func:`option` (a default and a one-line help text), :func:`section`
(a nested section) or :func:`mirror` (a value copied from another key). An option may be declared
*compatibility-only*: EasyR1 has the key, a YAML written for EasyR1 sets it, and it has no meaning here; it is
accepted, and a user who sets it to anything but its default is told once at start-up
(:func:`compatibility_only_settings`). A test walks every field and fails for one that is neither read by the
code nor declared compatibility-only, so the list of keys without effect cannot drift.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Iterator
from dataclasses import field
from typing import Any


_HELP, _MIRROR, _ALIAS, _COMPAT = "help", "mirror", "alias_for", "compatibility_only"


def _field(default: Any, metadata: dict[str, Any]) -> Any:
    """A dataclass field with ``default`` (copied per instance when mutable) and ``metadata``."""
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return field(default=default, metadata=metadata)


def option(default: Any, doc: str, *, compatibility_only: bool = False, alias_for: str | None = None) -> Any:
    """A dataclass field with a default and a one-line help text.

    ``compatibility_only``: the key is accepted so that EasyR1 configs load, but has no effect here.
    ``alias_for``: the key is an older name of that key; loading translates its value there and clears it.
    """
    metadata: dict[str, Any] = {_HELP: doc, _COMPAT: compatibility_only}
    if alias_for is not None:
        metadata[_ALIAS] = alias_for
    return _field(default, metadata)


def section(cls: type, doc: str, *, compatibility_only: bool = False) -> Any:
    """A nested config section with a one-line help text; ``compatibility_only`` marks every key inside it."""
    return field(default_factory=cls, metadata={_HELP: doc, _COMPAT: compatibility_only})


def mirror(default: Any, source: str) -> Any:
    """A field copied from ``source`` when the config is built; setting it to another value is an error."""
    return _field(default, {_HELP: f"derived: copied from {source}; set that key instead", _MIRROR: source})


def help_text(item: dataclasses.Field) -> str:
    """The field's one-line help text."""
    return item.metadata.get(_HELP, "")


def mirror_source(item: dataclasses.Field) -> str | None:
    """The key a mirror field is copied from; None for any other field."""
    return item.metadata.get(_MIRROR)


def acts_through(item: dataclasses.Field) -> str | None:
    """The key whose value a mirror or an alias field becomes (it acts when that key does); None for others."""
    return item.metadata.get(_MIRROR) or item.metadata.get(_ALIAS)


def is_compatibility_only(item: dataclasses.Field) -> bool:
    """Whether the field (or the section it names) was declared compatibility-only."""
    return bool(item.metadata.get(_COMPAT, False))


def default_of(item: dataclasses.Field) -> Any:
    """The field's default value (a fresh one for mutable defaults)."""
    return item.default if item.default is not dataclasses.MISSING else item.default_factory()


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a config dataclass."""
    return typing.get_type_hints(cls)


def is_section(hint: Any) -> bool:
    """Whether a type hint names a nested config section."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def iter_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Yield ``(dotted key, field, type hint)`` for every field of the tree, sections before their contents."""
    for item in dataclasses.fields(cls):
        hint = hints(cls)[item.name]
        yield prefix + item.name, item, hint
        if is_section(hint):
            yield from iter_fields(hint, f"{prefix}{item.name}.")


def compatibility_only_keys(cls: type) -> dict[str, dataclasses.Field]:
    """Every value key of the tree under ``cls`` that is compatibility-only, itself or through its section."""
    marked: dict[str, dataclasses.Field] = {}
    sections: list[str] = []
    for key, item, hint in iter_fields(cls):
        inherited = any(key.startswith(f"{parent}.") for parent in sections)
        if is_section(hint):
            if inherited or is_compatibility_only(item):
                sections.append(key)
        elif inherited or is_compatibility_only(item):
            marked[key] = item
    return marked


def compatibility_only_settings(config: Any) -> list[str]:
    """``key=value`` for every compatibility-only key of ``config`` set to something other than its default."""
    return [
        f"{key}={get_key(config, key)}"
        for key, item in compatibility_only_keys(type(config)).items()
        if get_key(config, key) != default_of(item)
    ]


def get_key(obj: Any, dotted: str) -> Any:
    """The value at ``a.b.c`` in a tree of sections."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def set_key(obj: Any, dotted: str, value: Any) -> None:
    """Set the value at ``a.b.c`` in a tree of sections."""
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def type_name(hint: Any) -> str:
    """A type hint as users read it: ``int``, ``str | None``, ``list[str]``."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")
