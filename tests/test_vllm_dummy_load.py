"""An engine started without its checkpoint (``load_format="dummy"``, ``engines/vllm_dummy_load.py``) equals, after
the worker's first weight sync, one that loaded the checkpoint and got the same sync: every parameter and buffer of
vLLM's model, tensor by tensor, for Qwen2.5-VL (LoRA-merged weights) and Qwen3-VL.
A sync that misses a parameter raises, naming it, on the CPU path and through vLLM's reload.

Each engine runs in this process, in a one-rank gloo world, as in a worker.
"""

from __future__ import annotations

import gc
import json
import shutil
from collections.abc import Callable, Iterable

import pytest
import torch
from helpers import single_rank_vllm_world, tiny_vllm_engine

from easyr1.config.actor import LoraConfig
from easyr1.engines.base import SamplingSettings
from easyr1.models.loading import load_model
from easyr1.models.lora import adapter_config_of, apply_lora, lora_scaling, merged_weights


pytestmark = pytest.mark.vllm


def engine_tensors(worker) -> dict[str, torch.Tensor]:
    """Run on vLLM's worker: a copy of every parameter and every buffer (persistent or not) of the model."""
    model = worker.model_runner.get_model()
    tensors = {f"param {name}": param.detach().clone() for name, param in model.named_parameters()}
    tensors |= {f"buffer {name}": buffer.detach().clone() for name, buffer in model.named_buffers()}
    return tensors


def build_engine(model_dir, load_format: str):
    return tiny_vllm_engine(model_dir, load_format=load_format)


def actor_weights(model_dir, lora: bool) -> list[tuple[str, torch.Tensor]]:
    """What the worker syncs: the actor's parameters (transformers' names), with LoRA the adapters folded in
    (``merged_weights``, as ``HybridWorker._engine_weights``), B non-zero so that the fold changes the weights."""
    model = load_model(str(model_dir), torch.float32)
    if not lora:
        return [(name, param.detach().clone()) for name, param in model.named_parameters()]
    model = apply_lora(model, LoraConfig(rank=4, alpha=8))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    named = [(name, param.detach().clone()) for name, param in model.named_parameters()]
    return list(merged_weights(named, lora_scaling(adapter_config_of(model)), torch.float32))


def synced_tensors(
    model_dir, load_format: str, weights: list, before_sync: Callable | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of a fresh engine after one sync of ``weights``; ``before_sync(engine)`` runs first."""
    with single_rank_vllm_world():
        engine = build_engine(model_dir, load_format)
        try:
            if before_sync is not None:
                before_sync(engine)
            engine.sync_weights(iter(weights))
            return engine.llm.collective_rpc(engine_tensors)[0]
        finally:
            del engine
            gc.collect()


def differing(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> list[str]:
    assert first.keys() == second.keys()
    return sorted(name for name in first if not torch.equal(first[name], second[name]))


# Two vision towers (what the kept buffers are for), one with LoRA-merged weights. Plain Qwen2.5-VL and text-only
# models run with the dummy start in the end-to-end tests (test_mixed_e2e.py, test_text_model_e2e.py: engine vs actor
# log-probs), and every family was compared tensor by tensor once (0 tensors differing); the first sync's check
# covers them in every run.
@pytest.mark.parametrize(("family", "lora"), [("qwen2_5_vl", True), ("qwen3_vl", False)])
def test_dummy_start_plus_first_sync_equals_checkpoint_start(tiny_model_dir, family, lora):
    model_dir = tiny_model_dir(family)
    weights = actor_weights(model_dir, lora)
    real = synced_tensors(model_dir, "auto", weights)

    at_start: dict[str, dict[str, torch.Tensor]] = {}

    def look_before_sync(engine) -> None:
        assert engine.weights_discarded  # the worker's first generate syncs first
        with pytest.raises(RuntimeError, match="sync_weights first"):
            engine.generate(None, SamplingSettings(max_tokens=1), seeds=[0])
        at_start["tensors"] = engine.llm.collective_rpc(engine_tensors)[0]

    dummy = synced_tensors(model_dir, "dummy", weights, before_sync=look_before_sync)
    assert differing(real, dummy) == []
    # the comparison sees the dummy load: before the sync the parameters were random, not the checkpoint's
    started = at_start["tensors"]
    assert [name for name in differing(real, started) if name.startswith("param ")]
    # and the buffers had the values the model computes at construction (vLLM's dummy load randomises those it
    # keeps in the state dict: the Qwen-VL vision towers' pixel normalisation, visual.input_norm)
    assert [name for name in differing(real, started) if name.startswith("buffer ")] == []
    if family != "qwen2":
        assert "buffer visual.input_norm.bias" in real


def without(weights: list, skipped: str) -> Iterable[tuple[str, torch.Tensor]]:
    assert skipped in dict(weights)
    return iter([(name, tensor) for name, tensor in weights if name != skipped])


def test_a_first_sync_that_misses_a_parameter_raises_naming_it(tiny_model_dir):
    model_dir = tiny_model_dir("qwen2")
    weights = actor_weights(model_dir, lora=False)
    with single_rank_vllm_world():
        engine = build_engine(model_dir, "dummy")
        try:
            assert engine.reload_reason is None  # easyr1's CPU path
            with pytest.raises(RuntimeError, match=r"did not write 1 of its parameters.*: model\.norm\.weight;"):
                engine.sync_weights(without(weights, "model.norm.weight"))
            # what an earlier sync wrote stays written: the norm is all that is missing, through vLLM's reload too
            engine.reload_reason = "the test's vLLM reload"  # vLLM's reload_weights, as on GPU
            with pytest.raises(RuntimeError, match=r"did not write 1 of its parameters.*: model\.norm\.weight;"):
                engine.sync_weights(without(weights, "model.norm.weight"))
            engine.sync_weights(iter(weights))  # complete: no error, and none for later partial syncs
            engine.reload_reason = None
            engine.sync_weights(without(weights, "model.norm.weight"))
        finally:
            del engine
            gc.collect()


def test_tied_embeddings_with_an_lm_head_in_the_checkpoint_load_the_checkpoint(tiny_model_dir, tmp_path, capsys):
    from easyr1.engines.vllm_dummy_load import needs_checkpoint
    from easyr1.models.loading import load_model_config

    untied = tiny_model_dir("qwen2")
    assert needs_checkpoint(str(untied), load_model_config(str(untied))) is None
    # the same checkpoint (lm_head.weight included) under a config that says tied: only the values can decide
    tied = tmp_path / "tied"
    shutil.copytree(untied, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    assert "lm_head" in needs_checkpoint(str(tied), load_model_config(str(tied)))
    with single_rank_vllm_world():
        engine = build_engine(tied, "dummy")
        try:
            assert engine.load_format == "auto" and not engine.weights_discarded
            assert "vLLM loads the checkpoint at start (not load_format=dummy)" in capsys.readouterr().out
        finally:
            del engine
            gc.collect()
