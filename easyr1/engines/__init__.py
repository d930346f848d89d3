"""Rollout engines: what samples responses on a worker (vLLM, Hugging Face ``generate``).

:mod:`easyr1.engines.registry` holds them by name with their traits; importing this package registers every engine
shipped here (each imports its library only when built).
"""

from easyr1.engines import vllm_engine  # noqa: F401, I001  registers the engines, the default first
from easyr1.engines import hf_engine  # noqa: F401  registers the engine
from easyr1.engines.base import RolloutEngine, SamplingSettings, StopRule
from easyr1.engines.registry import ENGINES, EngineSetup, EngineTraits, build_engine, check_engine, engine_traits


__all__ = [
    "ENGINES",
    "EngineSetup",
    "EngineTraits",
    "RolloutEngine",
    "SamplingSettings",
    "StopRule",
    "build_engine",
    "check_engine",
    "engine_traits",
]
