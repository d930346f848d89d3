"""A checkpoint's ``.pt`` state files are read as plain data and its DCP ``.metadata`` checked before torch unpickles
it: a crafted pickle placed as ``trainer_state.pt``, ``extra_state_rank_0.pt`` or ``.metadata`` is refused before it
runs, naming the file; what easyr1 writes (and wrote before its RNG state became plain values) still loads and
restores every generator exactly."""

from __future__ import annotations

import enum
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import ONE_PROCESS, REPO, train
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import WriteItemType

from easyr1.checkpoint.dcp_metadata import check_dcp_metadata
from easyr1.checkpoint.manager import TRAINER_STATE_NAME, CheckpointDirectory
from easyr1.checkpoint.sharded import (
    extra_state_name,
    load_component,
    load_state_file,
    rng_state,
    save_component,
    save_durably,
    set_rng_state,
)
from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
from easyr1.errors import CheckpointError
from easyr1.models.loading import load_model


class CreatesMarker:
    """Unpickled, it would run ``touch MARKER``: what a crafted checkpoint could do with any other command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path: Path, marker: Path, zip_format: bool) -> None:
    """A crafted pickle at ``path``: torch's zip format, or a bare pickle stream (torch reads both)."""
    payload = {"global_step": 2, "rng": CreatesMarker(marker)}
    if zip_format:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))


def generators_draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def sharded_checkpoint(model_dir: Path, root: Path) -> Path:
    """One committed step of the tiny model (actor shards, optimizer, extra state, trainer state), as a run writes
    it, with this process as the only rank."""
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def write(staging: Path) -> None:
        save_component(staging / "actor", model, optimizer, scheduler)
        save_durably({"global_step": 2, "rng": rng_state()}, staging / TRAINER_STATE_NAME)

    return CheckpointDirectory(root).save(2, write)


@pytest.mark.parametrize("zip_format", [True, False], ids=["torch-zip", "bare-pickle"])
def test_a_crafted_state_file_is_refused_without_running(tmp_path, zip_format):
    marker, path = tmp_path / "marker", tmp_path / TRAINER_STATE_NAME
    plant(path, marker, zip_format)
    with pytest.raises(CheckpointError) as caught:
        load_state_file(path)
    assert str(path) in str(caught.value) and "refused to load" in str(caught.value), caught.value
    assert not marker.exists()


def test_crafted_extra_state_in_a_real_checkpoint_is_refused(process_group, tiny_qwen2_5_vl_dir, tmp_path):
    step = sharded_checkpoint(tiny_qwen2_5_vl_dir, tmp_path / "run")
    marker, extra = tmp_path / "marker", step / "actor" / extra_state_name(0)
    plant(extra, marker, zip_format=True)
    model = load_model(str(tiny_qwen2_5_vl_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(CheckpointError, match="refused to load") as caught:
        load_component(step / "actor", model, optimizer, None)
    assert str(extra) in str(caught.value)
    assert not marker.exists()


def test_crafted_dcp_metadata_is_refused_before_torch_reads_it(process_group, tiny_qwen2_5_vl_dir, tmp_path):
    """torch reads a DCP directory's .metadata with a plain pickle.load; easyr1 checks it first, both when choosing
    the checkpoint to resume and when loading it."""
    step = sharded_checkpoint(tiny_qwen2_5_vl_dir, tmp_path / "run")
    marker, metadata = tmp_path / "marker", step / "actor" / "optimizer" / ".metadata"
    metadata.write_bytes(pickle.dumps(CreatesMarker(marker)))
    with pytest.raises(CheckpointError, match="refused to load") as caught:
        CheckpointDirectory(tmp_path / "run").resume_path(None, find_last_checkpoint=True)
    assert str(metadata) in str(caught.value)
    model = load_model(str(tiny_qwen2_5_vl_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    with pytest.raises(CheckpointError, match="refused to load") as caught:
        load_component(step / "actor", model, torch.optim.AdamW(model.parameters(), lr=1e-2), None)
    assert str(metadata) in str(caught.value)
    assert not marker.exists()


class EnumsByName(pickle.Pickler):
    """Pickles enum members as ``getattr(EnumClass, "NAME")``, as CPython 3.11.2 (Debian 12's python3) does."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def dcp_metadata_of_one_tensor() -> Metadata:
    """A DCP metadata value with the enum members a real one holds (memory format, planner item type)."""
    properties = TensorProperties(dtype=torch.float32)
    chunk = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2]))
    tensor = TensorStorageMetadata(properties=properties, size=torch.Size([2]), chunks=[chunk])
    return Metadata(state_dict_metadata={"w": tensor}, planner_data={"w": WriteItemType.TENSOR})


def test_dcp_metadata_with_enum_members_pickled_by_name_loads(tmp_path):
    """A checkpoint written under Python 3.11.2 (the Debian image's python) resumes: its enum members are pickled
    through builtins.getattr, which stands only for a member of an allowed enum."""
    metadata = dcp_metadata_of_one_tensor()
    with open(tmp_path / ".metadata", "wb") as file:
        EnumsByName(file).dump(metadata)
    assert b"getattr" in (tmp_path / ".metadata").read_bytes()
    check_dcp_metadata(tmp_path)  # no CheckpointError
    with open(tmp_path / ".metadata", "rb") as file:
        assert pickle.load(file) == metadata


def test_getattr_in_dcp_metadata_reaches_nothing_but_enum_members(tmp_path):
    """builtins.getattr on an allowed value (a Path's unlink, pickled as a bound method) is refused, not called."""
    marker = tmp_path / "marker"
    marker.touch()

    class UnlinksMarker:
        def __reduce__(self):
            return marker.unlink, ()  # a bound method pickles as getattr(PosixPath(marker), "unlink")

    (tmp_path / ".metadata").write_bytes(pickle.dumps(UnlinksMarker()))
    assert b"getattr" in (tmp_path / ".metadata").read_bytes()
    with pytest.raises(CheckpointError, match="refused to load"):
        check_dcp_metadata(tmp_path)
    assert marker.exists()


def test_crafted_trainer_state_stops_the_cli_before_it_runs(
    process_group, tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path, rank_environment
):
    step = sharded_checkpoint(tiny_qwen2_5_vl_dir, tmp_path / "run")
    dist.destroy_process_group()  # the run below is the only rank of its own group
    marker = tmp_path / "marker"
    plant(step / TRAINER_STATE_NAME, marker, zip_format=True)
    run = train(
        [
            f"config={REPO / 'examples' / 'config_cpu.yaml'}",
            f"worker.actor.model.model_path={tiny_qwen2_5_vl_dir}",
            f"data.train_files={tiny_dataset_dir / 'train.jsonl'}",
            f"worker.reward.reward_function={REPO / 'reward_function' / 'shape_color.py'}:compute_score",
            f"trainer.save_checkpoint_path={tmp_path / 'run'}",
            f"trainer.load_checkpoint_path={step}",
            "trainer.max_steps=3",
            *ONE_PROCESS,
        ]
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"easyr1: error: {step / TRAINER_STATE_NAME}: refused to load" in run.stderr, run.stderr[-2000:]
    assert not marker.exists()


def test_rng_state_is_plain_data_and_restores_every_generator(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.standard_normal()  # numpy keeps half a Gaussian pair: that cached value is part of the state
    save_durably({"rng": rng_state()}, tmp_path / "state.pt")
    expected = generators_draw()
    generators_draw()
    set_rng_state(load_state_file(tmp_path / "state.pt")["rng"])
    assert generators_draw() == expected


def test_rng_state_of_older_checkpoints_still_loads(tmp_path):
    """Before this format, the numpy state was numpy's own tuple with an array: such files still load (numpy's
    array reconstruction is all they need) and restore the same streams."""
    np.random.seed(7), random.seed(7), torch.manual_seed(7)
    older = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    assert isinstance(older["numpy"][1], np.ndarray)
    save_durably({"rng": older}, tmp_path / "older.pt")
    expected = generators_draw()
    set_rng_state(load_state_file(tmp_path / "older.pt")["rng"])
    assert generators_draw() == expected
