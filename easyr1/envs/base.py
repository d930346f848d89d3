"""The environment interface multi-turn agents are trained against, and the checks on what an environment returns.

An environment is a Python class with four methods (the shape VAGEN, RAGEN and ROLL use):

- ``system_prompt() -> str``: the instructions the model sees before the first observation;
- ``reset(seed) -> Observation``: start an episode; the same seed gives the same episode;
- ``step(action_text) -> (Observation, reward, done, info)``: apply the model's text for one turn;
- ``close()``: release what the environment holds.

An :class:`Observation` is text with one ``<image>`` marker per image, plus the images (PIL), in order. ``info`` may
carry ``success`` (bool: the episode reached its goal) and ``action_valid`` (bool: the text held an action the
environment could read; ``False`` counts an invalid action and costs ``env.format_penalty``). The environment parses
its own actions (:func:`easyr1.envs.actions.first_word`); it never raises on text it cannot read.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from PIL import Image


# The marker of an image in an observation's text; each one is replaced by the model's own image placeholder.
IMAGE_MARKER = "<image>"


@dataclass
class Observation:
    """What the model sees after a reset or a step: text with one ``<image>`` marker per image, and the images."""

    text: str
    images: list[Image.Image] = field(default_factory=list)


StepResult = tuple[Observation, float, bool, dict[str, Any]]


class Environment(abc.ABC):
    """A multi-turn environment; subclasses take their settings as keyword arguments (``env.env_kwargs``)."""

    @abc.abstractmethod
    def system_prompt(self) -> str:
        """The instructions shown before the first observation (the same for every episode)."""

    @abc.abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start a new episode, fully determined by ``seed``; returns the first observation."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the model's text of one turn; returns (observation, reward, done, info)."""

    def close(self) -> None:  # noqa: B027 (overriding is optional)
        """Release what the environment holds (nothing by default)."""
