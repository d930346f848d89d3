"""Exact parameter counts and the layer shapes of a model, read from its config alone.

The model is built on the meta device (no memory, no weights read) with the same class :mod:`easyr1.models.loading`
picks, so the counts are the ones the trainer will shard: tied embeddings once, the vision tower separately, the LM
head, the critic's backbone and the LoRA adapters the actor would get.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, PretrainedConfig

from easyr1.models.families import family_of
from easyr1.models.linear_attention import LINEAR_LAYER_TYPE, layer_types
from easyr1.models.loading import apply_config_overrides, is_vision_language


@dataclass(frozen=True)
class TextShape:
    """The language model's sizes that activations, KV cache and attention FLOPs depend on.

    ``linear_layers`` of the ``layers`` are linear-attention layers (Qwen3.5's GatedDeltaNet): no KV cache and no
    attention over the sequence, but a fixed state per sequence of ``linear_state`` elements (the recurrent
    ``value heads x key dim x value dim`` plus the short convolution's window) and ``linear_flops_per_token``."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linear_layers: int = 0
    linear_state: int = 0
    linear_flops_per_token: int = 0

    @property
    def attention_layers(self) -> int:
        """The layers that attend over the whole sequence (and keep a KV cache)."""
        return self.layers - self.linear_layers


@dataclass(frozen=True)
class VisionShape:
    """The vision tower's sizes: blocks, width, MLP width, and how pixels become patches and image tokens."""

    depth: int
    hidden: int
    intermediate: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of one model (each tensor counted once) and its shapes.

    ``language`` + ``vision`` = ``total``; ``embeddings`` is the input embedding table, ``lm_head`` the output
    projection when it is not tied to it (0 when tied); ``backbone`` is what the critic keeps (everything but the LM
    head); ``linear_shapes`` lists ``(name, in_features, out_features)`` of every linear layer, for LoRA.
    """

    total: int
    language: int
    vision: int
    embeddings: int
    lm_head: int
    backbone: int
    text: TextShape
    vision_shape: VisionShape | None
    linear_shapes: tuple[tuple[str, int, int], ...]
    output_layer: str
    lora_exclude: str  # the family's default lora.exclude_modules: its vision tower

    @property
    def matmul_language(self) -> int:
        """Language-model parameters that take part in a matmul per token: all but the input embedding lookup (the
        LM head counts, tied or not)."""
        head = self.lm_head or self.embeddings
        return self.language - self.embeddings + head

    def lora_parameters(self, rank: int, target_modules: str, exclude_modules: str | None) -> int:
        """Adapter parameters of ``worker.actor.model.lora``: ``rank * (in + out)`` for every targeted linear layer.

        Targets as peft reads them: ``all-linear`` is every linear layer but the output layer; a comma-separated list
        matches a module whose name is, or ends with ``.`` +, an entry. ``exclude_modules`` (default: the vision
        tower) is a regex matched against the whole module name.
        """
        if rank <= 0:
            return 0
        exclude = re.compile(exclude_modules or self.lora_exclude)
        names = None if target_modules == "all-linear" else [n.strip() for n in target_modules.split(",") if n.strip()]
        total = 0
        for name, fan_in, fan_out in self.linear_shapes:
            if exclude.fullmatch(name):
                continue
            if names is None:
                chosen = name != self.output_layer
            else:
                chosen = any(name == target or name.endswith("." + target) for target in names)
            if chosen:
                total += rank * (fan_in + fan_out)
        return total


def _text_shape(config: PretrainedConfig) -> TextShape:
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    linear_layers = sum(kind == LINEAR_LAYER_TYPE for kind in layer_types(config))
    linear_state = linear_flops = 0
    if linear_layers:
        value_heads, key_dim = text.linear_num_value_heads, text.linear_key_head_dim
        value_dim = text.linear_value_head_dim
        conv_channels = 2 * text.linear_num_key_heads * key_dim + value_heads * value_dim  # q, k and v convolved
        linear_state = value_heads * key_dim * value_dim + (text.linear_conv_kernel_dim - 1) * conv_channels
        # per token and value head: decay and delta update of the key x value state (4 k v), its read-out (2 k v)
        linear_flops = 6 * value_heads * key_dim * value_dim
    return TextShape(
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab=text.vocab_size,
        linear_layers=linear_layers,
        linear_state=linear_state,
        linear_flops_per_token=linear_flops,
    )


def _vision_shape(config: PretrainedConfig) -> VisionShape | None:
    vision = getattr(config, "vision_config", None)
    if vision is None:
        return None
    # Qwen2-VL calls the tower's width embed_dim (its hidden_size is the merger's output width)
    width = getattr(vision, "embed_dim", None) or vision.hidden_size
    intermediate = getattr(vision, "intermediate_size", None) or int(width * getattr(vision, "mlp_ratio", 4))
    patch = getattr(vision, "patch_size", 14)
    # InternVL gives (height, width) patches and merges by pixel shuffle at the top level's downsample_ratio
    patch = int(patch[0]) if isinstance(patch, (list, tuple)) else int(patch)
    downsample = getattr(config, "downsample_ratio", None)
    merge = getattr(vision, "spatial_merge_size", None) or (round(1 / downsample) if downsample else 2)
    return VisionShape(
        depth=getattr(vision, "depth", None) or vision.num_hidden_layers,
        hidden=width,
        intermediate=intermediate,
        patch_size=patch,
        merge_size=merge,
        temporal_patch_size=getattr(vision, "temporal_patch_size", 2),
    )


def _count(module: nn.Module, exclude: set[int] | None = None) -> int:
    seen = set(exclude or ())
    total = 0
    for parameter in module.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total


def measure_model(config: PretrainedConfig, override: dict[str, Any] | None = None) -> ModelSize:
    """Count the parameters of the model ``config`` describes (``override``: the actor's ``override_config``),
    built on the meta device."""
    if override:
        config = config.__class__.from_dict(config.to_dict())
        apply_config_overrides(config, override)
    model_class = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    with torch.device("meta"):
        model = model_class.from_config(config)
    family = family_of(config)
    # each tower counted once: a module inside the tower whose parent is not
    vision = sum(
        _count(module)
        for name, module in model.named_modules()
        if family.is_vision_module(name) and not family.is_vision_module(name.rpartition(".")[0])
    )
    total = _count(model)
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    untied_head = output is not None and output.weight is not embedding
    output_layer = next((name for name, module in model.named_modules() if module is output), "lm_head")
    backbone_module = getattr(model, "model", None)
    backbone = (
        _count(backbone_module)
        if backbone_module is not None
        else total - (output.weight.numel() if untied_head else 0)
    )
    linears = tuple(
        (name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    )
    return ModelSize(
        total=total,
        language=total - vision,
        vision=vision,
        embeddings=embedding.numel(),
        lm_head=output.weight.numel() if untied_head else 0,
        backbone=backbone,
        text=_text_shape(config),
        vision_shape=_vision_shape(config),
        linear_shapes=linears,
        output_layer=output_layer,
        lora_exclude=family.lora_exclude(),
    )
