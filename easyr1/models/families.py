"""The model families easyr1 trains, by ``model_type`` (the key of a model's ``config.json``).

Each family here has been run through the trainer's paths: loading, chat template and processor, position ids,
the packed forward, LoRA targets and FSDP units (``easyr1.tools.tiny_model --family NAME`` builds a tiny one).
A model of another type is refused before any weights load (:func:`unsupported_model_problem`, called by the
config-vs-model checks), since code written for these families (m-rope positions, the vision tower's name and
input shape, the placeholder tokens) would otherwise run on it and fail late or, worse, silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


# model_type -> the family's name as people say it
VISION_LANGUAGE_FAMILIES = {
    "qwen2_vl": "Qwen2-VL",
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_5": "Qwen3.5, dense",
}
TEXT_FAMILIES = {"qwen2": "Qwen2 / Qwen2.5", "qwen3": "Qwen3", "llama": "Llama"}
SUPPORTED_FAMILIES = {**VISION_LANGUAGE_FAMILIES, **TEXT_FAMILIES}

# The families whose language model rotates with m-rope (text + t, h, w position rows), all Qwen-VL style.
MROPE_MODEL_TYPES = frozenset(VISION_LANGUAGE_FAMILIES)


def supported_families_text() -> str:
    """``qwen2_vl (Qwen2-VL), ...``: the supported model types with their names, for messages."""
    return ", ".join(f"{model_type} ({name})" for model_type, name in SUPPORTED_FAMILIES.items())


def unsupported_model_problem(model_config: Mapping[str, Any], model_path: str) -> str | None:
    """The message refusing a model whose ``model_type`` is not a supported family; ``None`` when it is one, or
    when ``model_config`` names no type (a hand-written look-alike, not a transformers config)."""
    model_type = model_config.get("model_type")
    if model_type is None or model_type in SUPPORTED_FAMILIES:
        return None
    return (
        f"the model at worker.actor.model.model_path={model_path} has model_type={model_type!r}, which easyr1 does "
        f"not support; supported families: {supported_families_text()}"
    )
