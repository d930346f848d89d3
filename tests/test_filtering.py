"""DAPO online filtering of prompt groups by their mean score (EasyR1's rule) against a plain-python reference."""

import random

import numpy as np
import pytest
import torch

from easyr1.algorithms import filter_groups
from easyr1.errors import ConfigError


def filter_reference(scores: list[float], labels: list, low: float, high: float) -> list[int]:
    kept = []
    for i, label in enumerate(labels):
        group = [scores[j] for j in range(len(scores)) if labels[j] == label]
        mean = sum(group) / len(group)
        if low < mean < high:
            kept.append(i)
    return kept


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("low", "high"), [(0.01, 0.99), (0.3, 0.7), (-1.0, 2.0)])
def test_filter_groups_matches_reference(seed: int, low: float, high: float) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 4, 5]) for _ in range(rng.randint(1, 12))]
    labels = [f"uid-{g}" for g, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(labels)
    accuracy = [float(rng.random() < 0.5) for _ in labels]  # 0/1 rewards: many all-equal groups
    overall = [rng.random() for _ in labels]
    scores = {"overall": torch.tensor(overall), "accuracy": accuracy}
    for key, values in (("accuracy", accuracy), ("overall", overall)):
        kept = filter_groups(scores, np.array(labels, dtype=object), key, low, high)
        assert kept.dtype == torch.long
        assert kept.tolist() == filter_reference([float(v) for v in torch.tensor(values)], labels, low, high)


def test_all_equal_groups_are_dropped_and_order_is_preserved() -> None:
    accuracy = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    index = np.array(["a", "a", "b", "c", "b", "d", "d", "c", "a"], dtype=object)
    kept = filter_groups({"overall": accuracy}, index)
    assert kept.tolist() == []  # every group is all right (a, c) or all wrong (b, d)
    accuracy[4] = 1.0  # group b becomes mixed (0, 1)
    assert filter_groups({"overall": accuracy}, index).tolist() == [2, 4]


def test_bounds_are_exclusive_and_nan_groups_are_dropped() -> None:
    scores = {"overall": [0.0, 0.5, 0.25, 0.75, float("nan"), 0.5]}  # group means 0.25, 0.5, nan
    index = [0, 0, 1, 1, 2, 2]
    assert filter_groups(scores, index, filter_low=0.25, filter_high=0.6).tolist() == [2, 3]
    assert filter_groups(scores, index, filter_low=0.2, filter_high=0.5).tolist() == [0, 1]


def test_unknown_filter_key_names_the_available_scores() -> None:
    with pytest.raises(ConfigError, match="algorithm.filter_key='acc'.*accuracy, format, overall"):
        filter_groups({"overall": [1.0], "accuracy": [1.0], "format": [1.0]}, [0], filter_key="acc")
    with pytest.raises(ValueError, match="one label per sample"):
        filter_groups({"overall": [1.0, 0.0]}, [0, 0, 1])
