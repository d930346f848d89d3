"""Config keys that reach vLLM: ``model.override_config`` (as ``hf_overrides``), ``rollout.disable_tqdm`` and
``rollout.block_size`` (on CPU a prompt's samples share its prefill).

The engine runs in this process, in a one-rank gloo world (vLLM's external launcher), as it does in a worker.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from helpers import prompt_batch, single_rank_vllm_world, tiny_vllm_engine

from easyr1.engines.base import SamplingSettings


pytestmark = pytest.mark.vllm

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


def build_engine(model_dir: str, block_size: int | None = None, **keys: Any):
    """easyr1's vLLM engine on the tiny model, eager, with ``worker.rollout.block_size`` and other ``keys``."""
    return tiny_vllm_engine(model_dir, max_model_len=128, limit_images=0, block_size=block_size, **keys)


def test_override_config_and_progress_bar_reach_vllm(engine_world, tiny_qwen2_5_vl_dir, tiny_dataset_dir, capsys):
    engine = build_engine(
        str(tiny_qwen2_5_vl_dir), override_config={"text_config": {"rms_norm_eps": EPS}}, show_progress=True
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


def test_samples_of_a_prompt_share_its_prefill_on_cpu(engine_world, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """With the CPU default (32-token blocks) the n samples of a prompt reuse the KV blocks of its first sample,
    in the same call; with vLLM's 128-token blocks a prompt this short shares nothing. The samples are the same."""
    samples = 4
    prompts = prompt_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 1).repeat(samples, interleave=True)
    prompt_length = int(prompts["attention_mask"][0].sum())
    assert prompt_length > 32, "the test needs a prompt of more than one block"
    settings = SamplingSettings(max_tokens=4, temperature=1.0)
    responses, cached = {}, {}
    for block_size in (None, 128):
        engine = build_engine(str(tiny_qwen2_5_vl_dir), block_size)
        try:
            expected = 32 if block_size is None else 128
            assert engine.llm.llm_engine.vllm_config.cache_config.block_size == expected
            # what vLLM reports per request: the prompt tokens it took from the prefix cache
            requests = [
                {"prompt_token_ids": list(prompts["raw_prompt_ids"][0]), "multi_modal_data": {"image": row}}
                for row in [prompts["multi_modal_data"][0]["images"]] * samples
            ]
            outputs = engine.llm.generate(requests, use_tqdm=False)
            cached[block_size] = sorted(output.num_cached_tokens for output in outputs)
            responses[block_size] = engine.generate(prompts, settings, seeds=list(range(samples)))["responses"]
        finally:
            del engine
            gc.collect()
    whole_blocks = prompt_length // 32 * 32
    assert cached[None] == [0] + [whole_blocks] * (samples - 1)
    assert cached[128] == [0] * samples
    assert torch.equal(responses[None], responses[128])


def test_gpu_environment_turns_off_the_cuda_ipc_all_reduce_paths(monkeypatch):
    import vllm.envs

    from easyr1.engines.vllm_engine import IPC_ALL_REDUCE_VARIABLES, set_gpu_engine_environment

    for variable in (*IPC_ALL_REDUCE_VARIABLES, "VLLM_USE_V2_MODEL_RUNNER"):
        monkeypatch.delenv(variable, raising=False)
    # vLLM's defaults: both paths on beside NCCL (disable_custom_all_reduce does not reach them)
    assert vllm.envs.VLLM_ALLREDUCE_USE_SYMM_MEM and vllm.envs.VLLM_ALLREDUCE_USE_FLASHINFER
    set_gpu_engine_environment()
    assert not vllm.envs.VLLM_ALLREDUCE_USE_SYMM_MEM and not vllm.envs.VLLM_ALLREDUCE_USE_FLASHINFER
    # a value the user exported wins
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "1")
    set_gpu_engine_environment()
    assert vllm.envs.VLLM_ALLREDUCE_USE_SYMM_MEM
