"""Config keys that reach vLLM: ``model.override_config`` (as ``hf_overrides``) and ``rollout.disable_tqdm``.

The engine runs in this process, in a one-rank gloo world (vLLM's external launcher), as it does in a worker.
"""

from __future__ import annotations

import gc

import pytest
import torch
from helpers import prompt_batch, single_rank_vllm_world

from easyr1.workers.rollout.base import SamplingSettings


pytestmark = pytest.mark.slow

EPS = 1e-3  # the tiny model's config has rms_norm_eps 1e-6


@pytest.fixture(scope="module")
def engine_world():
    """A one-rank gloo world plus the environment vLLM's external launcher reads (restored afterwards)."""
    with single_rank_vllm_world():
        yield


def language_norm_eps(worker) -> list[float]:
    """Run on vLLM's worker: the epsilon of every RMS norm outside the vision tower of the loaded model."""
    model = worker.model_runner.model
    return sorted(
        {
            float(module.variance_epsilon)
            for name, module in model.named_modules()
            if hasattr(module, "variance_epsilon") and "visual" not in name.split(".")
        }
    )


def test_override_config_and_progress_bar_reach_vllm(engine_world, tiny_qwen2_5_vl_dir, tiny_dataset_dir, capsys):
    from easyr1.workers.rollout.vllm_rollout import VLLMRollout

    model_dir = str(tiny_qwen2_5_vl_dir)
    engine = VLLMRollout(
        model_dir,
        model_dir,
        dtype=torch.float32,
        max_model_len=128,
        tensor_parallel_size=1,
        seed=0,
        pad_token_id=0,
        banned_token_ids=[],
        enforce_eager=True,
        cpu_kv_cache_bytes=32 * 2**20,
        override_config={"text_config": {"rms_norm_eps": EPS}},
        show_progress=True,
    )
    try:
        assert engine.llm.llm_engine.model_config.hf_config.text_config.rms_norm_eps == EPS
        assert engine.llm.collective_rpc(language_norm_eps) == [[EPS]]  # the model was built with it
        prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 1)
        capsys.readouterr()
        engine.generate(prompts, SamplingSettings(max_tokens=2), seeds=[0])
        assert "Processed prompts" in capsys.readouterr().err  # vLLM's own bar
        engine.show_progress = False
        engine.generate(prompts, SamplingSettings(max_tokens=2), seeds=[0])
        assert "Processed prompts" not in capsys.readouterr().err
    finally:
        del engine
        gc.collect()
