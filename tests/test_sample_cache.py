"""The per-step sample cache on 2 Ray workers: methods see the same batch as without it, heavy fields travel once."""

from __future__ import annotations

import re

import pytest
import ray
import torch
from helpers import start_ray, training_batch

from easyr1.distributed import Worker, WorkerGroup
from easyr1.distributed.sample_cache import SampleCacheMiss
from easyr1.protocol import Batch


pytestmark = pytest.mark.ray


VISION = "multi_modal_inputs"
NUM_PROMPTS, N = 4, 2


class Recorder(Worker):
    """Keeps every batch a method received; ``generate_like`` passes the prompt's objects through, as generate does."""

    def __init__(self) -> None:
        self.received: list[Batch] = []

    def generate_like(self, batch: Batch) -> Batch:
        self.received.append(batch)
        out = batch.union(Batch())
        out["made_here"] = batch["sample_id"] * 2
        return out

    def log_probs_like(self, batch: Batch) -> Batch:
        self.received.append(batch)
        return Batch(tensors={"row_sum": batch["input_ids"].sum(dim=-1)})

    def take_received(self) -> list[Batch]:
        received, self.received = self.received, []
        return received

    def cache_entries(self) -> int:
        return len(self.sample_cache)

    def clear_sample_cache(self) -> None:
        self.clears = getattr(self, "clears", 0) + 1
        super().clear_sample_cache()

    def clear_count(self) -> int:
        return getattr(self, "clears", 0)


def assert_same_batch(got: Batch, expected: Batch) -> None:
    """Same fields in the same order, equal tensors (dtype and shape included) and equal per-row objects."""
    assert list(got.tensors) == list(expected.tensors)
    assert list(got.non_tensors) == list(expected.non_tensors)
    assert got.meta == expected.meta
    for name, value in expected.tensors.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name], value), name
    for name, column in expected.non_tensors.items():
        assert len(got[name]) == len(column)
        for mine, theirs in zip(got[name], column):
            if isinstance(theirs, dict):
                assert mine.keys() == theirs.keys()
                assert all(torch.equal(mine[key], theirs[key]) for key in theirs)
            else:
                assert mine == theirs


def check_received(group: WorkerGroup, batch: Batch) -> None:
    """Each rank's method got exactly its consecutive chunk of ``batch`` (what it gets without the cache)."""
    for received, expected in zip(group.run_all(Recorder.take_received), batch.chunk(group.num_workers)):
        assert len(received) == 1
        assert_same_batch(received[0], expected)


@pytest.fixture(scope="module")
def group():
    start_ray()
    workers = WorkerGroup(Recorder, 2)
    yield workers
    workers.shutdown()


@pytest.fixture(scope="module")
def samples(tiny_qwen2_5_vl_dir, tiny_dataset_dir) -> Batch:
    """Generated-looking samples: ``N`` per prompt (sharing the prompt's vision objects), each with its own id."""
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, NUM_PROMPTS).repeat(N)
    batch["sample_id"] = torch.arange(len(batch)) + 1000
    batch.meta["temperature"] = 1.0
    assert all(row["pixel_values"].numel() for row in batch[VISION])
    return batch


def prompt_view(batch: Batch) -> Batch:
    """What generation gets: the prompt's objects and the sample ids, no responses."""
    view = batch.select("sample_id", "raw_prompt_ids", "ground_truth", VISION)
    view["input_ids"] = batch["prompts"]
    return view


def actor_view(batch: Batch) -> Batch:
    return batch.select(
        "input_ids", "attention_mask", "position_ids", "responses", "response_mask", VISION, "sample_id"
    )


def test_heavy_fields_travel_once_per_step_and_methods_see_the_full_batch(group, samples):
    vision_rows = len(samples)
    group.open_step()
    assert group.run_all(Recorder.cache_entries) == [0, 0]

    # generation: every row's vision tensors go once; the objects come back as the driver's own copies
    prompts = prompt_view(samples)
    out = group.run_split(Recorder.generate_like, prompts)
    check_received(group, prompts)
    generation = group.transfers[-1]
    assert generation.rows_sent == {VISION: vision_rows}
    assert_same_batch(out.select(*prompts.non_tensors), prompts.select(*prompts.non_tensors))
    assert torch.equal(out["made_here"], prompts["sample_id"] * 2)
    # the pass-through objects (vision tensors included) did not travel back
    assert generation.bytes_from_workers < generation.bytes_to_workers / 10

    # first pass after generation: the vision tensors are reused, the token tensors go once
    view = actor_view(samples)
    result = group.run_split(Recorder.log_probs_like, view)
    check_received(group, view)
    assert torch.equal(result["row_sum"], view["input_ids"].sum(dim=-1))
    first = group.transfers[-1]
    assert first.rows_sent[VISION] == 0
    assert first.rows_sent["input_ids"] == len(view)

    # second pass: nothing heavy moves, far fewer bytes
    group.run_split(Recorder.log_probs_like, view)
    check_received(group, view)
    second = group.transfers[-1]
    assert set(second.rows_sent.values()) == {0}
    assert second.bytes_to_workers < first.bytes_to_workers / 2

    # balancing moves rows across ranks: exactly the moved rows are sent, once, and the methods still see full rows
    half = len(view) // 2
    order = [*range(1, half, 2), *range(half, len(view), 2), *range(0, half, 2), *range(half + 1, len(view), 2)]
    moved = sum((position < half) != (row < half) for position, row in enumerate(order))
    assert moved > 0
    reordered = view.index(order)
    result = group.run_split(Recorder.log_probs_like, reordered)
    check_received(group, reordered)
    assert torch.equal(result["row_sum"], reordered["input_ids"].sum(dim=-1))
    assert group.transfers[-1].rows_sent[VISION] == moved
    group.run_split(Recorder.log_probs_like, reordered)
    check_received(group, reordered)
    assert set(group.transfers[-1].rows_sent.values()) == {0}

    metrics = group.finish_step()
    assert metrics["perf/bytes_to_workers"] == sum(transfer.bytes_to_workers for transfer in group.transfers)
    assert metrics["perf/bytes_from_workers"] == sum(transfer.bytes_from_workers for transfer in group.transfers)
    assert group.run_all(Recorder.cache_entries) == [0, 0]
    assert not group.router.holders

    # the next step starts empty: the same samples are sent again, and still arrive whole
    group.open_step()
    group.run_split(Recorder.log_probs_like, reordered)
    check_received(group, reordered)
    assert group.transfers[-1].rows_sent[VISION] == vision_rows
    group.finish_step()
    assert group.run_all(Recorder.cache_entries) == [0, 0]


def test_the_workers_are_cleared_only_of_what_a_step_sent(group, samples):
    """One round trip to clear the caches per step that sent rows (at its end), none for opening a step or for a step
    that sent nothing."""
    before = group.run_all(Recorder.clear_count)
    group.open_step()  # the last step closed by clearing: nothing to clear
    group.run_split(Recorder.log_probs_like, actor_view(samples))
    group.finish_step()
    group.open_step()
    group.finish_step()  # nothing sent in this step
    assert [after - earlier for after, earlier in zip(group.run_all(Recorder.clear_count), before)] == [1, 1]
    assert group.run_all(Recorder.cache_entries) == [0, 0]
    group.run_all(Recorder.take_received)


def test_cache_off_and_outside_a_step_send_everything(group, samples):
    view = actor_view(samples)
    group.run_split(Recorder.log_probs_like, view)  # outside a step (validation): no caching at all
    check_received(group, view)
    assert group.transfers[-1].rows_sent == {}
    assert group.run_all(Recorder.cache_entries) == [0, 0]

    group.open_step()
    group.router, router = None, group.router  # trainer.cache_sample_tensors=false
    try:
        for _ in range(2):
            group.run_split(Recorder.log_probs_like, view)
            check_received(group, view)
        off = group.transfers[-1].bytes_to_workers
    finally:
        group.router = router
        group.finish_step()
    group.open_step()
    group.run_split(Recorder.log_probs_like, view)
    group.run_split(Recorder.log_probs_like, view)
    cached_second = group.transfers[-1].bytes_to_workers
    group.finish_step()
    group.run_all(Recorder.take_received)
    # uncached, every pass carries the vision tensors again (and each rank the whole batch's storage)
    vision_bytes = sum(row["pixel_values"].nbytes for row in samples[VISION][::N])
    assert off > vision_bytes > cached_second


def test_a_row_the_rank_never_got_is_an_error_not_a_wrong_tensor(group, samples):
    view = actor_view(samples)
    group.open_step()
    try:
        group.run_split(Recorder.log_probs_like, view)
        group.run_all(Recorder.clear_sample_cache)  # the workers forget, the driver's record does not
        with pytest.raises(ray.exceptions.RayTaskError) as error:
            group.run_split(Recorder.log_probs_like, view)
        assert isinstance(error.value.cause, SampleCacheMiss)
        message = str(error.value.cause)
        assert "never sent it this step" in message and "log_probs_like" in message
        missing = re.search(r"sample (\d+) in", message)
        assert missing and int(missing.group(1)) in view["sample_id"].tolist()
    finally:
        group.finish_step()
        group.run_all(Recorder.take_received)


def test_rows_are_keyed_by_sample_id(group, samples):
    group.open_step()
    try:
        with pytest.raises(ValueError, match="sample_id"):
            view = actor_view(samples)
            view.pop("sample_id")
            group.router.deliveries(view, 2)
    finally:
        group.finish_step()
