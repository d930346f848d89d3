"""Credit assignment on multi-turn trajectories, against numbers worked out by hand from the formulas.

A multi-turn trajectory is one sequence: the model's turns with the environment's tokens between them, so
``response_mask`` has gaps. ``turn_ids`` numbers the model tokens by turn and is -1 elsewhere. Every expected value
below is written out as the arithmetic of the estimator's definition on these small tensors; environment tokens
carry values of 9.0 so that any leak through them would show.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_config import SMALL

from easyr1.algorithms import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_rloo_advantages,
    compute_turn_gae_advantages,
    episode_advantages,
    estimator_needs,
    place_scores_on_last_token,
    place_turn_rewards,
)
from easyr1.config import load_config
from easyr1.envs.base import Environment
from easyr1.envs.registry import ENVIRONMENTS
from easyr1.errors import ConfigError


# Four episodes, two per seed (uid). Row 0: two turns around 2 environment tokens, then padding. Row 1: three turns,
# the middle one a single token. Row 2: one turn. Row 3: three turns, gaps of 2 and 2 tokens.
MASK = torch.tensor(
    [
        [1, 1, 1, 0, 0, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 1, 0, 0],
    ]
)
TURN_IDS = torch.tensor(
    [
        [0, 0, 0, -1, -1, 1, 1, 1, -1, -1],
        [0, 0, -1, -1, -1, 1, -1, 2, 2, 2],
        [0, 0, 0, 0, -1, -1, -1, -1, -1, -1],
        [0, -1, -1, 1, 1, -1, -1, 2, -1, -1],
    ]
)
TURN_REWARDS = [[0.5, 1.0], [0.1, 0.2, 0.3], [2.0], [0.0, 0.0, 1.0]]
UIDS = np.array(["a", "a", "b", "b"], dtype=object)


def on_model_tokens(per_row: list[float]) -> list[list[float]]:
    """One value per row on each of its model tokens, 0 on environment tokens and padding."""
    return [[value if m else 0.0 for m in row] for value, row in zip(per_row, MASK.tolist())]


def whitened(raw: list[list[float]], mask: list[list[int]]) -> list[list[float]]:
    """(x - mean) / sqrt(unbiased var + 1e-8) over the valid entries of all rows; 0 elsewhere."""
    valid = [x for row, m_row in zip(raw, mask) for x, m in zip(row, m_row) if m]
    mean = sum(valid) / len(valid)
    var = sum((x - mean) ** 2 for x in valid) / (len(valid) - 1)
    return [
        [(x - mean) / math.sqrt(var + 1e-8) if m else 0.0 for x, m in zip(row, m_row)] for row, m_row in zip(raw, mask)
    ]


def assert_table(actual: torch.Tensor, expected: list[list[float]]) -> None:
    """Equal to float32 precision (the rewards are float32, as the trainer makes them)."""
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- placement


def test_scores_go_on_the_last_model_token_past_the_gaps() -> None:
    mask = torch.cat([MASK[:2], torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0], [0] * 10])])
    rewards = place_scores_on_last_token(torch.tensor([2.0, -1.0, 3.0, 4.0]), mask)
    expected = torch.zeros(4, 10)
    expected[0, 7] = 2.0  # last 1 of the mask; mask.sum() - 1 would be 5
    expected[1, 9] = -1.0  # mask.sum() - 1 would be 5
    expected[2, 2] = 3.0  # a contiguous mask: mask.sum() - 1
    expected[3, 0] = 4.0  # no model token: position 0, so the row's sum still holds its score
    assert rewards.dtype == torch.float32
    torch.testing.assert_close(rewards, expected, rtol=0, atol=0)


def test_turn_rewards_go_on_each_turns_last_token() -> None:
    rewards = place_turn_rewards(TURN_REWARDS, TURN_IDS)
    expected = torch.zeros(4, 10)
    expected[0, 2], expected[0, 7] = 0.5, 1.0
    expected[1, 1], expected[1, 5], expected[1, 9] = 0.1, 0.2, 0.3
    expected[2, 3] = 2.0
    expected[3, 7] = 1.0  # the two turns rewarded 0.0 leave zeros
    torch.testing.assert_close(rewards, expected, rtol=0, atol=0)


def test_the_reward_of_a_turn_without_tokens_joins_the_turn_before() -> None:
    # Row 0: turn 1 is empty (an immediate end of message), turn 3 too. Row 1: its first turn is empty.
    turn_ids = torch.tensor([[0, 0, -1, -1, 2, 2, -1, -1], [-1, -1, 1, 1, -1, -1, -1, -1]])
    rewards = place_turn_rewards([[1.0, 0.25, 2.0, 0.5], [3.0, 4.0]], turn_ids)
    expected = torch.zeros(2, 8)
    expected[0, 1] = 1.0 + 0.25  # turn 0's last token also takes empty turn 1's reward
    expected[0, 5] = 2.0 + 0.5  # and turn 2's the one of empty turn 3 after it
    expected[1, 0] = 3.0  # no earlier turn: position 0, as for a row without model tokens
    expected[1, 3] = 4.0
    torch.testing.assert_close(rewards, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("turn_rewards", "turn_ids", "message"),
    [
        ([[1.0]], torch.tensor([[0, 0, -1, 1]]), "row 0 has tokens of turn 1 but only 1 turn rewards"),
        ([[1.0], [2.0]], torch.tensor([[0, 0]]), "turn_rewards has 2 rows but turn_ids has 1"),
    ],
)
def test_turn_rewards_that_do_not_match_the_turns_are_refused(turn_rewards, turn_ids, message) -> None:
    with pytest.raises(ValueError, match=message):
        place_turn_rewards(turn_rewards, turn_ids)


# ------------------------------------------------------------------------------------------------ outcome estimators


def episode_rewards() -> torch.Tensor:
    return place_turn_rewards(TURN_REWARDS, TURN_IDS)


def test_grpo_scores_each_episode_by_the_sum_of_its_turn_rewards() -> None:
    # Returns: 0.5 + 1.0 = 1.5, 0.1 + 0.2 + 0.3 = 0.6 (group a); 2.0, 1.0 (group b). Group a: mean 1.05, deviations
    # +-0.45, unbiased std sqrt(2 * 0.45^2 / 1) = 0.45 * sqrt(2); group b likewise with 0.5.
    advantages, returns = compute_grpo_advantages(episode_rewards(), MASK, UIDS)
    a, b = 0.45 / (0.45 * math.sqrt(2) + 1e-6), 0.5 / (0.5 * math.sqrt(2) + 1e-6)
    assert_table(advantages, on_model_tokens([a, -a, b, -b]))
    assert_table(returns, on_model_tokens([a, -a, b, -b]))


def test_rloo_baseline_is_the_other_episode_of_the_same_seed() -> None:
    advantages, _ = compute_rloo_advantages(episode_rewards(), MASK, UIDS)
    assert_table(advantages, on_model_tokens([1.5 - 0.6, 0.6 - 1.5, 2.0 - 1.0, 1.0 - 2.0]))


def test_reinforce_plus_plus_baseline_centres_the_episode_returns() -> None:
    advantages, _ = compute_reinforce_plus_plus_baseline_advantages(episode_rewards(), MASK, UIDS)
    assert_table(advantages, whitened(on_model_tokens([0.45, -0.45, 0.5, -0.5]), MASK.tolist()))


def test_reinforce_plus_plus_returns_carry_later_turns_across_environment_tokens() -> None:
    # G_t = r_t + 0.5 * G_next over model tokens only; the environment tokens neither cut nor discount the sum.
    g = 0.5
    row0 = [0.0] * 10
    row0[7] = 1.0
    row0[6] = g * row0[7]
    row0[5] = g * row0[6]
    row0[2] = 0.5 + g * row0[5]  # 0.625: turn 0 sees turn 1's reward
    row0[1] = g * row0[2]
    row0[0] = g * row0[1]
    row1 = [0.0] * 10
    row1[9] = 0.3
    row1[8] = g * row1[9]
    row1[7] = g * row1[8]
    row1[5] = 0.2 + g * row1[7]
    row1[1] = 0.1 + g * row1[5]
    row1[0] = g * row1[1]
    row2 = [2.0 * g**3, 2.0 * g**2, 2.0 * g, 2.0] + [0.0] * 6
    row3 = [1.0 * g**3, 0, 0, 1.0 * g**2, 1.0 * g, 0, 0, 1.0, 0, 0]
    expected = [row0, row1, row2, row3]
    advantages, returns = compute_reinforce_plus_plus_advantages(episode_rewards().double(), MASK, gamma=g)
    assert_table(returns, expected)
    assert_table(advantages, whitened(expected, MASK.tolist()))


# ---------------------------------------------------------------------------------------------------- GAE

GAMMA, LAM, TURN_GAMMA, TURN_LAM = 0.9, 0.8, 0.5, 0.6

# Rows 0 and 1 of the trajectories above. Row 1's middle turn is rewarded 0.0, which a turn detection from nonzero
# rewards would miss.
TWO_ROW_MASK = MASK[:2]
TWO_ROW_TURNS = TURN_IDS[:2]
TWO_ROW_REWARDS = place_turn_rewards([[0.5, 1.0], [1.0, 0.0, 2.0]], TWO_ROW_TURNS)
TWO_ROW_VALUES = torch.tensor(
    [
        [0.1, 0.2, 0.3, 9.0, 9.0, 0.4, 0.5, 0.6, 9.0, 9.0],
        [0.2, 0.3, 9.0, 9.0, 9.0, 0.7, 9.0, 0.1, 0.4, 0.8],
    ],
    dtype=torch.float64,
)


def test_gae_bootstraps_a_turns_last_token_from_the_next_turns_first_token() -> None:
    g, gl = GAMMA, GAMMA * LAM
    v = TWO_ROW_VALUES.tolist()
    row0 = [0.0] * 10
    row0[7] = 1.0 - v[0][7]
    row0[6] = g * v[0][7] - v[0][6] + gl * row0[7]
    row0[5] = g * v[0][6] - v[0][5] + gl * row0[6]
    row0[2] = 0.5 + g * v[0][5] - v[0][2] + gl * row0[5]  # next value: turn 1's first token, past positions 3-4
    row0[1] = g * v[0][2] - v[0][1] + gl * row0[2]
    row0[0] = g * v[0][1] - v[0][0] + gl * row0[1]
    row1 = [0.0] * 10
    row1[9] = 2.0 - v[1][9]
    row1[8] = g * v[1][9] - v[1][8] + gl * row1[9]
    row1[7] = g * v[1][8] - v[1][7] + gl * row1[8]
    row1[5] = 0.0 + g * v[1][7] - v[1][5] + gl * row1[7]
    row1[1] = 1.0 + g * v[1][5] - v[1][1] + gl * row1[5]
    row1[0] = g * v[1][1] - v[1][0] + gl * row1[1]
    advantages, returns = compute_gae_advantages(TWO_ROW_REWARDS.double(), TWO_ROW_MASK, TWO_ROW_VALUES, GAMMA, LAM)
    raw = [row0, row1]
    mask = TWO_ROW_MASK.tolist()
    assert_table(returns, [[a + vt if m else 0.0 for a, vt, m in zip(*rows)] for rows in zip(raw, v, mask)])
    assert_table(advantages, whitened(raw, mask))


# ---------------------------------------------------------------------------------------------------- turn_gae


def test_turn_gae_discounts_over_turns_then_over_tokens_inside_each_turn() -> None:
    tg, tgl, g, gl = TURN_GAMMA, TURN_GAMMA * TURN_LAM, GAMMA, GAMMA * LAM
    # Row 0: turns end at 2 (V 0.3, r 0.5) and 7 (V 0.6, r 1.0).
    a1 = 1.0 - 0.6  # 0.4
    a0 = 0.5 + tg * 0.6 - 0.3 + tgl * a1  # 0.5 + 0.3 * 0.4 = 0.62
    row0 = [0.0] * 10
    row0[7] = a1
    row0[6] = g * 0.6 - 0.5 + gl * row0[7]  # 0.04 + 0.72 * 0.4 = 0.328
    row0[5] = g * 0.5 - 0.4 + gl * row0[6]  # 0.05 + 0.72 * 0.328 = 0.28616
    row0[2] = a0
    row0[1] = g * 0.3 - 0.2 + gl * row0[2]  # 0.07 + 0.72 * 0.62 = 0.5164
    row0[0] = g * 0.2 - 0.1 + gl * row0[1]  # 0.08 + 0.72 * 0.5164 = 0.451808
    # Row 1: turns end at 1 (V 0.3, r 1.0), 5 (V 0.7, r 0.0) and 9 (V 0.8, r 2.0).
    b2 = 2.0 - 0.8  # 1.2
    b1 = 0.0 + tg * 0.8 - 0.7 + tgl * b2  # -0.3 + 0.36 = 0.06
    b0 = 1.0 + tg * 0.7 - 0.3 + tgl * b1  # 1.05 + 0.018 = 1.068
    row1 = [0.0] * 10
    row1[9] = b2
    row1[8] = g * 0.8 - 0.4 + gl * row1[9]  # 0.32 + 0.864 = 1.184
    row1[7] = g * 0.4 - 0.1 + gl * row1[8]  # 0.26 + 0.72 * 1.184 = 1.11248
    row1[5] = b1  # a one-token turn: its last token is its only token
    row1[1] = b0
    row1[0] = g * 0.3 - 0.2 + gl * row1[1]  # 0.07 + 0.72 * 1.068 = 0.83896
    assert [round(x, 6) for x in (row0[0], row0[5], row1[7], row1[0])] == [0.451808, 0.28616, 1.11248, 0.83896]

    advantages, returns = compute_turn_gae_advantages(
        TWO_ROW_REWARDS, TWO_ROW_MASK, TWO_ROW_VALUES.float(), TWO_ROW_TURNS, GAMMA, LAM, TURN_GAMMA, TURN_LAM
    )
    raw = [row0, row1]
    mask, v = TWO_ROW_MASK.tolist(), TWO_ROW_VALUES.float().double().tolist()
    expected_returns = [[a + vt if m else 0.0 for a, vt, m in zip(*rows)] for rows in zip(raw, v, mask)]
    assert advantages.dtype == returns.dtype == torch.float32
    torch.testing.assert_close(
        returns.double(), torch.tensor(expected_returns, dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        advantages.double(), torch.tensor(whitened(raw, mask), dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_turn_gae_of_one_turn_is_token_gae_with_the_reward_on_the_last_token() -> None:
    generator = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    turn_ids = torch.where(mask.bool(), 0, -1)
    rewards = place_scores_on_last_token(torch.tensor([1.0, -0.5, 2.0]), mask).double()
    values = torch.randn(mask.shape, generator=generator, dtype=torch.float64)
    expected = compute_gae_advantages(rewards, mask, values, gamma=0.9, lam=0.7)
    # The turn-level discount has nothing to act on with one turn.
    actual = compute_turn_gae_advantages(rewards, mask, values, turn_ids, 0.9, 0.7, turn_gamma=0.3, turn_lam=0.2)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_turn_gae_with_one_token_per_turn_is_token_gae_over_the_model_tokens() -> None:
    generator = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 0, 1, 1, 0, 0, 1, 0], [1, 1, 0, 1, 0, 1, 0, 0]])
    # Each model token is a turn of its own: 0, 1, 2, ... along the row.
    turn_ids = torch.where(mask.bool(), mask.cumsum(dim=1) - 1, -1)
    rewards = torch.randn(mask.shape, generator=generator, dtype=torch.float64) * mask
    values = torch.randn(mask.shape, generator=generator, dtype=torch.float64)
    expected = compute_gae_advantages(rewards, mask, values, gamma=0.8, lam=0.6)
    actual = compute_turn_gae_advantages(
        rewards, mask, values, turn_ids, gamma=0.1, lam=0.2, turn_gamma=0.8, turn_lam=0.6
    )
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_turn_gae_through_the_registry_takes_the_trainer_inputs() -> None:
    inputs = {
        "token_level_rewards": TWO_ROW_REWARDS,
        "response_mask": TWO_ROW_MASK,
        "index": np.array(["a", "a"], dtype=object),
        "values": TWO_ROW_VALUES.float(),
        "turn_ids": TWO_ROW_TURNS,
        "gamma": GAMMA,
        "lam": LAM,
        "turn_gamma": TURN_GAMMA,
        "turn_lam": TURN_LAM,
        "norm_adv_by_std": True,
    }
    direct = compute_turn_gae_advantages(
        TWO_ROW_REWARDS, TWO_ROW_MASK, TWO_ROW_VALUES.float(), TWO_ROW_TURNS, GAMMA, LAM, TURN_GAMMA, TURN_LAM
    )
    for got, want in zip(compute_advantages("turn_gae", **inputs), direct):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    needs = estimator_needs("turn_gae")
    assert needs.critic and needs.turn_ids


def test_turn_gae_without_turn_ids_says_it_is_for_multi_turn_runs() -> None:
    with pytest.raises(ConfigError, match="for multi-turn runs: set env.name or env.env_class"):
        compute_advantages(
            "turn_gae", token_level_rewards=TWO_ROW_REWARDS, response_mask=TWO_ROW_MASK, values=TWO_ROW_VALUES
        )


@pytest.mark.parametrize(
    ("turn_ids", "message"),
    [
        (torch.tensor([[0, 0, 0, -1, -1, 1, -1, 1, -1, -1]]), "response_mask is 1 at row 0, position 6"),
        (torch.tensor([[1, 1, 1, -1, -1, 0, 0, 0, -1, -1]]), "turn_ids of row 0 decrease"),
        (torch.tensor([[0.0, 0, 0, -1, -1, 1, 1, 1, -1, -1]]), "integer tensor"),
    ],
)
def test_turn_gae_refuses_turn_ids_that_do_not_fit_the_mask(turn_ids, message) -> None:
    with pytest.raises(ValueError, match=message):
        compute_turn_gae_advantages(TWO_ROW_REWARDS[:1], TWO_ROW_MASK[:1], TWO_ROW_VALUES[:1], turn_ids)


# ---------------------------------------------------------------------------------------------------- config


def test_turn_gae_needs_the_env_section(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="adv_estimator=turn_gae assigns credit over an episode's turns"):
        load_config([*SMALL, "algorithm.adv_estimator=turn_gae"])
    monkeypatch.setitem(ENVIRONMENTS._entries, "credit_test_env", Environment)
    monkeypatch.setitem(ENVIRONMENTS._traits, "credit_test_env", None)
    config = load_config(
        [*SMALL, "algorithm.adv_estimator=turn_gae", "env.name=credit_test_env", "algorithm.turn_gamma=0.5"]
    )
    assert (config.algorithm.turn_gamma, config.algorithm.turn_lam) == (0.5, 1.0)


@pytest.mark.parametrize("key", ["algorithm.turn_gamma", "algorithm.turn_lam"])
def test_turn_discounts_must_be_in_the_unit_interval(key) -> None:
    with pytest.raises(ConfigError, match=f"{key}=1.5 must be in \\[0, 1\\]"):
        load_config([*SMALL, f"{key}=1.5"])


def test_turn_gae_sums_a_turns_token_rewards_into_its_turn_reward_and_ignores_environment_tokens() -> None:
    # An in-reward KL puts a reward on every model token: turn_gae counts it in the turn's reward (so it reaches the
    # turn level), and rewards on environment tokens or padding count nowhere.
    spread = TWO_ROW_REWARDS.double()
    spread[0, 0], spread[0, 2] = 0.2, 0.3  # turn 0 of row 0: 0.2 + 0.3 = its 0.5
    spread[1, 7], spread[1, 8], spread[1, 9] = -0.5, 0.5, 2.0  # turn 2 of row 1: still 2.0
    spread[0, 3], spread[1, 6] = 7.0, -7.0  # environment tokens
    args = (TWO_ROW_MASK, TWO_ROW_VALUES, TWO_ROW_TURNS, GAMMA, LAM, TURN_GAMMA, TURN_LAM)
    expected = compute_turn_gae_advantages(TWO_ROW_REWARDS.double(), *args)
    for got, want in zip(compute_turn_gae_advantages(spread, *args), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_turn_gae_takes_a_skipped_turn_index_as_no_turn() -> None:
    # Turn indices 0 and 2 (no token of turn 1, e.g. a turn cut to nothing) are two consecutive turns.
    skipped = torch.where(TWO_ROW_TURNS == 2, 3, torch.where(TWO_ROW_TURNS == 1, 2, TWO_ROW_TURNS))
    args = (GAMMA, LAM, TURN_GAMMA, TURN_LAM)
    expected = compute_turn_gae_advantages(TWO_ROW_REWARDS, TWO_ROW_MASK, TWO_ROW_VALUES, TWO_ROW_TURNS, *args)
    actual = compute_turn_gae_advantages(TWO_ROW_REWARDS, TWO_ROW_MASK, TWO_ROW_VALUES, skipped, *args)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_estimator_leaves_environment_tokens_exactly_zero(name: str) -> None:
    inputs = {
        "token_level_rewards": episode_rewards(),
        "response_mask": MASK,
        "index": UIDS,
        "values": torch.linspace(-1.0, 1.0, MASK.numel()).reshape(MASK.shape),
        "reward_baselines": torch.tensor([0.5, 0.5, 1.0, 1.0]),
        "turn_ids": TURN_IDS,
        "gamma": GAMMA,
        "lam": LAM,
        "turn_gamma": TURN_GAMMA,
        "turn_lam": TURN_LAM,
        "norm_adv_by_std": True,
    }
    advantages, returns = compute_advantages(name, **inputs)
    outside = MASK == 0
    assert torch.all(advantages[outside] == 0) and torch.all(returns[outside] == 0)
    assert torch.any(advantages[~outside] != 0)


# ------------------------------------------------------------------------ one row per turn (env.context=latest)

# Two seeds (uids "a", "b"), two episodes each; each episode's turns are rows, padded to 3 rows. Rewards per turn:
#   episode 0 (a): turns -0.1, 1.0  -> return 0.9        episode 1 (a): turns -0.1, -0.1, 0.0 -> return -0.2
#   episode 2 (b): turn 1.0         -> return 1.0        episode 3 (b): turns 0.5, 0.5        -> return 1.0
ROW_TURN_REWARDS = [[-0.1, 1.0, None], [-0.1, -0.1, 0.0], [1.0, None, None], [0.5, 0.5, None]]
ROW_LENGTHS = [2, 3, 1]  # model tokens of each turn's row (a padding row has none)


def turn_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    rewards, mask = torch.zeros(12, 4), torch.zeros(12, 4, dtype=torch.long)
    for episode, turns in enumerate(ROW_TURN_REWARDS):
        for turn, reward in enumerate(turns):
            if reward is not None:
                row, length = episode * 3 + turn, ROW_LENGTHS[turn]
                mask[row, :length] = 1
                rewards[row, length - 1] = reward
                rewards[row, length:] = 9.0  # outside the mask: must count nowhere
    episode_index = torch.arange(4).repeat_interleave(3)
    return rewards, mask, episode_index, ["a"] * 6 + ["b"] * 6


def test_episode_advantages_give_every_turn_its_episodes_grpo_advantage() -> None:
    rewards, mask, episode_index, uids = turn_rows()
    advantages, returns = episode_advantages("grpo", rewards, mask, episode_index, uids, norm_adv_by_std=True)
    # group a: returns 0.9 and -0.2, mean 0.35, unbiased std = |0.9 - (-0.2)| / sqrt(2) = 1.1 / sqrt(2)
    std_a = 1.1 / math.sqrt(2)
    expected = [0.55 / (std_a + 1e-6), -0.55 / (std_a + 1e-6), 0.0, 0.0]  # group b: equal returns -> 0
    for row in range(12):
        episode = row // 3
        want = expected[episode] * mask[row].double()
        torch.testing.assert_close(advantages[row].double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(returns, advantages)
    assert (advantages[2] == 0).all()  # episode 0's padding row


def test_episode_advantages_equal_the_estimator_on_the_episodes_as_single_samples() -> None:
    # RLOO with an in-reward KL spread over every model token: the episode's score is everything its rows earned
    rewards, mask, episode_index, uids = turn_rows()
    rewards = torch.where(mask.bool(), rewards - 0.01, rewards)
    advantages, _ = episode_advantages("rloo", rewards, mask, episode_index, uids)
    totals = [sum((rewards[row] * mask[row]).sum().item() for row in range(e * 3, e * 3 + 3)) for e in range(4)]
    single, _ = compute_rloo_advantages(torch.tensor(totals), torch.ones(4, 1), ["a", "a", "b", "b"])
    for row in range(12):
        torch.testing.assert_close(advantages[row], single[row // 3, 0] * mask[row].float(), rtol=1e-6, atol=1e-7)
    # episode 0: turns of 2 and 3 model tokens (5 KL terms); episode 1: 2 + 3 + 1 (6); RLOO of two: the difference
    assert totals[0] == pytest.approx(0.9 - 0.01 * 5) and totals[1] == pytest.approx(-0.2 - 0.01 * 6)
    assert advantages[0, 0].item() == pytest.approx(totals[0] - totals[1], abs=1e-6)


def test_episode_advantages_refuse_a_per_token_estimator() -> None:
    rewards, mask, episode_index, uids = turn_rows()
    with pytest.raises(ValueError, match="one advantage per token"):
        episode_advantages("reinforce_plus_plus", rewards, mask, episode_index, uids)


def test_latest_context_needs_an_estimator_with_one_advantage_per_sample(monkeypatch) -> None:
    monkeypatch.setitem(ENVIRONMENTS._entries, "credit_test_env", Environment)
    monkeypatch.setitem(ENVIRONMENTS._traits, "credit_test_env", None)
    env = ["env.name=credit_test_env", "env.context=latest"]
    assert load_config([*SMALL, *env, "algorithm.adv_estimator=rloo"]).env.context == "latest"
    with pytest.raises(ConfigError, match="env.context=latest .*algorithm.adv_estimator=turn_gae gives one per token"):
        load_config([*SMALL, *env, "algorithm.adv_estimator=turn_gae"])
    with pytest.raises(ConfigError, match="env.context='window'"):
        load_config([*SMALL, "env.name=credit_test_env", "env.context=window"])


def test_the_trainer_scores_split_episodes_as_whole_episodes() -> None:
    # a batch with episode_index (env.context=latest) gets one advantage per episode; the same rows without it get
    # GRPO over rows, which weighs a 3-turn episode thrice in its group's statistics
    from types import SimpleNamespace

    from easyr1.protocol import Batch
    from easyr1.trainer import Trainer

    rewards, mask, episode_index, uids = turn_rows()
    config = load_config([*SMALL, "algorithm.adv_estimator=grpo"])
    rows = Batch(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    split = rows.union(Batch(tensors={"episode_index": episode_index}))
    trainer = SimpleNamespace(config=config)
    advantages, _ = Trainer._advantages(trainer, split)
    expected, _ = episode_advantages("grpo", rewards, mask, episode_index, uids, norm_adv_by_std=True)
    torch.testing.assert_close(advantages, expected)
    per_row, _ = Trainer._advantages(trainer, rows)
    assert not torch.allclose(per_row, advantages)
