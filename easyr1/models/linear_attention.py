"""Packed (padding-free) rows through linear-attention layers: every packed sample starts from a fresh state.

A linear-attention layer (Qwen3.5's GatedDeltaNet) carries a recurrent state and a short causal convolution along
the row. In a packed row (``workers/packing.py``: samples end to end, positions restarting at 0 for each) both must
restart at every sample, or the state left by one sample flows into the next. Full-attention layers learn the
boundaries from the restarting positions (a block-diagonal mask); transformers' GatedDeltaNet takes them only as
``cu_seq_lens_q``, and only its fla / causal-conv1d kernels read them: the torch fallback that runs on CPU, and on
GPU wherever those kernels are not installed, drops them without a word (a 5.6e-2 logit error on the tiny model).

:func:`install` fixes this from outside the model code: on each decoder layer that holds a linear-attention module
(``linear_attn``) a forward pre-hook reads the layer's text position ids, finds the packed samples by the rule
transformers uses for full attention (a position that is not the previous one plus one starts a sample), and hands
their lengths to the linear-attention module, whose forward is wrapped to run once per sample with no carried state.
The lengths travel as a keyword argument of the layer's call, so a recomputation under activation checkpointing
splits the same way. Rows that are not packed (batch > 1, one sample, a cache: generation) go through unchanged.
Running per sample costs one small forward per sample and layer; fla's variable-length kernels would do it in one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


LINEAR_LAYER_TYPE = "linear_attention"
SEGMENTS_KWARG = "easyr1_packed_lengths"  # the layer's call carries the packed samples' lengths under this name
_WRAPPED = "_easyr1_segmented"  # set on every linear-attention module whose forward is wrapped
_LENGTHS_ATTRIBUTE = "_easyr1_packed_lengths"  # on a position tensor: its packed lengths, found by the first layer


def layer_types(config: Any) -> list[str]:
    """The decoder's layer types (``layer_types`` of the text config, or of the config itself); ``[]`` if unset.

    ``config``: a transformers config or its ``config.json`` as a dict."""

    def read(source: Any, key: str) -> Any:
        return source.get(key) if isinstance(source, Mapping) else getattr(source, key, None)

    text = read(config, "text_config")
    types = (read(text, "layer_types") if text is not None else None) or read(config, "layer_types")
    return list(types or [])


def has_linear_attention(config: Any) -> bool:
    """Whether any decoder layer of the model is a linear-attention (recurrent-state) layer."""
    return LINEAR_LAYER_TYPE in layer_types(config)


def packed_lengths(position_ids: torch.Tensor | None) -> list[int] | None:
    """Lengths of the samples packed in a one-row batch of text positions ``(1, T)``; ``None`` when there is no
    such row or it holds one sample. A sample starts wherever a position is not the previous one plus one."""
    if position_ids is None or position_ids.ndim != 2 or position_ids.shape[0] != 1 or position_ids.shape[1] < 2:
        return None
    row = position_ids[0]
    starts = torch.nonzero(row[1:] - row[:-1] != 1).squeeze(-1) + 1
    if starts.numel() == 0:
        return None
    bounds = [0, *starts.tolist(), row.shape[0]]
    return [end - start for start, end in zip(bounds[:-1], bounds[1:])]


def _pass_lengths(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Decoder layer pre-hook: the packed samples' lengths into the call's keyword arguments, which the layer
    hands on to its linear-attention module."""
    if kwargs.get("past_key_values") is not None:
        return None  # generation: a cache carries the state on purpose
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        return None
    # every layer of one forward gets the same position tensor: find the lengths once (one device sync, not one
    # per layer) and keep them on the tensor
    lengths = getattr(position_ids, _LENGTHS_ATTRIBUTE, False)
    if lengths is False:
        lengths = packed_lengths(position_ids)
        setattr(position_ids, _LENGTHS_ATTRIBUTE, lengths)
    if lengths is None:
        return None
    return args, {**kwargs, SEGMENTS_KWARG: lengths}


def _segmented_forward(original: Any) -> Any:
    """``original`` (a linear-attention module's bound forward), run once per packed sample when given lengths."""

    def forward(
        hidden_states: torch.Tensor,
        cache_params: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        lengths = kwargs.pop(SEGMENTS_KWARG, None)
        if lengths is None or cache_params is not None or hidden_states.shape[0] != 1:
            return original(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
        outputs, start = [], 0
        for length in lengths:
            end = start + length
            mask = attention_mask[:, start:end] if attention_mask is not None else None
            # no cache: each sample's convolution and recurrent state start from zero, as when it runs alone
            outputs.append(original(hidden_states[:, start:end], cache_params=None, attention_mask=mask, **kwargs))
            start = end
        return torch.cat(outputs, dim=1)

    return forward


def install(model: nn.Module) -> int:
    """Make every linear-attention layer of ``model`` restart its state at each packed sample (see the module
    docstring); idempotent. Returns the number of layers it applies to (0 for models without such layers)."""
    count = 0
    for layer in model.modules():
        linear = getattr(layer, "linear_attn", None)
        if not isinstance(linear, nn.Module):
            continue
        count += 1
        if getattr(linear, _WRAPPED, False):
            continue
        layer.register_forward_pre_hook(_pass_lengths, with_kwargs=True)
        linear.forward = _segmented_forward(linear.forward)
        setattr(linear, _WRAPPED, True)
    return count
