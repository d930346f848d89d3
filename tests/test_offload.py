"""Offload mechanics on one gloo rank: what moves where, and the phase bookkeeping of Residency.

A CPU machine has one device, so the moves go to ``cpu`` and back (their effect on GPU memory is measured in
``tests/gpu/test_gpu_memory.py``); what is checked here is the contract: every shard, gradient and optimizer state
ends on the requested device, values and parameter identities survive (the optimizer keeps updating the model's
parameters), and a phase brings in exactly what it asks for and releases it after.
"""

from __future__ import annotations

import pytest
import torch

from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.distributed.offload import Residency, model_devices, move_model, move_optimizer, optimizer_devices
from easyr1.models.loading import load_model


CPU = torch.device("cpu")


def trained_model(model_dir) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A sharded text model after one AdamW step (so it has gradients and optimizer states)."""
    torch.manual_seed(0)
    model = shard_model(load_model(str(model_dir), torch.float32), data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.arange(24).view(2, 12)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()  # gradients present while offloaded
    return model, optimizer


def snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    values = {f"param:{name}": full_tensor(param.detach()).clone() for name, param in model.named_parameters()}
    values.update({f"grad:{name}": full_tensor(param.grad).clone() for name, param in model.named_parameters()})
    for index, state in enumerate(optimizer.state.values()):
        values.update({f"state:{index}:{key}": full_tensor(value).clone() for key, value in state.items()})
    return values


def test_moves_keep_values_devices_and_parameter_identity(tiny_model_dir, process_group):
    model, optimizer = trained_model(tiny_model_dir("qwen2"))
    before = snapshot(model, optimizer)
    parameters = list(model.parameters())
    for device in ("cpu", CPU):
        move_model(model, device)
        move_optimizer(optimizer, device)
        assert model_devices(model) == {CPU}
        assert optimizer_devices(optimizer) == {CPU}
    assert all(mine is theirs for mine, theirs in zip(model.parameters(), parameters))
    assert optimizer.param_groups[0]["params"][0] is parameters[0]
    after = snapshot(model, optimizer)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)


def test_residency_brings_in_what_a_phase_asks_for_and_releases_it(tiny_model_dir, process_group):
    model, optimizer = trained_model(tiny_model_dir("qwen2"))
    residency = Residency(model, optimizer, "cpu", offload_params=True, offload_optimizer=True)
    assert (residency.params_on_device, residency.optimizer_on_device) == (True, True)
    residency.release()
    assert (residency.params_on_device, residency.optimizer_on_device, residency.moves) == (False, False, 2)

    with residency.on_device():  # a forward-only phase: parameters only
        assert (residency.params_on_device, residency.optimizer_on_device) == (True, False)
        with residency.on_device(optimizer=True):  # nested: shares the outer move, adds the optimizer
            assert (residency.params_on_device, residency.optimizer_on_device) == (True, True)
        assert residency.params_on_device  # still inside the outer phase
    assert (residency.params_on_device, residency.optimizer_on_device, residency.moves) == (False, False, 6)

    with pytest.raises(RuntimeError, match="inside"), residency.on_device(optimizer=True):
        raise RuntimeError("a failure inside a phase")
    assert (residency.params_on_device, residency.optimizer_on_device) == (False, False)  # released anyway


def test_residency_without_offload_never_moves(tiny_model_dir, process_group):
    model, optimizer = trained_model(tiny_model_dir("qwen2"))
    residency = Residency(model, optimizer, "cpu", offload_params=False, offload_optimizer=False)
    residency.release()
    with residency.on_device(optimizer=True):
        pass
    assert (residency.params_on_device, residency.optimizer_on_device, residency.moves) == (True, True, 0)
    frozen = Residency(model, None, "cpu", offload_params=True, offload_optimizer=True)  # a reference: no optimizer
    frozen.release()
    assert (frozen.params_on_device, frozen.offload_optimizer, frozen.moves) == (False, False, 1)
