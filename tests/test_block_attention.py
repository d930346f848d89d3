"""Block-wise SDPA for shared-prompt rows (easyr1/workers/block_attention.py) against transformers' dense SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from easyr1.workers.block_attention import blockwise_sdpa_forward, causal_block_mask, mark_blocks
from easyr1.workers.packing import pack_shared, prompt_groups


def _shared_row() -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The mask and group blocks of a micro-batch of 5 rows in 2 prompt groups (prompts of 3 and 2 tokens)."""
    input_ids = torch.tensor(
        [[0, 5, 6, 7, 8, 9], [0, 5, 6, 7, 3, 0], [0, 0, 1, 2, 4, 4], [0, 5, 6, 7, 2, 2], [0, 0, 1, 2, 5, 0]]
    )
    attention_mask = (input_ids != 0).long()
    attention_mask[:, 4:] = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 0]])
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    groups = prompt_groups(input_ids, attention_mask, 2)
    packed = pack_shared(input_ids, attention_mask, positions, 2, groups)
    return packed.attention_mask, packed.group_bounds


def _qkv(tokens: int, heads: int = 4, kv_heads: int = 2, dim: int = 8) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, heads, tokens, dim, generator=generator, requires_grad=True)
    key = torch.randn(1, kv_heads, tokens, dim, generator=generator, requires_grad=True)
    value = torch.randn(1, kv_heads, tokens, dim, generator=generator, requires_grad=True)
    return query, key, value


def test_blockwise_sdpa_equals_dense_sdpa_on_a_shared_prompt_mask():
    mask, bounds = _shared_row()
    assert bounds == [(0, 8), (8, 13)]  # group 0: prompt 3 + responses 2, 1, 2; group 1: prompt 2 + responses 2, 1
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)  # a GQA layer, as Qwen's
    query, key, value = _qkv(mask.shape[-1])
    dense, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    dense_grads = torch.autograd.grad(dense.square().sum(), (query, key, value))
    blockwise, _ = blockwise_sdpa_forward(module, query, key, value, mark_blocks(mask, bounds), scaling=0.3)
    blockwise_grads = torch.autograd.grad(blockwise.square().sum(), (query, key, value))
    assert blockwise.shape == dense.shape == (1, mask.shape[-1], 4, 8)
    torch.testing.assert_close(blockwise, dense, atol=1e-6, rtol=1e-5)
    for got, want in zip(blockwise_grads, dense_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_only_the_marked_blocks_are_computed():
    """A mask that lets group 1 see group 0 differs between the two: the block-wise forward never looks outside the
    blocks (which is why pack_shared's masks must be block-diagonal), and an unmarked mask takes the dense path."""
    mask, bounds = _shared_row()
    leaky = mask.clone()
    leaky[..., 8:, :8] = True
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    query, key, value = _qkv(mask.shape[-1])
    dense, _ = sdpa_attention_forward(module, query, key, value, leaky)
    unmarked, _ = blockwise_sdpa_forward(module, query, key, value, leaky)
    blockwise, _ = blockwise_sdpa_forward(module, query, key, value, mark_blocks(leaky.clone(), bounds))
    torch.testing.assert_close(unmarked, dense)
    torch.testing.assert_close(blockwise[:, :8], dense[:, :8])  # group 0 saw nothing else either way
    assert not torch.allclose(blockwise[:, 8:], dense[:, 8:], atol=1e-3)


def test_blocks_must_tile_the_row():
    mask, _ = _shared_row()
    with pytest.raises(ValueError, match="do not tile"):
        mark_blocks(mask, [(0, 8), (8, 12)])


def test_padding_free_rows_run_each_sample_causally():
    """The dense mask is the per-sample causal one; the block-wise forward over the virtual mask (no T x T memory,
    its values never read) gives dense SDPA's outputs and gradients on it."""
    dense_mask = causal_block_mask([3, 1, 2], dense=True)
    mask = causal_block_mask([3, 1, 2])
    assert mask.shape == dense_mask.shape and mask.stride() == (0, 0, 0, 0) and mask.untyped_storage().nbytes() == 1
    assert dense_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    query, key, value = _qkv(6)
    dense, _ = sdpa_attention_forward(module, query, key, value, dense_mask.clone())  # a copy: no blocks attached
    dense_grads = torch.autograd.grad(dense.square().sum(), (query, key, value))
    blockwise, _ = blockwise_sdpa_forward(module, query, key, value, mask)
    blockwise_grads = torch.autograd.grad(blockwise.square().sum(), (query, key, value))
    torch.testing.assert_close(blockwise, dense, atol=1e-6, rtol=1e-5)
    for got, want in zip(blockwise_grads, dense_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_virtual_mask_of_one_sample_runs_causally_and_is_never_read_by_other_calls():
    """One packed sample (one block) still runs SDPA's causal kernel, not the mask's (meaningless) values; a query
    shorter than the keys would read them, and is refused."""
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    query, key, value = _qkv(5)
    want, _ = sdpa_attention_forward(module, query, key, value, causal_block_mask([5], dense=True).clone())
    got, _ = blockwise_sdpa_forward(module, query, key, value, causal_block_mask([5]))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="virtual causal mask"):
        blockwise_sdpa_forward(module, query[:, :, -1:], key, value, causal_block_mask([5]))
