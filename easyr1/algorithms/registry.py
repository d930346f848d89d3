"""Name -> function registries: the one list of names of each family of interchangeable parts.

Each family (advantage estimators ``grpo``/``rloo``/``gae``..., policy losses ``ppo``/``gspo``/``cispo``..., KL
estimators ``kl``/``low_var_kl``..., loss aggregation modes, KL controllers, rollout engines) lives in one
:class:`Registry`. A new variant is one decorated function; the config refers to it by name, validates the name
against the registry, and an unknown name fails with a :class:`~easyr1.errors.ConfigError` listing the valid ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from easyr1.errors import ConfigError


FnT = TypeVar("FnT", bound=Callable)


class Registry(Generic[FnT]):
    """A named collection of interchangeable functions, filled by a decorator.

    Args:
        kind: what the entries are, used in error messages ("advantage estimator").
        config_key: the config key that selects an entry, used in error messages
            ("algorithm.adv_estimator").
    """

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, FnT] = {}
        self._traits: dict[str, Any] = {}

    def register(self, name: str, traits: Any = None) -> Callable[[FnT], FnT]:
        """Return a decorator that adds the decorated function under ``name`` and returns it unchanged.

        ``traits``: what the family records about each entry beside its function (an estimator's needs, whether an
        engine runs tensor-parallel), read back with :meth:`traits`.
        """

        def decorator(fn: FnT) -> FnT:
            if name in self._entries and self._entries[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered by {self._entries[name].__qualname__}")
            self._entries[name] = fn
            self._traits[name] = traits
            return fn

        return decorator

    def traits(self, name: str) -> Any:
        """What was registered with ``name`` beside its function; ConfigError naming the valid choices otherwise."""
        self.get(name)
        return self._traits[name]

    def get(self, name: str) -> FnT:
        """Return the function registered as ``name``; raise ConfigError naming the valid choices otherwise."""
        if name in self._entries:
            return self._entries[name]
        close = difflib.get_close_matches(str(name), self._entries, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"Unknown {self.kind} {name!r} for `{self.config_key}`.{hint} Valid names: {', '.join(self.names())}."
        )

    def names(self) -> list[str]:
        """All registered names, in the order they were registered (the order error messages list them in)."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
