"""Mixture-of-experts models: the router's load-balancing (auxiliary) loss.

A mixture-of-experts layer sends each token to the top k of its E experts. Trained on the policy loss alone,
nothing keeps the router from sending most tokens to a few experts; the Switch-Transformer loss the MoE families
define (transformers' ``load_balancing_loss_func``) pushes towards an even load:

    loss = E * sum_e f_e * P_e,

with ``f_e`` the fraction of (token, choice) slots that went to expert e and ``P_e`` the mean router probability
of expert e, both over every MoE layer's valid tokens. Only ``P`` carries a gradient (into the router weights and,
through the router's input, everything below it). EasyR1 trains without it (it has no such key) and NeMo-RL turned
transformers' default of 1e-3 off in its Qwen3.5-MoE GRPO recipes after it hurt accuracy (NVIDIA-NeMo/RL#3169), so
it is off unless ``worker.actor.model.router_aux_loss_coef`` is set. The router logits are recorded with forward hooks
on the router modules transformers itself records (``_can_record_outputs["router_logits"]``), so the padded, the
padding-free and the shared-prompt forwards all give them without changing how the model is called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def router_recorder(model: nn.Module) -> Any | None:
    """transformers' ``OutputRecorder`` of the router logits of ``model`` (wrapped or not), ``None`` for a model
    without routers."""
    for module in model.modules():
        recorders = getattr(module, "_can_record_outputs", None) or {}
        if "router_logits" in recorders:
            return recorders["router_logits"]
    return None


def moe_settings(model: nn.Module) -> tuple[int, int]:
    """(experts, experts per token) of ``model``'s mixture-of-experts layers."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_experts), int(text.num_experts_per_tok)


@contextmanager
def recorded_router_logits(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """A list that collects, for every forward inside the block, each MoE layer's ``(tokens, experts)`` router
    logits (in layer order). The hooks are gone when the block ends, before the backward pass: a recompute under
    gradient checkpointing does not record again."""
    recorder = router_recorder(model)
    if recorder is None:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router to record")
    logits: list[torch.Tensor] = []
    index = recorder.index if recorder.index is not None else 0

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        logits.append(output[index] if isinstance(output, tuple | list) else output)

    handles = []
    for name, module in model.named_modules():
        if isinstance(module, recorder.target_class) and (
            recorder.layer_name is None or name.endswith(recorder.layer_name)
        ):
            handles.append(module.register_forward_hook(record))
    try:
        yield logits
    finally:
        for handle in handles:
            handle.remove()


def load_balancing_loss(
    router_logits: list[torch.Tensor],
    num_experts: int,
    top_k: int,
    token_mask: torch.Tensor | None = None,
    group_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The Switch-Transformer load-balancing loss over every layer's router logits (see the module docstring).

    ``token_mask``: the forward's ``attention_mask`` when the logits have one row per entry of it (a padded
    batch: padding does not count); a padding-free or shared-prompt forward has valid tokens only, so any other
    row count counts every row. ``group_sum``: under sequence parallelism each rank's logits are its slice of the
    row (``token_mask`` then masks the padding of the split); the counts and probability sums are summed over the
    group before the loss (``distributed/sequence_parallel.group_sum``), so every rank computes the whole row's.
    """
    counts = torch.zeros(num_experts, dtype=torch.float32, device=router_logits[0].device)
    probability_sums = torch.zeros_like(counts)
    rows = torch.zeros((), dtype=torch.float32, device=counts.device)
    for logits in router_logits:
        probabilities = torch.softmax(logits.float(), dim=-1)
        weights = torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
        if token_mask is not None and token_mask.numel() == logits.shape[0]:
            weights = token_mask.reshape(-1).to(device=logits.device, dtype=torch.float32)
        chosen = torch.topk(probabilities, top_k, dim=-1).indices
        counts = counts.index_add(0, chosen.reshape(-1), weights.repeat_interleave(top_k))
        probability_sums = probability_sums + (probabilities * weights[:, None]).sum(dim=0)
        rows = rows + weights.sum()
    if group_sum is not None:
        counts, probability_sums, rows = (group_sum(value) for value in (counts, probability_sums, rows))
    return num_experts * torch.sum((counts / rows) * (probability_sums / rows))
