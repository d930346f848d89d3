"""How a sequence-parallel group shares a forward's images (distributed/sequence_parallel.py: balanced_shares)."""

from __future__ import annotations

import itertools

import pytest

from easyr1.distributed.sequence_parallel import balanced_shares


def _best_largest(costs: list[int], size: int) -> int:
    """The smallest possible largest share, by trying every way to cut ``costs`` into ``size`` non-empty runs."""
    best = sum(costs)
    for cuts in itertools.combinations(range(1, len(costs)), size - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[start:end]) for start, end in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize(
    ("costs", "size"),
    [([256] * 8, 2), ([1024, 64, 64, 64], 2), ([64, 64, 64, 1024], 4), ([5, 1, 1, 1, 1, 9, 2], 3), ([7, 7], 2)],
)
def test_shares_are_contiguous_non_empty_and_as_balanced_as_can_be(costs, size):
    shares = balanced_shares(costs, size)
    assert len(shares) == size and shares[0][0] == 0 and shares[-1][1] == len(costs)
    assert all(start < end for start, end in shares)  # every member encodes an image: its tower gets gradients
    assert all(first[1] == second[0] for first, second in zip(shares, shares[1:]))
    assert max(sum(costs[start:end]) for start, end in shares) == _best_largest(costs, size)


def test_fewer_images_than_members_are_refused():
    with pytest.raises(ValueError, match="cannot be shared"):
        balanced_shares([10], 2)
