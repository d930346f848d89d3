"""Sampling settings and seeds shared by the rollout stages.

Seeds: every sample has its own sampling seed, a function of (``worker.rollout.seed``, step, generation round,
sample) only, so a step replays exactly. Sampling rounds (the step's rounds, DAPO's refills, agent turns, validation)
take seeds below ``2**62``; greedy baseline rounds (ReMax) take seeds from ``2**62`` on, which no sampling round can
have whatever the number of rounds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from easyr1.engines import SamplingSettings
from easyr1.errors import UserError


# The settings a call may change (engine settings such as memory are fixed at start-up).
SAMPLING_KEYS = {setting.name for setting in dataclasses.fields(SamplingSettings)}
# Sampling seeds stay below this; greedy baseline rounds count up from it (torch seeds are int64).
GREEDY_SEEDS_START = 2**62
# Validation samples get their own seed stream, apart from training's generation rounds.
VALIDATION_ROUND = 1_000_000


def round_first_seed(rollout_seed: int, step: int, round_index: int, samples: int) -> int:
    """The seed of the first sample of a sampling round of ``samples`` samples (the others follow it).

    Raises:
        UserError: when the seeds would leave the sampling range (a ``worker.rollout.seed`` far too large).
    """
    first = ((rollout_seed * 1_000_003 + step) * 1_009 + round_index) * samples
    if not 0 <= first <= GREEDY_SEEDS_START - samples:
        raise UserError(
            f"worker.rollout.seed={rollout_seed} gives step {step} sampling seeds outside [0, 2**62); use a smaller "
            "non-negative seed (below 1000 fits rounds of up to 4 million samples)"
        )
    return first


def greedy_baseline_first_seed(rollout_seed: int, step: int, samples: int) -> int:
    """The seed of the first sample of a step's greedy baseline round: above every sampling round's seeds."""
    return GREEDY_SEEDS_START + round_first_seed(rollout_seed, step, 0, samples)


def sampling_settings(config: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine's sampling settings from ``worker.rollout`` (and ``data.max_response_length``), with overrides."""
    rollout = config.worker.rollout
    settings = {
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "max_tokens": config.data.max_response_length,
        "ignore_eos": rollout.ignore_eos,
    }
    settings.update(overrides or {})
    if settings["temperature"] == 0:  # EasyR1's way of asking for greedy decoding
        settings["greedy"], settings["temperature"] = True, 1.0
    return settings


def validation_overrides(config: Any) -> tuple[int, dict[str, Any]]:
    """``worker.rollout.val_override_config`` as (samples per validation prompt, sampling overrides); engine settings
    (memory, ...) are fixed at start-up, so only the sampling ones apply."""
    overrides = dict(config.worker.rollout.val_override_config)
    n = int(overrides.pop("n", 1))
    return n, {key: value for key, value in overrides.items() if key in SAMPLING_KEYS}
