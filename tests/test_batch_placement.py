"""Batches reach the worker's device one micro-batch at a time, vision rows included, and results come back as host
tensors. The move itself is checked against the ``meta`` device (any CPU can tell it apart); the actor and critic
run on every device this machine has (CPU here, CUDA too where present) with the batch arriving on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import demo_config, training_batch

from easyr1.models.loading import load_model
from easyr1.models.vision_tower import dummy_image_inputs
from easyr1.protocol import Batch
from easyr1.workers.actor import Actor
from easyr1.workers.critic import Critic, ValueModel
from easyr1.workers.placement import batch_to


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def small_batch() -> Batch:
    rows = [{"pixel_values": torch.ones(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])}, {}, None]
    return Batch(
        tensors={"input_ids": torch.arange(12).view(3, 4), "response_mask": torch.ones(3, 2)},
        non_tensors={"multi_modal_inputs": rows, "ground_truth": ["a", "b", "c"]},
        meta={"temperature": 1.0},
    )


def test_batch_to_moves_every_tensor_and_each_rows_vision_inputs():
    moved = batch_to(small_batch(), "meta")
    assert {value.device.type for value in moved.tensors.values()} == {"meta"}
    first, second, third = moved["multi_modal_inputs"]
    assert {value.device.type for value in first.values()} == {"meta"}
    assert first["pixel_values"].shape == (4, 6)
    assert second == {} and third is None  # text rows stay empty
    assert list(moved["ground_truth"]) == ["a", "b", "c"]  # other object columns are left alone
    assert moved.meta == {"temperature": 1.0}


def test_batch_to_leaves_the_host_batch_untouched():
    batch = small_batch()
    batch_to(batch, "meta")
    assert batch["input_ids"].device.type == "cpu"
    assert batch["multi_modal_inputs"][0]["pixel_values"].device.type == "cpu"
    assert isinstance(batch["multi_modal_inputs"], np.ndarray)


def test_dummy_image_follows_the_inputs_device_not_the_parameters(tiny_qwen2_5_vl_dir):
    # with FSDP CPU offload the sharded parameters stay on the host while the forward runs on the GPU
    model = load_model(str(tiny_qwen2_5_vl_dir), torch.float32)
    assert {tensor.device.type for tensor in dummy_image_inputs(model, device="meta").values()} == {"meta"}
    # default: where the parameters are
    assert {tensor.device.type for tensor in dummy_image_inputs(model).values()} == {"cpu"}


def record_input_devices(model: torch.nn.Module) -> set[str]:
    """Installs a hook that collects the device of every tensor the model's forward receives."""
    seen: set[str] = set()

    def hook(_module, args, kwargs):
        for value in [*args, *kwargs.values()]:
            if isinstance(value, torch.Tensor):
                seen.add(str(value.device.type))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("device", DEVICES)
def test_actor_and_critic_take_host_batches_and_return_host_tensors(device, tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir)
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 4)  # two image rows per micro-batch of 2
    torch.manual_seed(0)
    model = load_model(str(tiny_qwen2_5_vl_dir), torch.float32).to(device)
    seen = record_input_devices(model)
    actor = Actor(model, config.worker.actor, torch.optim.SGD(model.parameters(), lr=0.1), device=device)
    log_probs = actor.compute_log_probs(batch, temperature=1.0, micro_batch_size=2)
    assert log_probs.device.type == "cpu" and log_probs.shape == batch["responses"].shape
    assert seen == {device}  # ids, masks, positions and pixel values all reached the model's device
    batch["old_log_probs"] = log_probs
    metrics = actor.update_policy(batch, temperature=1.0, mini_batch_size=4)
    assert all(isinstance(value, float) for value in metrics.values())
    assert np.isfinite(metrics["actor/pg_loss"])

    value_model = ValueModel(load_model(str(tiny_qwen2_5_vl_dir), torch.float32)).to(device)
    critic = Critic(value_model, config.worker.critic, torch.optim.SGD(value_model.parameters(), lr=0.1), device)
    values = critic.compute_values(batch, micro_batch_size=2)
    assert values.device.type == "cpu" and values.shape == batch["responses"].shape
    batch["values"], batch["returns"] = values, torch.ones_like(values) * batch["response_mask"]
    critic_metrics = critic.update(batch, mini_batch_size=4)
    assert critic_metrics["critic/vf_loss"] > 0  # the zero-initialised head is far from returns of 1
