"""Padding-free micro-batches and token-budget micro-batching.

A micro-batch arrives padded, ``(B, P + R)``: left-padded prompts, right-padded responses. :func:`pack` keeps only
the tokens whose attention mask is 1 and lays the samples end to end in one row ``(1, T)``. Its position ids restart
at 0 for every sample (for Qwen-VL, row 0 of the ``(4, 1, T)`` position ids holds these text positions, rows 1-3
the m-rope ones); given no attention mask, the model builds a block-diagonal causal mask from those restarts, so
no sample attends to another. The logits that predict response token ``k`` of sample ``i`` sit at packed index
``response_index[i, k]``: the model is asked for exactly those (``logits_to_keep``), so the log-prob code gets
the same ``(B, R, V)`` tensor as in the padded path. Linear-attention layers (Qwen3.5's GatedDeltaNet) carry a
state along the row instead of a mask: :func:`packed_response_logits` makes them restart it at every sample
(:mod:`easyr1.models.linear_attention`).

:func:`pack_shared` goes further for GRPO-style batches, where each prompt has n samples: rows of a micro-batch whose
prompt is identical (:func:`prompt_groups`: same valid prompt ids, same vision inputs) are laid out as the prompt's
tokens once, then each response's tokens. Each response attends to its group's prompt and causally to its own earlier
tokens only, through an explicit ``(1, 1, T, T)`` boolean mask; its positions are its own row's, so they continue from
the prompt's. The prompt (and its images) then runs through the model once per group instead of once per sample, and
the result is the same as packing every row on its own: the gradient reaching the shared prompt is the sum of what
each response sends back.

:func:`token_budget_groups` forms micro-batches by token count instead of sample count (dynamic batching);
:func:`prompt_group_units` keeps a prompt's samples in one micro-batch there when prompts are shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from easyr1.distributed import sequence_parallel
from easyr1.models import linear_attention
from easyr1.models.families import family_of, forward_token_types
from easyr1.workers import block_attention


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


@dataclass
class SharedPackedInputs:
    """One micro-batch packed into a single row, each group's prompt once (see :func:`pack_shared`)."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (4, 1, T) for m-rope models, (1, T) otherwise
    attention_mask: torch.Tensor  # (1, 1, T, T) boolean: True where the query (row) may attend to the key (column)
    response_index: torch.Tensor  # (B, R): packed index of the logit that predicts each response token
    representatives: list[int]  # per group, the row whose prompt (and vision inputs) the packed row carries
    group_bounds: list[tuple[int, int]]  # per group, its [start, end) in the packed row: the mask's diagonal blocks


def _same_vision(first: dict[str, torch.Tensor] | None, second: dict[str, torch.Tensor] | None) -> bool:
    # The n samples of a prompt hold the very same objects (a batch repeats a row by reference, and one pickled
    # message keeps them shared), so identity settles most pairs without comparing pixels.
    if first is second:
        return True
    first, second = first or {}, second or {}
    if first.keys() != second.keys():
        return False
    return all(
        first[key] is second[key]
        or (
            first[key].shape == second[key].shape
            and first[key].dtype == second[key].dtype
            and torch.equal(first[key], second[key])
        )
        for key in first
    )


def prompt_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    vision_rows: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> list[list[int]]:
    """Row indices grouped by identical prompt, groups in order of their first row, rows ascending within a group.

    Two rows share a prompt when their valid prompt token ids are equal (left padding may differ) and their vision
    inputs (``multi_modal_inputs`` of each row: same keys, equal tensors) are equal. ``vision_rows`` ``None`` means
    text only.
    """
    prompt_length = input_ids.shape[-1] - response_length
    prompt_valid = attention_mask[:, :prompt_length].bool()
    groups: list[list[int]] = []
    by_ids: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> indices into groups
    for row in range(input_ids.shape[0]):
        key = tuple(input_ids[row, :prompt_length][prompt_valid[row]].tolist())
        vision = vision_rows[row] if vision_rows is not None else None
        for group_index in by_ids.setdefault(key, []):
            first = groups[group_index][0]
            if _same_vision(vision_rows[first] if vision_rows is not None else None, vision):
                groups[group_index].append(row)
                break
        else:
            by_ids[key].append(len(groups))
            groups.append([row])
    return groups


def pack_shared(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    groups: list[list[int]],
) -> SharedPackedInputs:
    """Pack a padded micro-batch with each group's prompt once; see the module docstring for the layout.

    Shapes as in :func:`pack`; ``groups`` from :func:`prompt_groups` (every row in exactly one group). All four
    position rows are taken from the rows themselves: the group's first row for the prompt, each row for its
    response. Response slots beyond a sample's length point at its group's last prompt logit (masked downstream).
    """
    if response_length < 1:
        raise ValueError(f"prompt sharing needs responses, got response_length={response_length}")
    device = input_ids.device
    prompt_length = input_ids.shape[-1] - response_length
    valid = attention_mask.bool()
    batch_size = input_ids.shape[0]
    columns: list[torch.Tensor] = []  # per segment: the (row, column) source of each packed token
    source_rows: list[torch.Tensor] = []
    segment_of_token: list[torch.Tensor] = []  # per token: its segment id (every prompt and response one segment)
    group_of_token: list[torch.Tensor] = []
    prompt_segments: list[int] = []
    response_index = torch.zeros(batch_size, response_length, dtype=torch.long, device=device)
    offsets = torch.arange(response_length, device=device)
    cursor, segment = 0, 0
    group_bounds: list[tuple[int, int]] = []
    for group_index, rows in enumerate(groups):
        group_start = cursor
        first = rows[0]
        prompt_columns = torch.nonzero(valid[first, :prompt_length]).squeeze(-1)
        if prompt_columns.numel() == 0:
            raise ValueError(f"row {first} has an empty prompt; prompt sharing needs at least one prompt token")
        last_prompt = cursor + prompt_columns.numel() - 1
        spans = [(first, prompt_columns)]
        prompt_segments.append(segment)
        for row in rows:
            response_columns = prompt_length + torch.nonzero(valid[row, prompt_length:]).squeeze(-1)
            start = last_prompt + 1 + sum(span.numel() for _, span in spans[1:])
            # the logit before response token k: the prompt's last for k = 0, else the row's own token k - 1
            index = torch.where(offsets == 0, last_prompt, start + offsets - 1)
            response_index[row] = torch.where(valid[row, prompt_length:], index, last_prompt)
            spans.append((row, response_columns))
        for row, span_columns in spans:
            columns.append(span_columns)
            source_rows.append(torch.full_like(span_columns, row))
            segment_of_token.append(torch.full_like(span_columns, segment))
            group_of_token.append(torch.full_like(span_columns, group_index))
            cursor += span_columns.numel()
            segment += 1
        group_bounds.append((group_start, cursor))
    column = torch.cat(columns)
    source = torch.cat(source_rows)
    segments = torch.cat(segment_of_token)
    token_groups = torch.cat(group_of_token)
    packed_ids = input_ids[source, column].unsqueeze(0)
    if position_ids.dim() == 3:  # (B, 4, L) -> (4, 1, T)
        packed_positions = position_ids[source, :, column].transpose(0, 1).unsqueeze(1).contiguous()
    else:
        packed_positions = position_ids[source, column].unsqueeze(0)
    is_prompt = torch.isin(segments, torch.tensor(prompt_segments, device=device))
    total = column.numel()
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
    same_group = token_groups.unsqueeze(1) == token_groups.unsqueeze(0)
    # a key is visible to a query of its group when it is the group's prompt or the query's own segment
    visible_segment = is_prompt.unsqueeze(0) | (segments.unsqueeze(1) == segments.unsqueeze(0))
    mask = (causal & same_group & visible_segment).view(1, 1, total, total)
    representatives = [rows[0] for rows in groups]
    return SharedPackedInputs(packed_ids, packed_positions, mask, response_index, representatives, group_bounds)


def shared_token_count(attention_mask: torch.Tensor, response_length: int, groups: list[list[int]]) -> int:
    """Tokens a :func:`pack_shared` row holds: each group's prompt once plus every response."""
    prompt_length = attention_mask.shape[-1] - response_length
    prompts = sum(int(attention_mask[rows[0], :prompt_length].sum()) for rows in groups)
    return prompts + int(attention_mask[:, prompt_length:].sum())


def prompt_group_units(groups: list[list[int]], token_counts: list[int], min_units: int) -> list[list[int]]:
    """Units for token-budget micro-batching that keep each prompt group whole where ``min_units`` allows.

    Groups are the units; while there are fewer than ``min_units`` (every micro-batch needs one), the heaviest unit
    is halved. Returns the units (row indices), for :func:`token_budget_groups` over their token sums.
    """
    units = [list(rows) for rows in groups]
    while len(units) < min_units:
        splittable = [i for i, unit in enumerate(units) if len(unit) > 1]
        if not splittable:
            break
        heaviest = max(splittable, key=lambda i: (sum(token_counts[row] for row in units[i]), -i))
        unit = units.pop(heaviest)
        half = len(unit) // 2
        units[heaviest:heaviest] = [unit[:half], unit[half:]]
    return units


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
    segment_linear_attention(model)  # recurrent layers see the restarts too, not only attention (its docstring)
    # token types of the packed ids (Gemma 3: image blocks attend bidirectionally); response tokens get none
    token_types = forward_token_types(model, packed.input_ids)
    mask = None  # the per-sample position restarts define the mask (flash attention: variable-length sequences)
    # A family that builds its masks itself (image blocks, sliding windows) gets none of ours, even with its image
    # blocks run causally: an explicit mask would replace them. It derives the same per-sample blocks from the
    # restarting positions.
    builds_own_masks = family_of(model.config).token_types is not None
    if not builds_own_masks and getattr(model.config, "_attn_implementation", "sdpa") == "sdpa":
        # the same mask, made here so that SDPA attends within each sample only (block_attention.py)
        block_attention.install()
        mask = block_attention.causal_block_mask(attention_mask.sum(dim=-1).tolist(), input_ids.device)
    output = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=mask,
        use_cache=False,  # with a cache the model ignores the restarts and attends across samples
        logits_to_keep=packed.response_index.reshape(-1),
        **vision_inputs,
        **token_types,
    )
    return output.logits.reshape(batch_size, response_length, -1)


def segment_linear_attention(model: torch.nn.Module) -> None:
    """:func:`easyr1.models.linear_attention.install` on ``model``, once: its linear-attention layers (Qwen3.5's
    GatedDeltaNet) then start every packed sample with a fresh state, as the block-diagonal mask does for attention."""
    if not getattr(model, _LINEAR_SEGMENTED, False):
        linear_attention.install(model)
        setattr(model, _LINEAR_SEGMENTED, True)


_LINEAR_SEGMENTED = "_easyr1_linear_attention_segmented"


def shared_response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    vision_rows: Sequence[dict[str, torch.Tensor] | None] | None,
    merge_vision: Any,
    groups: list[list[int]] | None = None,
) -> torch.Tensor:
    """(B, R, V) logits predicting the response tokens, from one forward with each group's prompt once.

    ``vision_rows``: each row's vision inputs (``None`` for text only); ``merge_vision`` concatenates a list of them
    into the model's keyword arguments. Only the groups' first rows' vision inputs are given to the model, so each
    image is encoded once per group. Needs an attention implementation that honours a custom 4D mask (sdpa, eager)
    and no linear-attention layer (their state ignores the mask: ``actor.shares_prompts`` refuses them).
    """
    if groups is None:
        groups = prompt_groups(input_ids, attention_mask, response_length, vision_rows)
    packed = pack_shared(input_ids, attention_mask, position_ids, response_length, groups)
    vision = merge_vision([vision_rows[row] for row in packed.representatives]) if vision_rows is not None else {}
    mask = packed.attention_mask
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":
        # eager attention adds the mask to the scores: it needs the additive form
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    else:  # SDPA attends within each group's block only: no group sees another (block_attention.py)
        block_attention.install()
        block_attention.mark_blocks(mask, packed.group_bounds)
    output = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=mask,
        use_cache=False,
        logits_to_keep=packed.response_index.reshape(-1),
        **vision,
    )
    return output.logits.reshape(input_ids.shape[0], response_length, -1)


@dataclass
class SplitInputs:
    """One rank's share of a packed micro-batch under sequence parallelism (:func:`split_inputs`)."""

    input_ids: torch.Tensor  # (1, T): the whole packed row, T a multiple of the group size
    position_ids: torch.Tensor  # (4, 1, T) or (1, T)
    attention_mask: torch.Tensor | None  # (1, 1, T, T) marked with its blocks (SDPA), None (flash attention)
    keep: torch.Tensor  # (K,): positions inside this rank's slice whose outputs it computes
    owned: torch.Tensor  # (B * R,) boolean: the response slots (row-major) predicted from this rank's slice


def _pad_row(ids: torch.Tensor, positions: torch.Tensor, padding: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``padding`` tokens appended to a packed row: the row's last token repeated (a response token, never a vision
    placeholder), positions restarting at 0 (a sample of their own, attending to nothing before it)."""
    extra_ids = ids[:, -1:].expand(1, padding)
    extra = torch.arange(padding, device=ids.device, dtype=positions.dtype)
    if positions.dim() == 3:  # (rows, 1, T): every row restarts
        extra_positions = extra.view(1, 1, padding).expand(positions.shape[0], 1, padding)
    else:
        extra_positions = extra.view(1, padding)
    return torch.cat([ids, extra_ids], dim=1), torch.cat([positions, extra_positions], dim=-1)


def _padded_block_mask(mask: torch.Tensor, bounds: list[tuple[int, int]], padding: int) -> torch.Tensor:
    """A shared-prompt mask grown by a causal block of ``padding`` tokens, marked with its blocks."""
    total = mask.shape[-1]
    grown = torch.zeros(1, 1, total + padding, total + padding, dtype=torch.bool, device=mask.device)
    grown[..., :total, :total] = mask
    grown[..., total:, total:] = torch.ones(padding, padding, dtype=torch.bool, device=mask.device).tril()
    return block_attention.mark_blocks(grown, [*bounds, (total, total + padding)])


def split_inputs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    groups: list[list[int]] | None = None,
) -> SplitInputs:
    """A micro-batch packed for a sequence-parallel forward (``distributed/sequence_parallel.py``).

    Packed as :func:`packed_response_logits` packs it (or, given prompt ``groups``, as :func:`shared_response_logits`
    does), then padded to a multiple of the group size with a sample of its own. ``keep`` lists the response
    positions inside this rank's slice, relative to its start; a rank that owns none keeps one spare position (the
    slice's first), discarded by ``owned``, so that the head after the decoder gets a (zero) gradient on every rank.
    """
    group = sequence_parallel.of(model)
    assert group is not None, "split_inputs needs a model installed for sequence parallelism"
    if groups is not None:
        packed = pack_shared(input_ids, attention_mask, position_ids, response_length, groups)
        ids, positions, mask = packed.input_ids, packed.position_ids, packed.attention_mask
        padding = sequence_parallel.padding_for(ids.shape[1], group)
        if padding:
            mask = _padded_block_mask(mask, packed.group_bounds, padding)
        else:
            block_attention.mark_blocks(mask, packed.group_bounds)
    else:
        packed = pack(input_ids, attention_mask, position_ids, response_length)
        ids, positions = packed.input_ids, packed.position_ids
        padding = sequence_parallel.padding_for(ids.shape[1], group)
        mask = None  # flash attention: the restarting positions delimit the samples
        if getattr(model.config, "_attn_implementation", "sdpa") == "sdpa":
            lengths = attention_mask.sum(dim=-1).tolist() + ([padding] if padding else [])
            mask = block_attention.causal_block_mask(lengths, input_ids.device)
    if padding:
        ids, positions = _pad_row(ids, positions, padding)
    block_attention.install()
    start, end = group.bounds(ids.shape[1])
    response_index = packed.response_index.reshape(-1)
    owned = (response_index >= start) & (response_index < end)
    keep = response_index[owned] - start
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=keep.dtype, device=keep.device)
    return SplitInputs(ids, positions, mask, keep, owned)


def split_response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    vision_inputs: dict[str, torch.Tensor],
    groups: list[list[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's response logits under sequence parallelism: ``(K, V)`` logits at :func:`split_inputs`' ``keep``
    positions, and its ``owned`` mask. With prompt ``groups``, ``vision_inputs`` are the groups' first rows' merged
    inputs (as :func:`shared_response_logits` gives them)."""
    split = split_inputs(model, input_ids, attention_mask, position_ids, response_length, groups)
    output = model(
        input_ids=split.input_ids,
        position_ids=split.position_ids,
        attention_mask=split.attention_mask,
        use_cache=False,
        logits_to_keep=split.keep,
        **vision_inputs,
    )
    return output.logits.reshape(split.keep.numel(), -1), split.owned
