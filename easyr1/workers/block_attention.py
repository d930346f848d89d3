"""SDPA over a packed row whose mask is block-diagonal, one block at a time.

A shared-prompt micro-batch (``packing.pack_shared``) lays its prompt groups end to end in one row of T tokens with a
``(1, 1, T, T)`` boolean mask in which no group sees another. A dense scaled-dot-product attention over that row
computes all T x T scores and throws most away: with G groups of equal length only 1/G of them can be unmasked.
Running SDPA on each group's diagonal block gives the same output (every score outside the blocks is masked) for 1/G
of the attention work: on CPU, 4 groups of 8 samples, the update's forward + backward ran 1.44x faster at 15 M
parameters (bench/bench_update.py).

Padding-free rows (``packing.pack``: samples end to end, causal within each) get the same treatment with
:func:`causal_block_mask`, each block run by SDPA's causal kernel without a mask. Since no element of such a mask is
ever read, it is a zero-stride view of one boolean (``VIRTUAL_CAUSAL_MASK``): the ``(1, 1, T, T)`` shape that
transformers passes through unchanged, no T x T memory (at T = 8192, 64 MiB less on every rank, and three times that
while a dense one was built). Its values say nothing (all true); a call that would read them (a query length other
than the keys', as in generation with a cache) is refused instead.

The mask tensor carries its blocks (:func:`mark_blocks`); :func:`install` registers, under transformers' ``"sdpa"``
name, a function that splits such a mask's attention by block and leaves every other call (a mask without blocks,
the vision tower, generation) to transformers' own SDPA. The mask object travels with the layer's inputs, so a
recomputation under activation checkpointing splits the same way.
"""

from __future__ import annotations

from typing import Any

import torch


BLOCKS_ATTRIBUTE = "easyr1_blocks"
CAUSAL_ATTRIBUTE = "easyr1_causal_blocks"
VIRTUAL_ATTRIBUTE = "easyr1_virtual_mask"
# causal_block_mask gives a zero-stride view; False: the dense T x T booleans (bench/ulysses_memory.py --mask dense)
VIRTUAL_CAUSAL_MASK = True


def mark_blocks(mask: torch.Tensor, bounds: list[tuple[int, int]], causal: bool = False) -> torch.Tensor:
    """Tag ``mask`` (``(1, 1, T, T)``, block-diagonal) with its blocks ``[(start, end), ...]``, which tile ``0..T``;
    ``causal``: each block's own mask is plain causal, so SDPA runs it without a mask."""
    if bounds and (bounds[0][0] != 0 or bounds[-1][1] != mask.shape[-1]):
        raise ValueError(f"blocks {bounds[0]}..{bounds[-1]} do not tile a mask of {mask.shape[-1]} tokens")
    setattr(mask, BLOCKS_ATTRIBUTE, list(bounds))
    setattr(mask, CAUSAL_ATTRIBUTE, causal)
    return mask


def causal_block_mask(
    lengths: list[int], device: torch.device | str = "cpu", dense: bool | None = None
) -> torch.Tensor:
    """The ``(1, 1, T, T)`` mask of samples packed end to end (``lengths`` tokens each): causal within a sample,
    nothing across; marked with its blocks. The same mask transformers derives from restarting position ids. Unless
    ``dense`` (default: not ``VIRTUAL_CAUSAL_MASK``), a zero-stride view whose values are never read (the module
    docstring)."""
    bounds, start = [], 0
    for length in lengths:
        bounds.append((start, start + length))
        start += length
    if not (dense if dense is not None else not VIRTUAL_CAUSAL_MASK):
        mask = torch.ones((), dtype=torch.bool, device=device).expand(1, 1, start, start)
        setattr(mask, VIRTUAL_ATTRIBUTE, True)
        return mark_blocks(mask, bounds, causal=True)
    sample = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    causal = torch.ones(start, start, dtype=torch.bool, device=device).tril()
    mask = (causal & (sample.unsqueeze(1) == sample.unsqueeze(0))).view(1, 1, start, start)
    return mark_blocks(mask, bounds, causal=True)


def blockwise_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, heads, T, head_dim)
    key: torch.Tensor,  # (B, kv_heads, T, head_dim)
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA, run on each diagonal block when ``attention_mask`` carries blocks; returns
    ``((B, T, heads, head_dim), None)`` as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = getattr(attention_mask, BLOCKS_ATTRIBUTE, None)
    causal = getattr(attention_mask, CAUSAL_ATTRIBUTE, False)
    if bounds is not None and query.shape[2] != key.shape[2] and getattr(attention_mask, VIRTUAL_ATTRIBUTE, False):
        raise ValueError("a packed row's virtual causal mask cannot serve queries shorter than the keys")
    if bounds is None or (len(bounds) < 2 and not causal) or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if causal:
        kwargs["is_causal"] = True  # SDPA's causal kernel, no mask to read
    outputs = [
        sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            None if causal else attention_mask[..., start:end, start:end],
            **kwargs,
        )[0]
        for start, end in bounds
    ]
    return torch.cat(outputs, dim=1), None


_installed = False


def install() -> None:
    """Register :func:`blockwise_sdpa_forward` as transformers' ``"sdpa"`` attention in this process, once."""
    global _installed
    if not _installed:
        from transformers import AttentionInterface

        AttentionInterface.register("sdpa", blockwise_sdpa_forward)
        _installed = True
