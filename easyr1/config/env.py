"""The ``env`` section: the environment a multi-turn agent is trained in, with its checks.

Without ``env.name`` and ``env.env_class`` a run is single-turn (prompts from ``data.train_files``, scores from
``worker.reward``), exactly as without the section. With one of them, each training sample is an episode: a group
is ``worker.rollout.n`` episodes started from the same seed, a step plays ``data.rollout_batch_size`` groups, and the
environment's rewards are the scores. Names are the ones :mod:`easyr1.envs` registers, the only list of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from easyr1.config.fields import option
from easyr1.config.rules import AT_LEAST_ONE, AT_LEAST_ONE_OR_NULL, NON_NEGATIVE, one_of


@dataclass
class EnvConfig:
    """The environment of a multi-turn agent run (unset: single-turn prompts from the dataset)."""

    name: str | None = option(None, "a registered environment (sokoban, frozen_lake, target); null: no environment")
    env_class: str | None = option(None, "'path/to/env.py:ClassName': your own environment class, instead of name")
    env_kwargs: dict[str, Any] = option({}, "keyword arguments the environment class is built with")
    max_turns: int = option(5, "turns per episode at most (an episode also ends when the environment says done)")
    max_tokens_per_turn: int = option(64, "new tokens the model may generate in one turn")
    context: str = option(
        "full",
        "what each turn's prompt holds: full (every earlier turn; an episode is one training sequence) or latest "
        "(the system prompt and the latest observation only; each turn is its own training sequence)",
    )
    seed: int = option(0, "first training seed: group k of the run plays the episode of seed + k")
    num_seeds: int | None = option(
        None, "training seeds cycle through [seed, seed + num_seeds) (null: a new seed for every group, none repeats)"
    )
    val_seed: int = option(1_000_000, "first validation seed (keep the range apart from the training seeds)")
    val_episodes: int = option(32, "validation episodes, with seeds val_seed, val_seed + 1, ...")
    format_penalty: float = option(-0.1, "added to the turn's reward when the environment could not read an action")
    shuffle_images: bool = option(
        False, "control run: each observation shows another episode's images (is the model using the image?)"
    )

    @property
    def enabled(self) -> bool:
        """Whether the run trains an agent in an environment."""
        return self.name is not None or self.env_class is not None

    @property
    def rows_per_episode(self) -> int:
        """Training rows an episode becomes: one trajectory (``context=full``, and without an environment), or one
        row per turn, ``max_turns`` of them with the unplayed ones left empty (``context=latest``)."""
        return self.max_turns if self.enabled and self.context == "latest" else 1


# What a turn's prompt can hold (see EnvConfig.context).
CONTEXTS = ("full", "latest")

# Value rules of single keys, relative to ``env``.
ENV_RANGES = {
    "max_turns": AT_LEAST_ONE,
    "max_tokens_per_turn": AT_LEAST_ONE,
    "seed": NON_NEGATIVE,
    "num_seeds": AT_LEAST_ONE_OR_NULL,
    "val_seed": NON_NEGATIVE,
    "val_episodes": AT_LEAST_ONE,
}


def check_env_names(env: EnvConfig, problems: list[str]) -> None:
    """One of name / env_class, a registered name, a python file for the class, a known context."""
    if env.name is not None and env.env_class is not None:
        problems.append(
            f"env.name={env.name!r} and env.env_class={env.env_class!r} are both set; keep one (a registered "
            "environment, or your own class)"
        )
    one_of(problems, "env.context", env.context, CONTEXTS)
    if env.name is not None:
        from easyr1.envs import ENVIRONMENTS

        one_of(problems, "env.name", env.name, ENVIRONMENTS.names())
    if env.env_class is not None and not re.search(r"\.py:\w+$", env.env_class):
        problems.append(f"env.env_class={env.env_class!r} must name a class in a python file: 'path/to/env.py:Class'")
