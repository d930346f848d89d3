"""Advantage estimators (grpo_passk, rloo, REINFORCE++, REINFORCE++-baseline, ReMax, GAE) against float64 loops."""

import math
import random

import numpy as np
import pytest
import torch

from easyr1.algorithms import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_gae_advantages,
    compute_grpo_passk_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    masked_whiten,
)


SHAPES = [(1, 1), (5, 3), (12, 7), (24, 16)]


def random_mask(batch: int, length: int, generator: torch.Generator, allow_empty: bool = True) -> torch.Tensor:
    """Right-padded response mask with random lengths (0 allowed when allow_empty)."""
    low = 0 if allow_empty else 1
    lengths = torch.randint(low, length + 1, (batch,), generator=generator)
    return (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()


def random_groups(batch: int, rng: random.Random) -> list[str]:
    """Shuffled group labels with group sizes 1..4 (singletons included)."""
    labels: list[str] = []
    while len(labels) < batch:
        labels += [f"uid-{len(labels)}"] * rng.randint(1, 4)
    labels = labels[:batch]
    rng.shuffle(labels)
    return labels


def outcome_rewards(mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Scores on the last valid token (rows without valid tokens get nothing)."""
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        length = int(mask[i].sum())
        if length:
            rewards[i, length - 1] = scores[i]
    return rewards


def whiten_reference(values: list[list[float]], mask: list[list[int]], eps: float = 1e-8) -> list[list[float]]:
    """Batch whitening over valid entries with the unbiased variance (0 for a single entry), 0 elsewhere."""
    valid = [v for row, m_row in zip(values, mask) for v, m in zip(row, m_row) if m]
    if not valid:
        return [[0.0] * len(row) for row in values]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1) if len(valid) > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + eps) if m else 0.0 for v, m in zip(row, m_row)]
        for row, m_row in zip(values, mask)
    ]


def broadcast(per_seq: list[float], mask: torch.Tensor) -> list[list[float]]:
    return [[per_seq[i] if mask[i, t] else 0.0 for t in range(mask.shape[1])] for i in range(mask.shape[0])]


def assert_matches(actual: torch.Tensor, expected: list[list[float]], tol: float = 1e-9) -> None:
    assert actual.shape == (len(expected), len(expected[0]))
    for i, row in enumerate(expected):
        for t, want in enumerate(row):
            assert actual[i, t].item() == pytest.approx(want, abs=tol, rel=tol), (i, t)


def group_members(labels: list[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        members.setdefault(label, []).append(i)
    return members


# ----------------------------------------------------------------------------------------------------------------
# Whitening


@pytest.mark.parametrize(("batch", "length"), SHAPES)
def test_masked_whiten_matches_reference(batch: int, length: int) -> None:
    generator = torch.Generator().manual_seed(batch * 100 + length)
    values = torch.randn(batch, length, generator=generator, dtype=torch.float64) * 3 + 1
    mask = random_mask(batch, length, generator)
    values[mask == 0] = float("nan")  # whatever sits under the mask must not leak
    whitened = masked_whiten(values, mask)
    assert_matches(whitened, whiten_reference(values.tolist(), mask.tolist()))
    if mask.sum() > 1:
        assert whitened[mask.bool()].mean().item() == pytest.approx(0.0, abs=1e-12)


def test_masked_whiten_of_empty_and_single_entry() -> None:
    assert torch.equal(masked_whiten(torch.ones(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3, dtype=torch.float64))
    single = masked_whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[0, 1]]))
    assert torch.equal(single, torch.zeros(1, 2, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------------------
# GRPO pass@k


def passk_reference(scores: list[float], labels: list[str], eps: float, norm: bool) -> list[float]:
    result = [0.0] * len(scores)
    for members in group_members(labels).values():
        if len(members) < 2:
            continue
        ordered = sorted(members, key=lambda i: scores[i], reverse=True)
        best, second = scores[ordered[0]], scores[ordered[1]]
        gap = best - second
        if norm:
            group = [scores[i] for i in members]
            mean = sum(group) / len(group)
            std = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1))
            gap = gap / (std + eps)
        if gap:  # a tie for the best gives everybody 0, whichever of the tied responses is picked
            result[ordered[0]] = gap
    return result


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_matches_reference(batch: int, length: int, norm: bool) -> None:
    generator = torch.Generator().manual_seed(batch + length)
    rng = random.Random(batch)
    labels = random_groups(batch, rng)
    mask = random_mask(batch, length, generator, allow_empty=False)
    scores = torch.rand(batch, generator=generator, dtype=torch.float64)
    advantages, returns = compute_grpo_passk_advantages(
        outcome_rewards(mask, scores), mask, np.array(labels, dtype=object), norm_adv_by_std=norm
    )
    assert_matches(advantages, broadcast(passk_reference(scores.tolist(), labels, 1e-6, norm), mask))
    assert torch.equal(advantages, returns)


def test_grpo_passk_rewards_only_the_best_and_ignores_ties_and_singletons() -> None:
    scores = torch.tensor([0.0, 1.0, 0.5, 1.0, 1.0, 0.0, 0.3, 0.3, 0.3, 0.9])
    labels = np.array(["a", "a", "a", "b", "b", "b", "c", "c", "c", "d"], dtype=object)
    advantages, _ = compute_grpo_passk_advantages(scores, torch.ones(10, 2), labels, eps=0.0)
    # group a: best 1.0, second 0.5, std 0.5 -> (1 - 0.5) / 0.5 = 1 for the best only
    expected = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(advantages[:, 0], expected)  # b: tie at the top; c: all equal; d: singleton


# ----------------------------------------------------------------------------------------------------------------
# RLOO


def rloo_reference(scores: list[float], labels: list[str]) -> list[float]:
    result = []
    members = group_members(labels)
    for i, label in enumerate(labels):
        others = [scores[j] for j in members[label] if j != i]
        result.append(scores[i] - sum(others) / len(others) if others else 0.0)
    return result


@pytest.mark.parametrize(("batch", "length"), SHAPES)
def test_rloo_matches_reference(batch: int, length: int) -> None:
    generator = torch.Generator().manual_seed(batch * 7 + length)
    labels = random_groups(batch, random.Random(length))
    mask = random_mask(batch, length, generator)
    scores = torch.randint(0, 3, (batch,), generator=generator).double() * 0.5  # ties and all-equal groups
    advantages, returns = compute_rloo_advantages(outcome_rewards(mask, scores), mask, labels)
    # all-masked rows have no reward token: their score is 0 in the reference too
    row_scores = [scores[i].item() if mask[i].any() else 0.0 for i in range(batch)]
    assert_matches(advantages, broadcast(rloo_reference(row_scores, labels), mask))
    assert torch.equal(advantages, returns)


def test_rloo_is_rescaled_group_centring_and_zero_for_equal_scores() -> None:
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    index = np.array([0, 0, 0, 0, 1, 1])
    advantages, _ = compute_rloo_advantages(scores, torch.ones(6, 1), index)
    # n / (n - 1) * (s - mean): group 0 has mean 0.5 and n = 4
    torch.testing.assert_close(advantages[:4, 0], 4 / 3 * (scores[:4] - 0.5))
    assert torch.all(advantages[4:] == 0)


# ----------------------------------------------------------------------------------------------------------------
# REINFORCE++


def discounted_returns_reference(rewards: list[list[float]], mask: list[list[int]], gamma: float) -> list[list[float]]:
    """G_t = r_t + gamma * G_next over the valid tokens only (masked ones skipped, their rewards ignored); 0 on
    masked tokens."""
    result = []
    for row, m_row in zip(rewards, mask):
        returns = [0.0] * len(row)
        following = 0.0
        for t in reversed(range(len(row))):
            if m_row[t]:
                following = row[t] + gamma * following
                returns[t] = following
        result.append(returns)
    return result


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_reference(batch: int, length: int, gamma: float) -> None:
    generator = torch.Generator().manual_seed(batch * 3 + length)
    mask = random_mask(batch, length, generator)
    if length > 2:
        mask[0, 1] = 0  # a hole inside a response (e.g. an observation token): skipped, not a boundary
    # dense token rewards (e.g. a KL penalty on every token), also under the mask, where they must not leak in
    rewards = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    advantages, returns = compute_reinforce_plus_plus_advantages(rewards, mask, gamma=gamma)
    expected_returns = discounted_returns_reference(rewards.tolist(), mask.tolist(), gamma)
    assert_matches(returns, expected_returns)
    assert_matches(advantages, whiten_reference(expected_returns, mask.tolist()))


def test_reinforce_plus_plus_outcome_reward_with_discount() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    _, returns = compute_reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0, 0.0]], dtype=torch.float64))


def rfpp_baseline_reference(scores: list[float], labels: list[str], mask: torch.Tensor) -> list[list[float]]:
    members = group_members(labels)
    centred = []
    for i, label in enumerate(labels):
        group = [scores[j] for j in members[label]]
        baseline = sum(group) / len(group) if len(group) > 1 else 0.0
        centred.append(scores[i] - baseline)
    return whiten_reference(broadcast(centred, mask), mask.tolist())


@pytest.mark.parametrize(("batch", "length"), SHAPES)
def test_reinforce_plus_plus_baseline_matches_reference(batch: int, length: int) -> None:
    generator = torch.Generator().manual_seed(batch * 5 + length)
    labels = random_groups(batch, random.Random(batch + 1))
    mask = random_mask(batch, length, generator)
    scores = torch.rand(batch, generator=generator, dtype=torch.float64)
    advantages, returns = compute_reinforce_plus_plus_baseline_advantages(outcome_rewards(mask, scores), mask, labels)
    row_scores = [scores[i].item() if mask[i].any() else 0.0 for i in range(batch)]
    assert_matches(advantages, rfpp_baseline_reference(row_scores, labels, mask))
    assert torch.equal(advantages, returns)


def test_reinforce_plus_plus_baseline_of_equal_scores_is_zero() -> None:
    advantages, _ = compute_reinforce_plus_plus_baseline_advantages(
        torch.full((4,), 0.7), torch.ones(4, 3), np.array([0, 0, 1, 1])
    )
    assert torch.all(advantages == 0)


# ----------------------------------------------------------------------------------------------------------------
# ReMax


@pytest.mark.parametrize(("batch", "length"), SHAPES)
def test_remax_matches_reference(batch: int, length: int) -> None:
    generator = torch.Generator().manual_seed(batch * 11 + length)
    mask = random_mask(batch, length, generator)
    rewards = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    baselines = torch.rand(batch, generator=generator, dtype=torch.float64)
    advantages, returns = compute_remax_advantages(rewards, mask, baselines)
    m, r = mask.tolist(), rewards.tolist()
    scores = [sum(v for v, k in zip(r[i], m[i]) if k) for i in range(batch)]
    assert_matches(advantages, broadcast([scores[i] - baselines[i].item() for i in range(batch)], mask))
    to_go = [
        [sum(r[i][u] for u in range(t, length) if m[i][u]) if m[i][t] else 0.0 for t in range(length)]
        for i in range(batch)
    ]
    assert_matches(returns, to_go)


def test_remax_rejects_missing_baselines() -> None:
    with pytest.raises(ValueError, match="one greedy-rollout score per sample"):
        compute_remax_advantages(torch.zeros(3, 2), torch.ones(3, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantages("remax", token_level_rewards=torch.zeros(3, 2), response_mask=torch.ones(3, 2))


# ----------------------------------------------------------------------------------------------------------------
# GAE


def gae_reference(
    rewards: list[list[float]], values: list[list[float]], mask: list[list[int]], gamma: float, lam: float
) -> list[list[float]]:
    """Backward recursion over the valid tokens of each row only; masked tokens are skipped."""
    result = []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        advantages = [0.0] * len(r_row)
        next_value, next_advantage = 0.0, 0.0
        for t in reversed(range(len(r_row))):
            if not m_row[t]:
                continue
            delta = r_row[t] + gamma * next_value - v_row[t]
            advantages[t] = delta + gamma * lam * next_advantage
            next_value, next_advantage = v_row[t], advantages[t]
        result.append(advantages)
    return result


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_reference(batch: int, length: int, gamma: float, lam: float) -> None:
    generator = torch.Generator().manual_seed(batch * 13 + length)
    mask = random_mask(batch, length, generator)
    if length > 3:
        mask[-1, :] = torch.tensor([1, 0] + [1] * (length - 2))  # a hole: skipped, not a boundary
    rewards = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    values = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    advantages, returns = compute_gae_advantages(rewards, mask, values, gamma=gamma, lam=lam)
    raw = gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    m, v = mask.tolist(), values.tolist()
    assert_matches(returns, [[raw[i][t] + v[i][t] if m[i][t] else 0.0 for t in range(length)] for i in range(batch)])
    assert_matches(advantages, whiten_reference(raw, m))


def test_gae_with_lambda_one_gives_reward_to_go_returns() -> None:
    rewards = torch.tensor([[0.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    values = torch.tensor([[0.3, -0.2, 0.5, 9.0], [1.0, 0.4, 9.0, 9.0]], dtype=torch.float64)
    _, returns = compute_gae_advantages(rewards, mask, values, gamma=1.0, lam=1.0)
    torch.testing.assert_close(
        returns, torch.tensor([[2.0, 2.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    )


def test_gae_rejects_missing_or_misshapen_values() -> None:
    with pytest.raises(ValueError, match="needs \\['values'\\]"):
        compute_advantages("gae", token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae_advantages(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 4))


# ----------------------------------------------------------------------------------------------------------------
# Every estimator through the registry


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_estimator_accepts_the_trainer_inputs_and_respects_the_mask(name: str) -> None:
    generator = torch.Generator().manual_seed(42)
    batch, length = 8, 6
    mask = random_mask(batch, length, generator)
    mask[3] = 0  # an all-masked row
    scores = torch.rand(batch, generator=generator)
    inputs = {
        "token_level_rewards": outcome_rewards(mask, scores).float(),
        "response_mask": mask,
        "index": np.array([f"p{i // 4}" for i in range(batch)], dtype=object),
        "gamma": 1.0,
        "lam": 0.95,
        "norm_adv_by_std": True,
        "values": torch.randn(batch, length, generator=generator),
        "reward_baselines": torch.rand(batch, generator=generator),
        "turn_ids": torch.where(mask.bool(), 0, -1),  # one turn per sample
        "turn_gamma": 0.9,
        "turn_lam": 0.8,
    }
    advantages, returns = compute_advantages(name, **inputs)
    assert advantages.shape == returns.shape == (batch, length)
    assert advantages.dtype == torch.float32 and returns.dtype == torch.float32
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert torch.all(advantages[mask == 0] == 0) and torch.all(returns[mask == 0] == 0)


@pytest.mark.parametrize("name", ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline"])
def test_group_estimators_give_equal_scores_zero_advantage(name: str) -> None:
    advantages, _ = compute_advantages(
        name, token_level_rewards=torch.ones(6), response_mask=torch.ones(6, 2), index=np.repeat([0, 1], 3)
    )
    assert torch.all(advantages == 0)


def test_each_estimator_declares_the_inputs_its_signature_asks_for():
    """An estimator reading ``values`` must declare a critic, one reading ``reward_baselines`` a greedy baseline: the
    trainer builds these from the declaration, not from the estimator's name."""
    import inspect

    from easyr1.algorithms.advantage import ADV_ESTIMATORS, estimator_needs

    for name in ADV_ESTIMATORS.names():
        parameters = inspect.signature(ADV_ESTIMATORS.get(name)).parameters
        needs = estimator_needs(name)
        assert needs.critic == ("values" in parameters), name
        assert needs.greedy_baseline == ("reward_baselines" in parameters), name
        assert needs.turn_ids == ("turn_ids" in parameters), name
