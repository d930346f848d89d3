"""The critic for PPO with GAE: the policy's backbone with a scalar value head, FSDP2-sharded like the actor.

``values[:, t]`` estimates the return from the state just before response token ``t`` (the hidden state of
the position that predicts it), so values line up with the log-probs of the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from easyr1.algorithms import aggregate_loss
from easyr1.algorithms.value_loss import compute_value_loss
from easyr1.distributed import sequence_parallel
from easyr1.models.families import forward_token_types
from easyr1.models.vision_tower import vision_keepalive
from easyr1.protocol import Batch, merge_vision_inputs
from easyr1.workers.actor import forward_inputs
from easyr1.workers.packing import split_inputs
from easyr1.workers.placement import batch_to, to_host
from easyr1.workers.ppo_update import PPOUpdate, consecutive_micro_batches


class ValueModel(nn.Module):
    """A causal (vision-)language model without its LM head, plus ``value_head``: hidden -> 1."""

    def __init__(self, language_model: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = language_model.model  # decoder (and vision tower) without the LM head
        self.config = language_model.config
        hidden_size = getattr(self.config, "text_config", self.config).hidden_size
        self.value_head = nn.Linear(hidden_size, 1, dtype=language_model.dtype)
        # start at V = 0 everywhere: the first advantages are then the plain discounted rewards
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self._no_split_modules = list(getattr(language_model, "_no_split_modules", None) or [])

    def get_input_embeddings(self) -> nn.Module:
        """The backbone's token embeddings (FSDP makes them a unit of their own: ``distributed/fsdp.py``)."""
        return self.backbone.get_input_embeddings()

    def forward(self, **inputs: Any) -> torch.Tensor:
        """(B, L) value of every position."""
        hidden = self.backbone(**inputs, use_cache=False).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def response_values(model: ValueModel, micro_batch: Batch) -> torch.Tensor:
    """(B, R) values of the states that precede each response token."""
    if sequence_parallel.of(model) is not None:
        return _split_values(model, micro_batch)
    response_length = micro_batch["responses"].shape[-1]
    # the token types its family computes from the ids (Gemma 3's bidirectional image blocks)
    inputs = {**forward_inputs(micro_batch), **forward_token_types(model.backbone, micro_batch["input_ids"])}
    # before the forward: see models/vision_tower.py; on the inputs' device, which FSDP CPU offload does not share
    keepalive = vision_keepalive(model, model.backbone, inputs, device=micro_batch["responses"].device)
    values = model(**inputs)[:, -response_length - 1 : -1].float()
    return values if keepalive is None else values + keepalive


def _split_values(model: ValueModel, micro_batch: Batch) -> torch.Tensor:
    """:func:`response_values` under sequence parallelism (``distributed/sequence_parallel.py``): the micro-batch
    packed padding-free, this rank's slice through the backbone, the value head at its response positions, the
    values summed across the group into the whole (B, R)."""
    responses = micro_batch["responses"]
    ids, mask, positions = micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"]
    vision = merge_vision_inputs(micro_batch["multi_modal_inputs"]) if "multi_modal_inputs" in micro_batch else {}
    keepalive = vision_keepalive(model, model.backbone, vision, device=responses.device)
    split = split_inputs(model, ids, mask, positions, responses.shape[-1])
    slice_values = model(
        input_ids=split.input_ids, position_ids=split.position_ids, attention_mask=split.attention_mask, **vision
    )
    values = slice_values[0, split.keep].float()
    if keepalive is not None:
        values = values + keepalive
    return sequence_parallel.combine_owned(values, split.owned, tuple(responses.shape), sequence_parallel.of(model))


class Critic:
    """The sharded value model, its optimizer and LR schedule, and the clipped value-loss update."""

    def __init__(
        self,
        model: ValueModel,
        config: Any,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str = "cpu",
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.model = model
        # the worker's device: each micro-batch is moved here before its forward; values go back to the host
        self.device = torch.device(device)
        self.config = config
        self.optimizer = optimizer
        # stepped once per update call by the worker (worker.critic.optim's warm-up and decay)
        self.lr_scheduler = lr_scheduler

    @torch.no_grad()
    def compute_values(self, batch: Batch, micro_batch_size: int) -> torch.Tensor:
        """(B, R) values of the rollout's response states (masked to 0 outside the response)."""
        self.model.eval()
        group = sequence_parallel.of(self.model)
        # sequence parallelism: the group's members score their pooled shares together, each keeps its own rows
        pooled, own_rows = group.gather_rows(batch) if group is not None else (batch, None)
        parts = [
            to_host(response_values(self.model, batch_to(micro, self.device)))
            for micro in pooled.split(max(micro_batch_size, 1))
        ]
        values = torch.cat(parts)
        return (values if own_rows is None else values[own_rows]) * batch["response_mask"]

    def update(self, batch: Batch, mini_batch_size: int) -> dict[str, float]:
        """PPO epochs of clipped value regression towards ``returns``; needs ``values`` (old) and ``returns``."""
        config = self.config
        group = sequence_parallel.of(self.model)
        size = group.size if group is not None else 1
        loop = PPOUpdate(
            self.model,
            self.optimizer,
            config.max_grad_norm,
            self.device,
            consecutive_micro_batches(config.micro_batch_size_per_device_for_update),
            "critic/grad_norm",
            sequence_parallel_size=size,
        )
        if group is not None:  # a sequence-parallel group's mini-batches hold every member's share
            batch, _ = group.gather_rows(batch)
        return loop.run(batch, mini_batch_size * size, config.ppo_epochs, self._micro_loss)

    def _micro_loss(
        self, rows: list[int], micro: Batch, norm: dict[str, float], sums: dict[str, float]
    ) -> torch.Tensor:
        """A micro-batch's clipped value loss, with its share of the value metrics added to ``sums``."""
        micro_mask = micro["response_mask"]
        values = response_values(self.model, micro)
        loss_mat, metrics = compute_value_loss(
            values, micro["values"], micro["returns"], micro_mask, self.config.cliprange_value
        )
        loss = aggregate_loss(loss_mat, micro_mask, "token-mean", **norm)
        sums["critic/vf_loss"] += loss.item()
        weight = micro_mask.sum().item() / max(norm["num_global_tokens"] / norm["world_size"], 1.0)
        for key, value in metrics.items():
            sums[f"critic/{key}"] += value * weight
        return loss
