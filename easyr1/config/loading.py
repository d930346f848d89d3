"""Loading a :class:`PPOConfig` from YAML files and ``key=value`` overrides, and writing it back out.

:func:`load_config` merges, in this order, the dataclass defaults, any ``config=FILE.yaml`` files and dot-list
overrides such as ``worker.actor.optim.lr=1e-6`` or ``trainer.logger=[console,file]``. It rejects unknown keys
(naming the closest valid one, or the new name of a key EasyR1 renamed) and values of the wrong type, fills the
derived fields and runs the checks of :meth:`PPOConfig.validate` -- all before any model is loaded.
:func:`describe` lists every key; :func:`to_yaml` writes a config that :func:`load_config` reads back.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from easyr1.config.actor import LOSS_AVG_MODE_ALIASES
from easyr1.config.fields import (
    compatibility_only_keys,
    default_of,
    help_text,
    hints,
    is_section,
    iter_fields,
    type_name,
)
from easyr1.config.ppo import MIRRORS, PPOConfig
from easyr1.config.redaction import (
    interpolated_secrets,
    interpolated_secrets_of,
    redact,
    remember_interpolated_secrets,
)
from easyr1.errors import ConfigError


# Keys that EasyR1 renamed at some point: an old YAML gets pointed at the new name.
_RENAMED_KEYS = {
    "trainer.total_episodes": "trainer.total_epochs",
    "worker.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "worker.reward.score_function": "worker.reward.reward_function",
    "worker.reward.score_function_kwargs": "worker.reward.reward_function_kwargs",
}


# EasyR1's console logger prints the config with yaml.dump, which tags its tuples (trainer.logger, optim.betas) as
# python objects; a safe YAML loader refuses the tag, and the list under it is all that is needed.
_PYTHON_TUPLE_TAG = re.compile(r"!!python/tuple\b")


@functools.cache
def _all_keys() -> tuple[str, ...]:
    return tuple(key for key, _, _ in iter_fields(PPOConfig))


def describe() -> str:
    """Every config key with its type, default and help text, one per line (sections as headers)."""
    compatibility_only = compatibility_only_keys(PPOConfig)
    lines = []
    for key, item, hint in iter_fields(PPOConfig):
        doc = help_text(item)
        if is_section(hint):
            lines.append(f"{key}:  # {doc}")
            continue
        if key in compatibility_only:
            doc += " (compatibility-only: accepted for EasyR1 configs, no effect here)"
        lines.append(f"{key}: {type_name(hint)} = {default_of(item)!r}  # {doc}")
    return "\n".join(lines)


def _suggestion(dotted: str, section: type, prefix: str) -> str:
    """The tail of an unknown-key message: the closest valid key, or the valid keys of the section."""
    if dotted in _RENAMED_KEYS:
        return f"; it is now called '{_RENAMED_KEYS[dotted]}'"
    name = dotted.rpartition(".")[2]
    siblings = [item.name for item in dataclasses.fields(section)]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    # A key put in the wrong section, e.g. worker.actor.n for worker.rollout.n.
    elsewhere = [key for key in _all_keys() if key.rpartition(".")[2] == name]
    if elsewhere:
        return f"; did you mean '{elsewhere[0]}'?"
    close = difflib.get_close_matches(dotted, _all_keys(), n=1, cutoff=0.8)
    if close:
        return f"; did you mean '{close[0]}'?"
    where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
    return f"; valid keys {where}: {', '.join(siblings)}"


def _leaves(data: Mapping, section: type, prefix: str, source: str) -> Iterator[tuple[str, Any, Any]]:
    """Yield ``(dotted key, value, type hint)`` for every value given in ``data``, checking that each key exists."""
    section_hints = hints(section)
    for name, value in data.items():
        dotted = f"{prefix}{name}"
        if name not in section_hints:
            raise ConfigError(f"unknown config key '{dotted}' ({source}){_suggestion(dotted, section, prefix)}")
        hint = section_hints[name]
        if not is_section(hint):
            yield dotted, value, hint
        elif isinstance(value, Mapping):
            yield from _leaves(value, hint, f"{dotted}.", source)
        elif value is not None:  # an empty section in YAML reads as null
            raise ConfigError(
                f"config key '{dotted}' ({source}) is a section, not a value; set the keys inside it, "
                f"e.g. {dotted}.{dataclasses.fields(hint)[0].name}=..."
            )


def _apply(merged: DictConfig, data: Mapping, source: str, explicit: dict[str, str]) -> None:
    """Merge one source (a YAML file or one override) into ``merged``, one key at a time for precise errors."""
    for dotted, value, hint in _leaves(data, PPOConfig, "", source):
        try:
            OmegaConf.update(merged, dotted, value, merge=True)
        except OmegaConfBaseException:
            given = "null" if value is None else f"{value!r} ({type(value).__name__})"
            advice = ""
            if value is None:
                advice = " (this key cannot be null)"
            elif typing.get_origin(hint) in (list, tuple):
                advice = " (write a list, e.g. [a, b])"
            raise ConfigError(
                f"config key '{dotted}' ({source}) got {given}; expected {type_name(hint)}{advice}"
            ) from None
        explicit[dotted] = source


def _read_yaml(path: str) -> Mapping:
    """The mapping in a YAML config file."""
    if not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f" (looked for {os.path.abspath(path)})"
        raise ConfigError(f"config file '{path}' not found{where}; check config=PATH")
    try:
        with open(path, encoding="utf-8") as file:
            loaded = OmegaConf.create(_PYTHON_TUPLE_TAG.sub("", file.read()))
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections (data, algorithm, worker, trainer)")
    return OmegaConf.to_container(loaded, resolve=False)


def _parse_override(item: str) -> Mapping:
    """The nested mapping of one ``a.b.c=value`` override."""
    key, equals, _ = item.partition("=")
    if item.startswith("-"):
        raise ConfigError(f"command-line argument '{item}': write overrides as key=value without leading dashes")
    if not equals or not key.strip():
        raise ConfigError(f"command-line argument '{item}' is not key=value (e.g. trainer.nnodes=2 or config=x.yaml)")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"cannot parse command-line override '{item}': {exc}") from None


def _check_explicit_derived(merged: DictConfig, explicit: dict[str, str]) -> None:
    """Reject derived keys set to values that disagree with the keys they are copied from."""
    for derived, source_key in MIRRORS.items():
        if derived in explicit:
            given, wanted = OmegaConf.select(merged, derived), OmegaConf.select(merged, source_key)
            if given != wanted:
                raise ConfigError(
                    f"config key '{derived}' ({explicit[derived]}) is copied from '{source_key}' and cannot be set "
                    f"on its own: got {given!r} but {source_key}={wanted!r}; set '{source_key}' instead"
                )
    avg_key, agg_key = "worker.actor.loss_avg_mode", "worker.actor.loss_agg_mode"
    if avg_key in explicit and agg_key in explicit:
        avg, agg = OmegaConf.select(merged, avg_key), OmegaConf.select(merged, agg_key)
        if avg is not None and LOSS_AVG_MODE_ALIASES.get(avg) != agg:
            raise ConfigError(
                f"{avg_key}={avg!r} ({explicit[avg_key]}) contradicts {agg_key}={agg!r} ({explicit[agg_key]}); "
                f"loss_avg_mode is EasyR1's older name for loss_agg_mode: set only {agg_key}"
            )


@functools.cache
def _defaults() -> DictConfig:
    """The typed OmegaConf tree of the defaults, built once: building it costs ~0.1 s, copying it ~0.02 s."""
    return OmegaConf.structured(PPOConfig)


def load_config(argv: Sequence[str], *, validate: bool = True) -> PPOConfig:
    """Build a :class:`PPOConfig` from ``config=FILE.yaml`` items and ``a.b.c=value`` overrides.

    Precedence: dataclass defaults < YAML files (in the order given) < overrides (in the order given). Derived
    fields are filled, and with ``validate`` the cross-field checks run. Every problem raises :class:`ConfigError`.
    """
    merged = copy.deepcopy(_defaults())
    explicit: dict[str, str] = {}  # keys set by the user -> where they were set
    files = [item.partition("=")[2] for item in argv if item.startswith("config=")]
    overrides = [item for item in argv if not item.startswith("config=")]
    for path in files:
        _apply(merged, _read_yaml(path), f"from {path}", explicit)
    for item in overrides:
        _apply(merged, _parse_override(item), "from the command line", explicit)
    _check_explicit_derived(merged, explicit)
    # which values come from the environment (or another secret) is known only before interpolations are resolved
    secrets = interpolated_secrets(OmegaConf.to_container(merged, resolve=False), MIRRORS)
    try:
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:  # e.g. an interpolation ${...} that points nowhere
        raise ConfigError(f"cannot build the configuration: {exc}") from None
    remember_interpolated_secrets(config, secrets)
    if validate:
        config.validate()
    return config


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively, so the result is plain YAML/JSON data."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def to_dict(config: PPOConfig, *, redacted: bool = False) -> dict[str, Any]:
    """The config as nested plain dicts and lists (for loggers and JSON); with ``redacted``, secret-looking values
    replaced by ``<redacted>`` (:mod:`easyr1.config.redaction`), as the trackers receive it."""
    tree = _plain(dataclasses.asdict(config))
    return redact(tree, interpolated_secrets_of(config))[0] if redacted else tree


def redacted_keys(config: PPOConfig) -> list[str]:
    """The dotted keys whose values ``to_dict(config, redacted=True)`` and ``to_yaml(config, redacted=True)`` leave
    out (names only)."""
    return redact(_plain(dataclasses.asdict(config)), interpolated_secrets_of(config))[1]


def to_yaml(config: PPOConfig, *, redacted: bool = False) -> str:
    """The config as YAML text that :func:`load_config` reads back to an equal config.

    Derived mirror keys are left out: they are recomputed on loading, and leaving them out lets a saved config be
    reused with overrides of the keys they are copied from. With ``redacted`` (a checkpoint's ``config.yaml``),
    values from ``${oc.env:...}`` are written as that interpolation, so the text reads them from the environment
    again, and other secret-looking values as ``<redacted>``.
    """
    tree = to_dict(config)
    for derived in MIRRORS:
        *parents, last = derived.split(".")
        section = tree
        for part in parents:
            section = section[part]
        del section[last]
    if redacted:
        tree = redact(tree, interpolated_secrets_of(config), keep_interpolations=True)[0]
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
