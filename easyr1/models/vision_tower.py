"""Keep every rank's vision weights in step when ranks differ in which micro-batches have images; freezing the tower.

Under FSDP the vision tower belongs to the root unit (``distributed/fsdp.py``): its weights are gathered with the
root's at the start of every forward, so running the tower zero, one or two times issues no collectives. What is
left is the backward: the root reduce-scatters the gradients of its weights, and every rank must hand it the same
set. On a micro-batch without images or videos the tower does not run and its weights get no gradient; so it runs
on the family's smallest dummy image, whose output enters the result multiplied by zero (zero gradients, the same
set everywhere).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from easyr1.models.families import family_of


def _vision_config(model: nn.Module) -> Any | None:
    return getattr(getattr(model, "config", None), "vision_config", None)


def dummy_image_inputs(model: nn.Module, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The smallest valid image for ``model``'s tower, as ``get_image_features``' keyword arguments (the family's
    shape: ``Family.dummy_image``), on ``device`` (default: where the parameters are; with FSDP CPU offload that is
    the host, not the compute device)."""
    family = family_of(model.config)
    if family.dummy_image is None:
        raise ValueError(f"the {family.name} family has no vision tower to run")
    return family.dummy_image(model, next(model.parameters()).device if device is None else device)


def _sum_tensors(value: Any) -> torch.Tensor:
    """Sum of every floating tensor inside ``value`` (tensors, tuples, lists, dicts, model outputs)."""
    if isinstance(value, torch.Tensor):
        return value.float().sum() if value.is_floating_point() else torch.zeros(())
    if isinstance(value, dict):
        value = list(value.values())
    elif hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, (list, tuple)):
        return sum((_sum_tensors(item) for item in value), torch.zeros(()))
    return torch.zeros(())


def vision_keepalive(
    root: nn.Module, model: nn.Module, vision_inputs: dict[str, Any], device: torch.device | str | None = None
) -> torch.Tensor | None:
    """A scalar zero computed through ``model``'s vision tower on a dummy image, when the micro-batch has no
    images and no videos; ``None`` otherwise and for text-only models. Call it *before* the forward and add it to
    the forward's output. ``root`` is the FSDP root that owns the tower's weights (``model`` itself for the actor,
    the value model around the backbone for the critic). ``device``: where the forward's inputs are."""
    if _vision_config(model) is None or not hasattr(model, "get_image_features"):
        return None
    if "pixel_values" in vision_inputs or "pixel_values_videos" in vision_inputs:
        return None
    if isinstance(root, FSDPModule):
        # the same all-gather the forward would start with; the forward then finds the weights gathered
        root.unshard()
    return _sum_tensors(model.get_image_features(**dummy_image_inputs(model, device))) * 0.0


def freeze_vision_tower(model: nn.Module) -> None:
    """Stop training the vision encoder (``model.freeze_vision_tower``): every parameter inside the family's vision
    modules (``visual`` for Qwen-VL) keeps its weights; the rest of the model is left as it is."""
    family = family_of(model.config)
    for name, param in model.named_parameters():
        if family.is_vision_module(name):
            param.requires_grad_(False)
