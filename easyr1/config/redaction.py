"""Secret-looking config values kept out of the copies of the config a run writes down: the config handed to the
trackers (mlflow, wandb, swanlab) and the ``config.yaml`` saved in each checkpoint. The run itself uses the values as
given.

A value is redacted when

- its key's name looks like a secret (:func:`is_secret_name`), at any depth: reward function and environment
  keyword arguments included; or
- it came from an interpolation of the environment, ``${oc.env:NAME}`` (where secrets are meant to be kept), or of
  another redacted key (:func:`interpolated_secrets`, remembered on the config by ``load_config``).

Redacted values become :data:`REDACTED`. In a checkpoint's ``config.yaml`` an interpolated value is written as the
interpolation it came from instead, so the saved config still reads the value from the environment when reused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


REDACTED = "<redacted>"

# A key is secret-looking when one of its words is one of these ...
SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "passphrase", "apikey", "credential", "credentials"}
)
# ... or its last word is one of these (``hf_token``, ``api_key``, ``key``; not ``pad_token_id``, ``max_tokens``:
# a token or key named in the middle of a name, or in the plural, is an id, a count or a column) ...
SECRET_LAST_WORDS = frozenset({"key", "token"})
# ... or two adjacent words are one of these pairs (``api_key_judge``, ``access_token_file``).
SECRET_PAIRS = frozenset(
    {("api", "key"), ("api", "keys"), ("api", "token"), ("access", "key"), ("access", "token"), ("auth", "token")}
    | {("private", "key"), ("secret", "key")}
)

# The config's own fields named ``*_key`` name a dataset column or a metric, never a secret.
COLUMN_NAME_KEYS = frozenset(
    {"data.prompt_key", "data.answer_key", "data.image_key", "data.video_key", "algorithm.filter_key"}
)

# Where load_config keeps a config's interpolated secrets (an attribute, not a field: it is no config key).
_ATTRIBUTE = "_interpolated_secrets"

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_REFERENCE = re.compile(r"\$\{\s*(\.*[A-Za-z_][\w.]*)\s*\}")


def name_words(name: str) -> list[str]:
    """The lower-case words of a key's name: ``OPENAI_API_KEY``, ``openai-api-key`` and ``openaiApiKey`` all give
    ``["openai", "api", "key"]``."""
    return [word.lower() for word in re.split(r"[^A-Za-z0-9]+", _CAMEL_BOUNDARY.sub("_", name)) if word]


def is_secret_name(name: str) -> bool:
    """Whether a key called ``name`` (one level's name, not a dotted path) looks like it holds a secret."""
    words = name_words(name)
    if not words:
        return False
    return (
        any(word in SECRET_WORDS for word in words)
        or words[-1] in SECRET_LAST_WORDS
        or any(pair in SECRET_PAIRS for pair in zip(words, words[1:]))
    )


def _leaves(tree: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(dotted path, value)`` of every key and list item in a nested tree, parents before their children."""
    items = tree.items() if isinstance(tree, Mapping) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        path = f"{prefix}{key}"
        yield path, value
        yield from _leaves(value, f"{path}.")


def _secret_path(path: str) -> bool:
    """Whether the last name in a dotted path looks like a secret (the config's column-name keys never do)."""
    return path not in COLUMN_NAME_KEYS and is_secret_name(path.rpartition(".")[2])


def interpolated_secrets(unresolved: Mapping[str, Any], mirrors: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{dotted path: interpolation}`` for each value of an unresolved config tree that will come from the
    environment (``${oc.env:...}`` anywhere in the string) or from a secret-looking key (``${a.api_key}``), followed
    through chains of interpolations; ``mirrors`` (derived key -> the key it copies) adds the copies of such values.
    """
    interpolations = {path: value for path, value in _leaves(unresolved) if isinstance(value, str) and "${" in value}
    secrets = {path: text for path, text in interpolations.items() if "oc.env" in text}
    named = {path for path, _ in _leaves(unresolved) if _secret_path(path)}

    def absolute(reference: str, path: str) -> str:
        """An interpolation's reference as a dotted path from the root (``${.x}``: a sibling of ``path``)."""
        dots = len(reference) - len(reference.lstrip("."))
        if not dots:
            return reference
        parents = path.split(".")[: -dots or None]
        return ".".join([*parents, reference[dots:]])

    def secret_reference(text: str, path: str) -> bool:
        for reference in (absolute(found, path) for found in _REFERENCE.findall(text)):
            for source in (*secrets, *named):
                if reference == source or reference.startswith(f"{source}.") or source.startswith(f"{reference}."):
                    return True
        return False

    grew = True
    while grew:  # until no interpolation refers to a secret it was not yet known to
        grew = False
        for path, text in interpolations.items():
            if path not in secrets and secret_reference(text, path):
                secrets[path], grew = text, True
    for derived, source in (mirrors or {}).items():
        if source in secrets:
            secrets[derived] = secrets[source]
    return secrets


def remember_interpolated_secrets(config: object, secrets: Mapping[str, str]) -> None:
    """Keep :func:`interpolated_secrets`' result on the config object (``load_config`` calls this)."""
    object.__setattr__(config, _ATTRIBUTE, dict(secrets))


def interpolated_secrets_of(config: object) -> dict[str, str]:
    """What :func:`remember_interpolated_secrets` kept on ``config`` (empty for a config built in code)."""
    return dict(getattr(config, _ATTRIBUTE, {}))


def redact(
    tree: Mapping[str, Any], interpolated: Mapping[str, str], *, keep_interpolations: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """A copy of a config tree with secret-looking values replaced, and the dotted keys replaced (names only).

    ``interpolated``: the tree's interpolated secrets (:func:`interpolated_secrets`); with ``keep_interpolations``
    those are written as their interpolation (``${oc.env:NAME}``), otherwise as :data:`REDACTED` like the rest.
    A key whose value is null (nothing to hide) is left as it is.
    """
    redacted: list[str] = []

    def walk(value: Any, path: str) -> Any:
        if path in interpolated:
            redacted.append(path)
            return interpolated[path] if keep_interpolations else REDACTED
        if path and value is not None and _secret_path(path):
            redacted.append(path)
            return REDACTED
        prefix = f"{path}." if path else ""
        if isinstance(value, Mapping):
            return {key: walk(item, f"{prefix}{key}") for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item, f"{prefix}{index}") for index, item in enumerate(value)]
        return value

    return walk(tree, ""), redacted
