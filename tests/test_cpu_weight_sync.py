"""The CPU weight sync (``engines/vllm_cpu_weight_sync.py``) gives the engine vLLM's own ``reload_weights`` gives.

Each engine runs in this process, in a one-rank gloo world, as in a worker. After a sync of perturbed weights
(every float tensor, the vision tower's too), greedy tokens and log-probs of image and text prompts equal those after
vLLM's reload of the same weights; the sync keeps no second copy of the weights; an engine the fast path does not
know falls back to vLLM's reload.
"""

from __future__ import annotations

import gc
import json

import pytest
import torch
from helpers import prompt_batch, single_rank_vllm_world, tiny_vllm_engine
from safetensors.torch import load_file

from easyr1.engines.base import SamplingSettings
from easyr1.protocol import Batch


pytestmark = pytest.mark.vllm

GREEDY = SamplingSettings(max_tokens=6, greedy=True, ignore_eos=True)
PIXELS = {"qwen2_5_vl": 3136, "qwen3_vl": 4096}  # an image of 2x2 merged patches for each family's processor


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": f"Name colour {i}.", "answer": "red"}) + "\n" for i in range(2)))
    return path.parent


# (family, enforce_eager): compiling costs ~30 s, so one compiled engine; the compiled graph must see new weights
@pytest.fixture(scope="module", params=[("qwen2_5_vl", True), ("qwen2_5_vl", False), ("qwen3_vl", True)], ids=str)
def engine(request, tiny_model_dir):
    family, eager = request.param
    model_dir = tiny_model_dir(family)
    with single_rank_vllm_world():
        rollout = tiny_vllm_engine(model_dir, enforce_eager=eager)
        try:
            yield model_dir, rollout, PIXELS[family]
        finally:
            del rollout
            gc.collect()


def perturbed_weights(model_dir, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = load_file(str(model_dir / "model.safetensors"))
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator) if tensor.is_floating_point() else tensor
        for name, tensor in weights.items()
    }


def generate(rollout, batches: list[Batch]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    outputs = [rollout.generate(batch, GREEDY, seeds=list(range(len(batch)))) for batch in batches]
    return [out["responses"] for out in outputs], [out["rollout_log_probs"] for out in outputs]


def linear_tensors(worker) -> list[tuple[str, tuple[int, ...], int]]:
    """Run on vLLM's worker: every tensor the GEMM layers hold (parameters, buffers, the tensors their CPU kernels
    keep: oneDNN handles, packed weights) and every parameter of the model, as (owner, shape, data pointer)."""
    found = []
    model = worker.model_runner.get_model()
    for name, module in model.named_modules():
        if not hasattr(module, "cpu_linear"):
            continue
        held = [*module._parameters.items(), *module._buffers.items()]
        for cell in getattr(module.cpu_linear, "__closure__", None) or ():
            value = cell.cell_contents
            held += [("closure", value), ("handler", getattr(value, "handler_tensor", None))]
        found += [(f"{name}.{key}", tuple(t.shape), 0) for key, t in held if isinstance(t, torch.Tensor)]
    found += [(name, tuple(p.shape), p.data_ptr()) for name, p in model.named_parameters()]
    return sorted(found)


def test_sync_equals_vllms_reload(engine, tiny_dataset_dir, text_dataset):
    model_dir, rollout, pixels = engine
    assert rollout.reload_reason is None  # the fast path applies to the tiny models
    batches = [
        prompt_batch(model_dir, tiny_dataset_dir, 2, pixels=pixels),
        prompt_batch(model_dir, text_dataset, 2, pixels=pixels),
    ]
    assert batches[0]["multi_modal_data"][0] and not batches[1]["multi_modal_data"][0]
    before_tokens, before_log_probs = generate(rollout, batches)
    tensors_before = rollout.llm.collective_rpc(linear_tensors)[0]

    weights = perturbed_weights(model_dir, seed=1)
    rollout.sync_weights(weights.items())
    fast_tokens, fast_log_probs = generate(rollout, batches)
    # no plain weight left behind; every other parameter written in place (where the compiled graph reads it)
    assert rollout.llm.collective_rpc(linear_tensors)[0] == tensors_before

    rollout.reload_reason = "the test's reference"  # the same engine through vLLM's own reload
    try:
        rollout.sync_weights(weights.items())
        reload_tokens, reload_log_probs = generate(rollout, batches)
    finally:
        rollout.reload_reason = None
    for fast, reload, before in zip(fast_log_probs, reload_log_probs, before_log_probs):
        assert (fast - before).abs().max() > 1e-2  # the weights did change, for image and text prompts
        torch.testing.assert_close(fast, reload, rtol=0, atol=1e-6)
    for fast, reload in zip(fast_tokens, reload_tokens):
        assert torch.equal(fast, reload)

    # and back after vLLM's reload: its loader wrappers must not leak into the next fast sync
    rollout.sync_weights(perturbed_weights(model_dir, seed=2).items())
    rollout.sync_weights(weights.items())
    again_tokens, again_log_probs = generate(rollout, batches)
    for again, reload in zip(again_log_probs, reload_log_probs):
        torch.testing.assert_close(again, reload, rtol=0, atol=1e-6)
    assert all(torch.equal(a, r) for a, r in zip(again_tokens, reload_tokens))


def give_a_norm_its_own_processing(worker) -> None:
    model = worker.model_runner.get_model()
    norm = next(module for module in model.modules() if type(module).__name__ == "RMSNorm")
    norm.process_weights_after_loading = lambda: None


def test_unknown_layers_fall_back_to_vllms_reload(engine, tiny_dataset_dir, capsys):
    model_dir, rollout, pixels = engine
    rollout.choose_weight_sync()
    assert rollout.reload_reason is None
    assert "vLLM weight sync: the CPU path" in capsys.readouterr().out
    batches = [prompt_batch(model_dir, tiny_dataset_dir, 1, pixels=pixels)]
    weights = perturbed_weights(model_dir, seed=3)
    rollout.sync_weights(weights.items())
    fast = generate(rollout, batches)
    # a layer with post-load processing the fast path does not know: vLLM's reload, the layer named in one line
    rollout.llm.collective_rpc(give_a_norm_its_own_processing)
    rollout.choose_weight_sync()
    assert "RMSNorm has its own post-load processing" in rollout.reload_reason
    assert capsys.readouterr().out.count("vLLM weight sync: vLLM's reload_weights, because of") == 1
    rollout.sync_weights(perturbed_weights(model_dir, seed=4).items())
    rollout.sync_weights(weights.items())
    reloaded = generate(rollout, batches)
    assert torch.equal(fast[0][0], reloaded[0][0]) and torch.equal(fast[1][0], reloaded[1][0])
