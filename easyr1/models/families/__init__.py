"""The model families easyr1 trains, by ``model_type`` (the key of a model's ``config.json``).

Each family is one module here that builds its :class:`~easyr1.models.families.base.Family` records (and the
recipe of its tiny random model), listed once in ``_MODULES``. Every family has been run through the trainer's
paths: loading, chat template and processor, position ids, the packed forward, LoRA targets and FSDP units
(``make check-families``; ``easyr1.tools.tiny_model --family NAME`` builds a tiny one). A model of another type is
refused before any weights load (:func:`unsupported_model_problem`, called by the config-vs-model checks), since
code written for these families would otherwise run on it and fail late or, worse, silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from easyr1.models.families import gemma, glm, internvl, qwen, qwen3_vl_moe
from easyr1.models.families.base import QWEN_VISION_MODULES, Family, TinyRecipe, qwen_dummy_image


__all__ = [
    "FAMILIES",
    "Family",
    "TinyRecipe",
    "family_of",
    "forward_token_types",
    "mark_causal_image_blocks",
    "supported_families_text",
    "unsupported_model_problem",
]

_MODULES = (qwen, internvl, gemma, glm, qwen3_vl_moe)
FAMILIES: dict[str, Family] = {family.model_type: family for module in _MODULES for family in module.FAMILIES}
# A config of no supported model_type (a look-alike in tests, a reward model) is taken for a Qwen-VL model when it
# has a vision config and an image token, else for a text-only one.
_QWEN_VL_LOOKALIKE = Family(
    model_type="",
    name="Qwen-VL look-alike",
    vision_modules=QWEN_VISION_MODULES,
    mrope=True,
    dummy_image=qwen_dummy_image,
)
_TEXT_LOOKALIKE = Family(model_type="", name="text look-alike", placeholder_attributes=())


def _read(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def family_of(config: Any) -> Family:
    """The family of a transformers config (or ``config.json`` as a dict). A supported ``model_type`` gives its
    record. Any other config is judged by its attributes (a Qwen-VL-like record when it has a vision config and an
    image token, else a text-only one): hand-written look-alikes in tests, and reward models, which may be of any
    type; a policy of an unsupported type is refused long before (:func:`unsupported_model_problem`)."""
    family = FAMILIES.get(_read(config, "model_type") or "")
    if family is not None:
        return family
    if _read(config, "vision_config") is not None and _read(config, "image_token_id") is not None:
        return _QWEN_VL_LOOKALIKE
    return _TEXT_LOOKALIKE


# Set on a model (the module the trainer's forward receives) whose image blocks must run causally, as the engine
# runs them: see mark_causal_image_blocks.
_CAUSAL_IMAGE_BLOCKS = "_easyr1_causal_image_blocks"


def mark_causal_image_blocks(model: Any) -> None:
    """Make the trainer's forwards of ``model`` compute no token types (:func:`forward_token_types`): its image
    blocks then attend causally, as an engine without bidirectional image attention (vLLM-CPU) samples them."""
    setattr(model, _CAUSAL_IMAGE_BLOCKS, True)


def forward_token_types(model: Any, input_ids: Any) -> dict[str, Any]:
    """The token types ``model``'s family computes from ``input_ids`` for its forward (Gemma 3's
    ``token_type_ids``); ``{}`` for most families and for a model marked by :func:`mark_causal_image_blocks`."""
    config = getattr(model, "config", None)
    if config is None or getattr(model, _CAUSAL_IMAGE_BLOCKS, False):
        return {}
    return family_of(config).token_type_inputs(input_ids, config)


def supported_families_text() -> str:
    """``qwen2_vl (Qwen2-VL), ...``: the supported model types with their names, for messages."""
    return ", ".join(f"{family.model_type} ({family.name})" for family in FAMILIES.values())


def unsupported_model_problem(model_config: Mapping[str, Any], model_path: str) -> str | None:
    """The message refusing a model whose ``model_type`` is not a supported family; ``None`` when it is one, or
    when ``model_config`` names no type (a hand-written look-alike, not a transformers config)."""
    model_type = model_config.get("model_type")
    if model_type is None or model_type in FAMILIES:
        return None
    return (
        f"the model at worker.actor.model.model_path={model_path} has model_type={model_type!r}, which easyr1 does "
        f"not support; supported families: {supported_families_text()}"
    )
