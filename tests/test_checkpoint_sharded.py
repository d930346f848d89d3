"""Save and load of one FSDP2 model's training state through torch.distributed.checkpoint (one gloo rank)."""

from __future__ import annotations

import pytest
import torch

from easyr1.checkpoint.sharded import OPTIMIZER_DIR, load_component, save_component
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.errors import UserError
from easyr1.models.loading import load_model


def training_state(model_dir):
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return model, optimizer, scheduler


def text_step(model, optimizer, scheduler, seed: int) -> None:
    """A step on text only: the vision tower gets no gradient and so no optimizer state."""
    ids = torch.randint(0, 200, (2, 6), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def full_step(model, optimizer) -> None:
    """A step where every parameter (vision tower included, for the first time) has a gradient."""
    for index, param in enumerate(model.parameters()):
        param.grad = torch.full_like(param, 0.01 * (index % 5 + 1))
    optimizer.step()
    optimizer.zero_grad()


def weights(model) -> dict[str, torch.Tensor]:
    return {name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()}


def test_resumed_model_continues_exactly_like_the_original(process_group, tiny_qwen2_5_vl_dir, tmp_path):
    torch.manual_seed(0)
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    for seed in range(2):
        text_step(model, optimizer, scheduler, seed)
    visual = [p for name, p in model.named_parameters() if ".visual." in f".{name}"]
    assert visual and all(p not in optimizer.state for p in visual)
    save_component(tmp_path / "actor", model, optimizer, scheduler)
    expected_random = torch.rand(3)

    torch.manual_seed(123)  # a different RNG state that the load must overwrite
    resumed, resumed_optimizer, resumed_scheduler = training_state(tiny_qwen2_5_vl_dir)
    load_component(tmp_path / "actor", resumed, resumed_optimizer, resumed_scheduler)
    assert torch.equal(torch.rand(3), expected_random)
    assert resumed_scheduler.last_epoch == scheduler.last_epoch == 2
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    before = weights(model)
    assert all(torch.equal(before[name], value) for name, value in weights(resumed).items())
    # parameters that never had a gradient must still have no state (Adam's step count drives its bias correction)
    assert all(p not in resumed_optimizer.state for n, p in resumed.named_parameters() if ".visual." in f".{n}")

    text_step(model, optimizer, scheduler, seed=7)
    text_step(resumed, resumed_optimizer, resumed_scheduler, seed=7)
    full_step(model, optimizer)
    full_step(resumed, resumed_optimizer)
    after, resumed_after = weights(model), weights(resumed)
    assert any(not torch.equal(after[name], before[name]) for name in before if ".visual." in f".{name}")
    for name, value in after.items():
        assert torch.equal(resumed_after[name], value), name


def test_model_only_checkpoint_has_no_optimizer_and_cannot_resume_training(
    process_group, tiny_qwen2_5_vl_dir, tmp_path
):
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    text_step(model, optimizer, scheduler, seed=0)
    save_component(tmp_path / "actor", model, optimizer, scheduler, model_only=True)
    assert not (tmp_path / "actor" / OPTIMIZER_DIR).exists()
    restored, restored_optimizer, restored_scheduler = training_state(tiny_qwen2_5_vl_dir)
    load_component(tmp_path / "actor", restored, None, None)  # weights alone load fine
    assert all(torch.equal(a, b) for a, b in zip(weights(model).values(), weights(restored).values()))
    with pytest.raises(UserError, match="save_model_only"):
        load_component(tmp_path / "actor", restored, restored_optimizer, restored_scheduler)


def test_missing_weights_is_a_clear_error(process_group, tiny_qwen2_5_vl_dir, tmp_path):
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    with pytest.raises(UserError, match="not an easyr1 checkpoint"):
        load_component(tmp_path / "nothing", model, optimizer, scheduler)
