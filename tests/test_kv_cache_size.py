"""The CPU KV cache is sized for the work (keys and values of every layer for one engine's rows, not a fixed GiB), in
blocks vLLM's CPU attention takes."""

from __future__ import annotations

import pytest
import torch
from helpers import demo_config

from easyr1.engines.vllm_engine import cpu_kv_cache_bytes
from easyr1.models.loading import load_model_config


def test_bytes_follow_layers_heads_rows_and_dtype(tiny_qwen2_5_vl_dir):
    text = load_model_config(str(tiny_qwen2_5_vl_dir)).text_config
    head_dim = text.hidden_size // text.num_attention_heads
    per_token_fp32 = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * 4
    rows, length = 512, 384
    size = cpu_kv_cache_bytes(text, rows, length, torch.float32)
    assert size >= rows * length * per_token_fp32  # every row can hold max_model_len tokens at once
    assert size <= 2 * rows * (length + 128) * per_token_fp32
    assert cpu_kv_cache_bytes(text, 2 * rows, length, torch.float32) == 2 * size
    assert cpu_kv_cache_bytes(text, rows, length, torch.bfloat16) == size // 2
    # a handful of short rows still gets a usable minimum
    assert cpu_kv_cache_bytes(text, 1, 16, torch.float32) == 32 * 2**20


def test_config_default_is_sized_and_an_explicit_size_is_kept(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    assert demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir).worker.rollout.cpu_kv_cache_gb is None
    explicit = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.cpu_kv_cache_gb=0.25")
    assert explicit.worker.rollout.cpu_kv_cache_gb == 0.25


def test_a_non_positive_size_is_refused(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    from easyr1.errors import ConfigError

    with pytest.raises(ConfigError, match="cpu_kv_cache_gb"):
        demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.cpu_kv_cache_gb=0")


def test_cpu_block_size_must_suit_vllms_cpu_attention(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    from easyr1.engines.vllm_engine import CPU_BLOCK_SIZE, cpu_block_size
    from easyr1.errors import ConfigError, UserError

    assert cpu_block_size(None) == CPU_BLOCK_SIZE
    assert cpu_block_size(64) == 64
    with pytest.raises(UserError, match="worker.rollout.block_size=48"):
        cpu_block_size(48)
    # any engine's kernels need a multiple of 16: refused with the config, before Ray starts
    with pytest.raises(ConfigError, match="worker.rollout.block_size=24"):
        demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, "worker.rollout.block_size=24")
