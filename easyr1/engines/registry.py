"""The rollout engines by name (``worker.rollout.name``), each registered with its traits.

An engine is one file in this package: a builder ``fn(EngineSetup) -> RolloutEngine`` registered with
:func:`register_engine` and the :class:`EngineTraits` the driver and the worker read instead of testing the engine's
name. The builders import their engine's library (vLLM) only when called, so importing the registry (the config does,
to validate names) never imports vLLM or loads a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from easyr1.algorithms.registry import Registry


if TYPE_CHECKING:
    import torch

    from easyr1.engines.base import RolloutEngine


def no_check(config: Any, device: str) -> None:
    """The start-up check of an engine that needs none."""


def no_preparation(config: Any, device: str) -> None:
    """The worker-side preparation of an engine that needs none."""


@dataclass(frozen=True)
class EngineTraits:
    """What the rest of the run needs to know of an engine, declared where it is registered.

    Attributes:
        reads_images: True when the engine takes a prompt's unexpanded ids and its images (``multi_modal_data``) and
            expands the vision placeholders itself (vLLM); False when it reads the processor's tensors
            (``multi_modal_inputs``) like the actor (the HF engine). The rollout stages send what the engine reads.
        tensor_parallel: whether ``worker.rollout.tensor_parallel_size`` workers can share one engine (else each
            worker holds a whole model).
        check: ``check(config, device)``: the engine's refusals of settings it cannot run on ``device`` ("cpu" or
            "cuda"), as :class:`~easyr1.errors.UserError`; called before any worker starts.
        prepare: ``prepare(config, device)``: called on a worker that will hold the engine, first thing in its
            set-up, before any model loads, for work that would otherwise happen while the models and the engine are
            all in memory.
    """

    reads_images: bool
    tensor_parallel: bool
    check: Callable[[Any, str], None] = no_check
    prepare: Callable[[Any, str], None] = no_preparation


@dataclass(frozen=True)
class EngineSetup:
    """What the hybrid worker hands an engine builder.

    Attributes:
        config: the run's ``PPOConfig``.
        dtype: the engine's weights dtype.
        pad_token_id: the id responses are padded with.
        eos_token_ids: the ids that end a response.
        banned_token_ids: ids never sampled (the vision placeholders).
        device: the worker's device type ("cpu" or "cuda").
        show_progress: whether this engine shows a generation progress bar.
    """

    config: Any
    dtype: torch.dtype
    pad_token_id: int
    eos_token_ids: list[int]
    banned_token_ids: list[int]
    device: str
    show_progress: bool


EngineBuilder = Callable[[EngineSetup], "RolloutEngine"]

ENGINES: Registry[EngineBuilder] = Registry("rollout engine", "worker.rollout.name")


def register_engine(name: str, traits: EngineTraits) -> Callable[[EngineBuilder], EngineBuilder]:
    """Decorator registering an engine builder as ``name`` with its ``traits``."""
    return ENGINES.register(name, traits=traits)


def engine_traits(name: str) -> EngineTraits:
    """The traits of the engine registered as ``name`` (ConfigError naming the valid names if unknown)."""
    return ENGINES.traits(name)


def check_engine(config: Any, device: str) -> None:
    """The start-up check of the configured engine on ``device``, before any worker starts."""
    engine_traits(config.worker.rollout.name).check(config, device)


def build_engine(setup: EngineSetup) -> RolloutEngine:
    """The engine named by ``worker.rollout.name``, built by its registered builder."""
    return ENGINES.get(setup.config.worker.rollout.name)(setup)
