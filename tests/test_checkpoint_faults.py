"""Checkpoint faults in this process, on the tiny model's real sharded state: a disk that fills during a checkpoint
write (a small tmpfs), and a newest checkpoint damaged after its commit (a truncated DCP shard, a corrupted
``trainer_state.pt``). Each must be a clear error or a stated fallback, with the previous checkpoint intact."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from easyr1.checkpoint.manager import TRAINER_STATE_NAME, CheckpointDirectory, step_damage
from easyr1.checkpoint.sharded import load_component, save_component, save_durably
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.errors import CheckpointError, WorkerLost
from easyr1.main import resume_advice
from easyr1.models.loading import load_model


def training_state(model_dir: Path):
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def train_a_step(model, optimizer, scheduler, seed: int) -> None:
    ids = torch.randint(0, 200, (2, 6), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def weights(model) -> dict[str, torch.Tensor]:
    return {name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()}


def writer(model, optimizer, scheduler, step: int):
    """What ``Trainer.save_checkpoint`` writes into the staging directory: the actor's shards and the driver's
    state (here without Ray: the one rank is this process)."""

    def write(staging: Path) -> None:
        save_component(staging / "actor", model, optimizer, scheduler)
        save_durably({"global_step": step, "rng": torch.get_rng_state()}, staging / TRAINER_STATE_NAME)

    return write


@pytest.fixture
def small_disk(tmp_path):
    """Factory: a tmpfs of ``kib`` KiB mounted under ``tmp_path`` (unmounted afterwards); skips where mounting is
    not allowed (not root, or in a container without the capability)."""
    mounted: list[Path] = []

    def mount(kib: int) -> Path:
        target = tmp_path / f"disk{len(mounted)}"
        target.mkdir()
        if shutil.which("mount") is None or os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root and mount(8)")
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(target)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", str(target)], check=False)


def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(
    process_group, tiny_qwen2_5_vl_dir, tmp_path, small_disk
):
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    train_a_step(model, optimizer, scheduler, seed=0)
    # the size of one checkpoint, measured on an ordinary disk: the small disk holds one and a half
    CheckpointDirectory(tmp_path / "measure").save(1, writer(model, optimizer, scheduler, 1))
    one = sum(p.stat().st_size for p in (tmp_path / "measure" / "global_step_1").rglob("*") if p.is_file())
    disk = small_disk(one * 3 // 2 // 1024)
    checkpoints = CheckpointDirectory(disk / "run")
    first = checkpoints.save(1, writer(model, optimizer, scheduler, 1))
    saved = weights(model)

    train_a_step(model, optimizer, scheduler, seed=1)
    with pytest.raises(CheckpointError) as caught:
        checkpoints.save(2, writer(model, optimizer, scheduler, 2))
    message = str(caught.value)
    assert "out of disk space writing the checkpoint of step 2" in message, message
    assert str(disk / "run") in message, message
    assert "a checkpoint of this run takes" in message and "the newest checkpoint is still step 1" in message, message
    assert "trainer.save_checkpoint_path" in message and "it resumes from step 1" in message, message
    # the partial write is gone (its space given back), the tracker and step 1 untouched and still the choice
    assert checkpoints.leftovers() == [] and checkpoints.complete_steps() == [1]
    assert checkpoints.read_tracker()["last_global_step"] == 1
    assert checkpoints.resume_path(None, find_last_checkpoint=True) == first
    assert step_damage(first) is None
    restored, restored_optimizer, restored_scheduler = training_state(tiny_qwen2_5_vl_dir)
    load_component(first / "actor", restored, restored_optimizer, restored_scheduler)
    assert all(torch.equal(saved[name], value) for name, value in weights(restored).items())


def test_a_full_disk_at_the_first_checkpoint_leaves_nothing_that_looks_like_one(
    process_group, tiny_qwen2_5_vl_dir, small_disk
):
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    checkpoints = CheckpointDirectory(small_disk(64) / "run")
    with pytest.raises(CheckpointError, match="no checkpoint of this run is on disk yet") as caught:
        checkpoints.save(1, writer(model, optimizer, scheduler, 1))
    assert "were written before the disk filled" in str(caught.value)
    assert checkpoints.leftovers() == [] and checkpoints.complete_steps() == []
    assert checkpoints.resume_path(None, find_last_checkpoint=True) is None


def truncate_a_shard(step_dir: Path) -> Path:
    shard = next((step_dir / "actor" / "model").glob("*.distcp"))
    with open(shard, "r+b") as file:
        file.truncate(shard.stat().st_size // 2)
    return shard


def corrupt_the_trainer_state(step_dir: Path) -> Path:
    """One byte of the pickled record inside ``trainer_state.pt`` changed (its length unchanged)."""
    path = step_dir / TRAINER_STATE_NAME
    with zipfile.ZipFile(path) as archive:
        record = next(info for info in archive.infolist() if info.filename.endswith("data.pkl"))
    with open(path, "r+b") as file:
        file.seek(record.header_offset + 26)
        name_length, extra_length = (int.from_bytes(file.read(2), "little") for _ in range(2))
        data_start = record.header_offset + 30 + name_length + extra_length
        file.seek(data_start + record.compress_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    return path


@pytest.mark.parametrize(
    "damage", [truncate_a_shard, corrupt_the_trainer_state], ids=["truncated-shard", "trainer-state"]
)
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumed(
    process_group, tiny_qwen2_5_vl_dir, tmp_path, capsys, damage
):
    model, optimizer, scheduler = training_state(tiny_qwen2_5_vl_dir)
    checkpoints = CheckpointDirectory(tmp_path / "run")
    for step in (2, 4):
        train_a_step(model, optimizer, scheduler, seed=step)
        checkpoints.save(step, writer(model, optimizer, scheduler, step))
        if step == 2:
            at_step_2 = weights(model)
    # intact: the newest is chosen, and nothing is said
    assert checkpoints.resume_path(None, find_last_checkpoint=True) == checkpoints.step_dir(4)
    assert capsys.readouterr().out == ""

    damaged_file = damage(checkpoints.step_dir(4))
    # a lost worker's message offers the step a resume would choose
    lost = WorkerLost(rank=1, node="127.0.0.1", phase="generate", cause="killed")
    lost.checkpoints = str(checkpoints.root)
    advice = resume_advice(lost, ["config=run.yaml"])
    assert f"the last intact checkpoint is {checkpoints.step_dir(2)} (step 2)" in advice, advice
    chosen = checkpoints.resume_path(None, find_last_checkpoint=True)
    assert chosen == checkpoints.step_dir(2)
    console = capsys.readouterr().out
    assert f"resuming from {checkpoints.step_dir(2)} (step 2)" in console, console
    assert f"step 4, which is damaged: {damaged_file}" in console, console
    restored, restored_optimizer, restored_scheduler = training_state(tiny_qwen2_5_vl_dir)
    load_component(chosen / "actor", restored, restored_optimizer, restored_scheduler)
    assert all(torch.equal(at_step_2[name], value) for name, value in weights(restored).items())
    assert torch.load(chosen / TRAINER_STATE_NAME, weights_only=True)["global_step"] == 2

    # asked for by name, the damaged step is an error naming the file and offering the intact one
    with pytest.raises(CheckpointError) as caught:
        checkpoints.resume_path(str(checkpoints.step_dir(4)), find_last_checkpoint=True)
    message = str(caught.value)
    assert str(damaged_file) in message, message
    assert f"trainer.load_checkpoint_path={checkpoints.step_dir(2)}" in message, message

    # with no intact step left, nothing is resumed silently
    damage(checkpoints.step_dir(2))
    with pytest.raises(CheckpointError, match="every checkpoint in .* is damaged: step 4.*; step 2"):
        checkpoints.resume_path(None, find_last_checkpoint=True)
