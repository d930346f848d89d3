import numpy as np
import pytest
import torch

from easyr1.protocol import Batch


def make_batch(n: int = 6) -> Batch:
    return Batch(
        tensors={"x": torch.arange(n * 2).reshape(n, 2), "y": torch.arange(n).float()},
        non_tensors={"name": [f"s{i}" for i in range(n)], "images": [[i] * (i % 3) for i in range(n)]},
        meta={"temperature": 1.0},
    )


def test_fields_must_agree_on_length():
    with pytest.raises(ValueError, match="disagree"):
        Batch(tensors={"x": torch.zeros(3)}, non_tensors={"y": [1, 2]})


def test_nested_lists_stay_one_object_per_sample():
    batch = make_batch()
    assert batch["images"].shape == (6,)
    assert batch["images"][4] == [4]
    assert batch["images"][3] == []


def test_chunk_and_concat_round_trip():
    batch = make_batch()
    parts = batch.chunk(3)
    assert [len(part) for part in parts] == [2, 2, 2]
    assert parts[1]["name"].tolist() == ["s2", "s3"]
    merged = Batch.concat(parts)
    assert torch.equal(merged["x"], batch["x"])
    assert merged["name"].tolist() == batch["name"].tolist()
    assert merged.meta == batch.meta


def test_chunk_rejects_uneven_split():
    with pytest.raises(ValueError, match="equal parts"):
        make_batch(5).chunk(2)


def test_split_keeps_remainder():
    assert [len(part) for part in make_batch(5).split(2)] == [2, 2, 1]


def test_repeat_interleaved_and_tiled():
    batch = make_batch(3)
    interleaved = batch.repeat(2, interleave=True)
    assert interleaved["name"].tolist() == ["s0", "s0", "s1", "s1", "s2", "s2"]
    assert torch.equal(interleaved["y"], torch.tensor([0.0, 0, 1, 1, 2, 2]))
    tiled = batch.repeat(2, interleave=False)
    assert tiled["name"].tolist() == ["s0", "s1", "s2", "s0", "s1", "s2"]


def test_index_union_select_pop():
    batch = make_batch()
    picked = batch.index([5, 0])
    assert picked["name"].tolist() == ["s5", "s0"]
    assert torch.equal(picked["x"], torch.tensor([[10, 11], [0, 1]]))
    other = Batch(tensors={"z": torch.ones(6)}, non_tensors={"uid": np.array(list("abcdef"), dtype=object)})
    merged = batch.union(other)
    assert "z" in merged and "uid" in merged and "x" in merged
    with pytest.raises(ValueError, match="cannot merge"):
        batch.union(make_batch(2))
    selected = merged.select("x", "uid")
    assert set(selected.tensors) == {"x"} and set(selected.non_tensors) == {"uid"}
    popped = merged.pop("z")
    assert "z" not in merged and torch.equal(popped["z"], torch.ones(6))


def test_setitem_checks_length_and_missing_key_message():
    batch = make_batch()
    batch["w"] = torch.zeros(6)
    with pytest.raises(ValueError, match="samples"):
        batch["v"] = torch.zeros(5)
    with pytest.raises(KeyError, match="no field 'nope'"):
        batch["nope"]
