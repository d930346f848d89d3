"""The FSDP units ``shard_model`` makes (one gloo rank): decoder blocks, the input embeddings and an untied LM head of
their own, the vision tower in the root; and the planner's root unit, counted the same way."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule

from easyr1.distributed.fsdp import _groups_and_their_parameters, data_parallel_mesh, shard_model
from easyr1.models.families import family_of
from easyr1.models.loading import load_model
from easyr1.plan.model_size import measure_model
from easyr1.workers.critic import ValueModel


def _root_parameters(model: torch.nn.Module) -> int:
    """Parameters the root unit manages itself (those in no nested unit)."""
    for group, parameters in _groups_and_their_parameters(model):
        if group is model:
            return sum(getattr(module, attr).numel() for _, module, attr in parameters)
    raise AssertionError("no root unit")


def test_untied_embeddings_and_lm_head_are_units_and_the_root_is_the_vision_tower(process_group, tiny_model_dir):
    model = load_model(str(tiny_model_dir("qwen2_5_vl")), torch.float32)
    size = measure_model(model.config)
    shard_model(model, data_parallel_mesh("cpu"))
    assert isinstance(model.get_input_embeddings(), FSDPModule)
    assert isinstance(model.get_output_embeddings(), FSDPModule)
    vision = sum(p.numel() for name, p in model.named_parameters() if family_of(model.config).is_vision_module(name))
    assert vision == size.vision
    # what the root holds beyond the tower: the final norm only (the planner counts the tower)
    assert 0 <= _root_parameters(model) - size.vision <= model.config.text_config.hidden_size


def test_a_tied_table_stays_in_the_root(process_group, tiny_model_dir):
    model = load_model(str(tiny_model_dir("gemma3")), torch.float32)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    size = measure_model(model.config)
    shard_model(model, data_parallel_mesh("cpu"))
    assert not isinstance(model.get_input_embeddings(), FSDPModule)
    assert _root_parameters(model) >= size.vision + size.embeddings


def test_the_value_model_shards_its_embeddings_apart(process_group, tiny_model_dir):
    value = ValueModel(load_model(str(tiny_model_dir("qwen2_5_vl")), torch.float32))
    shard_model(value, data_parallel_mesh("cpu"))
    assert isinstance(value.get_input_embeddings(), FSDPModule)
