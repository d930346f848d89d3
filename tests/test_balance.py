"""Sequence-length balancing across workers."""

import random

import pytest

from easyr1.distributed.balance import balanced_order


def chunk_loads(order: list[int], counts: list[int], parts: int) -> list[int]:
    size = len(order) // parts
    return [sum(counts[i] for i in order[k * size : (k + 1) * size]) for k in range(parts)]


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_balanced_order_is_a_permutation_with_close_chunk_totals(parts):
    rng = random.Random(parts)
    counts = [rng.randint(10, 500) for _ in range(32)]
    order = balanced_order(counts, parts)
    assert sorted(order) == list(range(32))
    loads = chunk_loads(order, counts, parts)
    assert max(loads) - min(loads) <= max(counts)


def test_balancing_beats_consecutive_chunks_on_sorted_lengths():
    counts = list(range(100, 0, -1))  # long samples first: consecutive chunks are as unequal as can be
    naive = chunk_loads(list(range(100)), counts, 4)
    balanced = chunk_loads(balanced_order(counts, 4), counts, 4)
    assert max(naive) - min(naive) > 1000 and max(balanced) - min(balanced) <= 4


def test_unequal_split_is_rejected():
    with pytest.raises(ValueError, match="equal parts"):
        balanced_order([1, 2, 3], 2)


def test_groups_stay_on_one_worker_and_chunks_stay_close():
    rng = random.Random(7)
    n, prompts, parts = 4, 8, 2
    labels = [f"p{g}" for g in range(prompts) for _ in range(n)]  # interleaved like the trainer's aabb
    counts = [rng.randint(10, 300) for _ in labels]
    order = balanced_order(counts, parts, groups=labels)
    assert sorted(order) == list(range(len(labels)))
    size = len(order) // parts
    for k in range(parts):
        chunk_labels = {labels[i] for i in order[k * size : (k + 1) * size]}
        assert len(chunk_labels) == prompts // parts  # every group whole, in one chunk
    group_loads = [sum(counts[g * n : (g + 1) * n]) for g in range(prompts)]
    loads = chunk_loads(order, counts, parts)
    assert max(loads) - min(loads) <= max(group_loads)


def test_groups_that_cannot_fill_equal_chunks_are_balanced_sample_by_sample():
    labels = ["a"] * 4 + ["b"] * 4 + ["c"] * 4  # three groups over two workers
    counts = list(range(12, 0, -1))
    assert balanced_order(counts, 2, groups=labels) == balanced_order(counts, 2)
    uneven = ["a"] * 3 + ["b"] * 5
    assert balanced_order(counts[:8], 2, groups=uneven) == balanced_order(counts[:8], 2)
