"""The weight sync's gather (one FSDP group at a time) and the LoRA fold, against the simple versions they replace."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import start_ray
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, gathered_parameters, shard_model
from easyr1.models.loading import load_model
from easyr1.models.lora import merged_weights


def all_at_once(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The previous gather: unshard every FSDP group, read named_parameters(), reshard."""
    groups = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for group in groups:
        group.unshard()
    try:
        return {name: param.detach().clone() for name, param in model.named_parameters()}
    finally:
        for group in groups:
            group.reshard()


def gather_both_ways(model_dir: str, mixed: bool) -> dict:
    torch.manual_seed(0)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    model = shard_model(load_model(model_dir, torch.float32), data_parallel_mesh("cpu"), mp_policy=policy)
    with gathered_parameters(model) as parameters:
        per_group = list(parameters)
    with gathered_parameters(model, master_weights=True) as parameters:
        master = dict(parameters)
    sharded = {name: full_tensor(param.detach()) for name, param in model.named_parameters()}
    return {"per_group": per_group, "all_at_once": all_at_once(model), "master": master, "sharded": sharded}


def check_gathers(result: dict, mixed: bool) -> None:
    per_group = dict(result["per_group"])
    assert len(per_group) == len(result["per_group"])  # every name once
    reference = result["all_at_once"]
    assert per_group.keys() == reference.keys()
    for name, value in reference.items():
        assert type(per_group[name]) is torch.Tensor  # plain full tensors, not shards
        assert torch.equal(per_group[name], value), name
        assert value.dtype == (torch.bfloat16 if mixed else torch.float32)
        assert result["master"][name].dtype == torch.float32
        assert torch.equal(result["master"][name], result["sharded"][name]), name


def test_one_rank_gather_reads_the_stored_parameters_without_copies(tiny_qwen2_5_vl_dir, process_group):
    """On one rank the shards are the whole parameters: no unshard, no copy (the weight sync's cost at 1 worker)."""
    model = shard_model(load_model(str(tiny_qwen2_5_vl_dir), torch.float32), data_parallel_mesh("cpu"))
    stored = {name: param.to_local().data_ptr() for name, param in model.named_parameters()}
    with gathered_parameters(model) as parameters:
        read = {name: value.data_ptr() for name, value in parameters}
    assert read == stored


class GatherProbe(Worker):
    def gather(self, model_dir: str, mixed: bool) -> dict:
        return gather_both_ways(model_dir, mixed)


@pytest.mark.parametrize("mixed", [False, True])
def test_one_rank_gather_equals_the_all_at_once_gather(tiny_qwen2_5_vl_dir, process_group, mixed):
    check_gathers(gather_both_ways(str(tiny_qwen2_5_vl_dir), mixed), mixed)


@pytest.mark.ray
def test_two_rank_gather_equals_the_all_at_once_gather(tiny_qwen2_5_vl_dir):
    start_ray()
    group = WorkerGroup(GatherProbe, 2)
    try:
        for mixed in (False, True):
            results = group.run_all(GatherProbe.gather, str(tiny_qwen2_5_vl_dir), mixed)
            for result in results:
                check_gathers(result, mixed)
            # both ranks get the same full weights
            for name, value in results[0]["per_group"]:
                assert torch.equal(value, dict(results[1]["per_group"])[name])
    finally:
        group.shutdown()


# ------------------------------------------------------------------------------------------------- LoRA fold


def peft_like_weights(generator: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """Names as a peft model gives them: an adapted projection, an unadapted one, a bias, a norm."""
    prefix = "base_model.model.model.layers.0"
    return [
        (f"{prefix}.self_attn.q_proj.base_layer.weight", torch.randn(8, 6, generator=generator) * 0.05),
        (f"{prefix}.self_attn.q_proj.base_layer.bias", torch.randn(8, generator=generator)),
        (f"{prefix}.self_attn.q_proj.lora_A.default.weight", torch.randn(2, 6, generator=generator)),
        (f"{prefix}.self_attn.q_proj.lora_B.default.weight", torch.randn(8, 2, generator=generator) * 1e-4),
        (f"{prefix}.self_attn.k_proj.base_layer.weight", torch.randn(4, 6, generator=generator)),
        (f"{prefix}.input_layernorm.weight", torch.ones(6)),
    ]


def test_lora_fold_streams_and_folds_in_master_precision():
    weights = peft_like_weights(torch.Generator().manual_seed(0))
    tensors = dict(weights)
    base = tensors["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    lora_a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"]
    lora_b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"]
    exact = base.double() + 2.0 * (lora_b.double() @ lora_a.double())

    merged = dict(merged_weights(weights, 2.0))
    assert sorted(merged) == [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.q_proj.weight",
    ]
    assert all(not re.search(r"lora_|base_layer|base_model", name) for name in merged)
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], exact.float())
    assert torch.equal(
        merged["model.layers.0.self_attn.k_proj.weight"],
        tensors["base_model.model.model.layers.0.self_attn.k_proj.base_layer.weight"],
    )

    # to a bf16 engine: fold first, cast once. Casting the base first (the old order with bf16 master weights)
    # rounds the small adapter update away on most entries.
    to_bf16 = dict(merged_weights(weights, 2.0, torch.bfloat16))
    folded = to_bf16["model.layers.0.self_attn.q_proj.weight"]
    assert folded.dtype == torch.bfloat16 and torch.equal(folded, exact.to(torch.bfloat16))
    cast_first = base.to(torch.bfloat16).double() + 2.0 * (lora_b.double() @ lora_a.double())
    assert not torch.equal(cast_first.to(torch.bfloat16), folded)
    assert all(value.dtype == torch.bfloat16 for value in to_bf16.values())


def test_lora_fold_holds_only_layers_in_flight():
    """The fold yields a layer as soon as its three parts arrived, before the rest of the stream is read."""
    weights = peft_like_weights(torch.Generator().manual_seed(1))
    consumed = []

    def stream():
        for item in weights:
            consumed.append(item[0])
            yield item

    merged = merged_weights(stream(), 1.0)
    names = [next(merged)[0] for _ in range(2)]
    assert names == ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_proj.weight"]
    assert len(consumed) == 4  # the k_proj and norm entries were not read yet
