"""LoRA adapters through peft: wrapping the actor, and folding adapters into plain weights.

Only the adapters train; the vision tower gets none unless ``lora.exclude_modules`` says otherwise. The rollout
engine and the exported model get plain Hugging Face weights with ``W + scaling * B @ A`` folded in
(:func:`merged_weights`), so they serve exactly what the adapted actor computes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from easyr1.models.families import family_of


PEFT_PREFIX = "base_model.model."
ADAPTER = "default"


def apply_lora(model: nn.Module, lora: Any) -> nn.Module:
    """Wrap ``model`` in rank-``lora.rank`` adapters (``lora``: ``worker.actor.model.lora``); base weights freeze."""
    from peft import LoraConfig, get_peft_model

    targets = lora.target_modules
    if targets != "all-linear":
        targets = [name.strip() for name in str(targets).split(",") if name.strip()]
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=targets,
        exclude_modules=lora.exclude_modules or family_of(model.config).lora_exclude(),
        lora_dropout=0.0,
        bias="none",
    )
    return get_peft_model(model, config)


def lora_scaling(adapter_config: dict[str, Any]) -> float:
    """``alpha / r`` (``alpha / sqrt(r)`` with rank-stabilised LoRA), from a peft adapter config."""
    rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
    return alpha / rank**0.5 if adapter_config.get("use_rslora") else alpha / rank


_LORA_PART = re.compile(rf"\.lora_(A|B)\.{ADAPTER}\.weight$")
_BASE_WEIGHT = re.compile(r"\.base_layer\.weight$")


def _plain_name(name: str) -> str:
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain Hugging Face ``(name, tensor)`` pairs from a peft model's full weights, adapters folded in.

    ``base_model.model.X.base_layer.weight`` + ``X.lora_A/B.default.weight`` -> ``X.weight = W + scaling * B @ A``;
    other names lose the peft prefix. Tensors must be full (gathered), not shards. The fold is computed in
    float64 from the given (master) values and only the result is cast to ``dtype`` (``None``: the base weight's
    dtype), so a small adapter update is not rounded away by a bf16 base weight. Streams: a layer is yielded as
    soon as its base weight and both adapters have arrived, so only the layers in flight are held.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}  # module name -> {"base"/"A"/"B": tensor}
    for name, value in named_tensors:
        lora_part = _LORA_PART.search(name)
        if lora_part:
            module, part = name[: lora_part.start()], lora_part.group(1)
        elif _BASE_WEIGHT.search(name):
            module, part = name.rsplit(".base_layer.", 1)[0], "base"
        else:
            yield _plain_name(name), value if dtype is None else value.to(dtype)
            continue
        parts = pending.setdefault(module, {})
        parts[part] = value
        if len(parts) == 3:
            del pending[module]
            base = parts["base"]
            delta = (parts["B"].double() @ parts["A"].double()) * scaling
            yield f"{_plain_name(module)}.weight", (base.double() + delta).to(dtype or base.dtype)
    for module, parts in pending.items():  # a base layer whose adapters are absent: the plain weight
        if "base" in parts:
            base = parts["base"]
            yield f"{_plain_name(module)}.weight", base if dtype is None else base.to(dtype)


def adapter_config_of(model: nn.Module) -> dict[str, Any] | None:
    """The active adapter's config as a dict, or ``None`` for a model without adapters."""
    configs = getattr(model, "peft_config", None)
    return configs[ADAPTER].to_dict() if configs else None
