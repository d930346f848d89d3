"""Padding-free micro-batches and token-budget micro-batching.

A micro-batch arrives padded, ``(B, P + R)``: left-padded prompts, right-padded responses. :func:`pack` keeps only
the tokens whose attention mask is 1 and lays the samples end to end in one row ``(1, T)``. Its position ids restart
at 0 for every sample (for Qwen-VL, row 0 of the ``(4, 1, T)`` position ids holds these text positions, rows 1-3
the m-rope ones); given no attention mask, the model builds a block-diagonal causal mask from those restarts, so
no sample attends to another. The logits that predict response token ``k`` of sample ``i`` sit at packed index
``response_index[i, k]``: the model is asked for exactly those (``logits_to_keep``), so the log-prob code gets
the same ``(B, R, V)`` tensor as in the padded path.

:func:`token_budget_groups` forms micro-batches by token count instead of sample count (dynamic batching).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedInputs:
    """One micro-batch packed into a single row."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (4, 1, T) for m-rope models, (1, T) otherwise
    response_index: torch.Tensor  # (B, R): packed index of the logit that predicts each response token


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int):
    """Pack a padded micro-batch; see the module docstring for the layout.

    Shapes: ``input_ids`` / ``attention_mask`` (B, L) with L = P + R, ``position_ids`` (B, 4, L) or (B, L).
    Response slots beyond a sample's length point at that sample's last prompt logit (their values are masked out
    by the response mask downstream, as in the padded path).
    """
    valid = attention_mask.bool()
    lengths = valid.sum(dim=-1)  # (B,)
    starts = torch.cumsum(lengths, dim=0) - lengths  # packed index of each sample's first token
    prompt_lengths = valid[:, :-response_length].sum(dim=-1) if response_length else lengths
    packed_ids = input_ids[valid].unsqueeze(0)  # row-major boolean indexing keeps samples in order
    if position_ids.dim() == 3:  # (B, 4, L) -> (4, 1, T)
        packed_positions = position_ids.transpose(0, 1)[:, valid].unsqueeze(1)
        # row 0 must restart at 0 per sample: that is what tells the model where the samples end
        packed_positions[0, 0] = _restarting_positions(lengths)
    else:
        packed_positions = _restarting_positions(lengths).unsqueeze(0)
    offsets = torch.arange(response_length, device=input_ids.device)
    response_index = (starts + prompt_lengths - 1).unsqueeze(-1) + offsets  # (B, R)
    response_valid = valid[:, -response_length:] if response_length else valid[:, :0]
    response_index = torch.where(response_valid, response_index, (starts + prompt_lengths - 1).unsqueeze(-1))
    return PackedInputs(packed_ids, packed_positions, response_index)


def _restarting_positions(lengths: torch.Tensor) -> torch.Tensor:
    """``[0..l0-1, 0..l1-1, ...]`` for the given lengths, on their device."""
    return torch.cat([torch.arange(int(length), device=lengths.device) for length in lengths.tolist()])


def token_budget_groups(token_counts: list[int], num_groups: int) -> list[list[int]]:
    """Split sample indices into ``num_groups`` groups of near-equal token totals (longest first, to the lightest
    group), each group's indices in ascending order. Callers pick ``num_groups`` as
    ``ceil(total / budget)`` (agreed across ranks, so every rank runs as many forwards)."""
    if not 1 <= num_groups <= len(token_counts):
        raise ValueError(f"cannot split {len(token_counts)} samples into {num_groups} non-empty groups")
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    loads = [0] * num_groups
    order = sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i))
    for position, index in enumerate(order):
        # the first num_groups samples open one group each, so no group stays empty
        target = position if position < num_groups else min(range(num_groups), key=lambda g: (loads[g], g))
        groups[target].append(index)
        loads[target] += token_counts[index]
    return [sorted(group) for group in groups]


def packed_response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    vision_inputs: dict[str, torch.Tensor],
) -> torch.Tensor:
    """(B, R, V) logits predicting the response tokens, from one padding-free forward of the micro-batch."""
    packed = pack(input_ids, attention_mask, position_ids, response_length)
    batch_size = input_ids.shape[0]
    output = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=None,  # the per-sample position restarts define the mask
        use_cache=False,  # with a cache the model ignores the restarts and attends across samples
        logits_to_keep=packed.response_index.reshape(-1),
        **vision_inputs,
    )
    return output.logits.reshape(batch_size, response_length, -1)
