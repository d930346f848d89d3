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


DEFAULT_EXCLUDE = r".*\bvisual\b.*"  # every module inside the vision tower
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
        exclude_modules=lora.exclude_modules or DEFAULT_EXCLUDE,
        lora_dropout=0.0,
        bias="none",
    )
    return get_peft_model(model, config)


def lora_scaling(adapter_config: dict[str, Any]) -> float:
    """``alpha / r`` (``alpha / sqrt(r)`` with rank-stabilised LoRA), from a peft adapter config."""
    rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
    return alpha / rank**0.5 if adapter_config.get("use_rslora") else alpha / rank


_LORA_PART = re.compile(rf"\.lora_(A|B)\.{ADAPTER}\.weight$")


def merged_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain Hugging Face ``(name, tensor)`` pairs from a peft model's full weights, adapters folded in.

    ``base_model.model.X.base_layer.weight`` + ``X.lora_A/B.default.weight`` -> ``X.weight = W + scaling * B @ A``;
    other names lose the peft prefix. Tensors must be full (gathered), not shards.
    """
    tensors = dict(named_tensors)
    for name, value in tensors.items():
        if _LORA_PART.search(name):
            continue
        plain = name.removeprefix(PEFT_PREFIX)
        if ".base_layer." in plain:
            module = name.rsplit(".base_layer.", 1)[0]
            plain = plain.replace(".base_layer.", ".")
            lora_a = tensors.get(f"{module}.lora_A.{ADAPTER}.weight")
            lora_b = tensors.get(f"{module}.lora_B.{ADAPTER}.weight")
            if name.endswith(".weight") and lora_a is not None and lora_b is not None:
                delta = (lora_b.double() @ lora_a.double()) * scaling
                value = (value.double() + delta).to(value.dtype)
        yield plain, value


def adapter_config_of(model: nn.Module) -> dict[str, Any] | None:
    """The active adapter's config as a dict, or ``None`` for a model without adapters."""
    configs = getattr(model, "peft_config", None)
    return configs[ADAPTER].to_dict() if configs else None
