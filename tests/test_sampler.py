"""The resumable prompt stream: epoch orders from (seed, epoch), exact continuation after a restore."""

import pytest

from easyr1.data.sampler import PromptStream


def collate(rows: list[int]) -> list[int]:
    return list(rows)


def stream(size: int = 10, batch_size: int = 3, shuffle: bool = True, seed: int = 7) -> PromptStream:
    return PromptStream(list(range(size)), batch_size, shuffle, seed, collate)


def test_every_epoch_is_a_permutation_without_repeats():
    prompts = stream()
    assert prompts.steps_per_epoch == 3
    epochs = [[i for _ in range(3) for i in prompts.next()] for _ in range(3)]
    for epoch in epochs:
        assert len(epoch) == len(set(epoch)) == 9  # drop_last: one row left out per epoch
    assert epochs[0] != epochs[1]  # each epoch has its own order


def test_unshuffled_stream_is_in_order():
    prompts = stream(shuffle=False)
    assert [prompts.next() for _ in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]


@pytest.mark.parametrize("taken", [0, 1, 2, 3, 4, 7])
def test_restored_stream_continues_exactly(taken):
    reference = stream()
    expected = [reference.next() for _ in range(taken + 5)]
    first = stream()
    for _ in range(taken):
        first.next()
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    assert [resumed.next() for _ in range(5)] == expected[taken:]


def test_seed_changes_the_order():
    assert stream(seed=1).next() != stream(seed=2).next()
