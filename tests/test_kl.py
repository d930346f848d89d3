"""KL coefficient controllers (fixed and adaptive, Ziegler et al. 2019) and the KL folded into the reward, against
plain-python references."""

import math

import pytest
import torch

from easyr1.algorithms import AdaptiveKLController, FixedKLController, build_kl_controller, kl_in_reward
from easyr1.errors import ConfigError


def adaptive_reference(coef: float, target: float, horizon: float, kls: list[float], n_steps: int) -> list[float]:
    """The coefficient after each update, written out."""
    values = []
    for kl in kls:
        error = kl / target - 1
        error = 0.2 if error > 0.2 else -0.2 if error < -0.2 else error
        coef = coef * (1 + error * n_steps / horizon)
        values.append(coef)
    return values


@pytest.mark.parametrize(("target", "horizon", "n_steps"), [(0.1, 10000.0, 512), (0.02, 100.0, 8), (1.0, 50.0, 64)])
def test_adaptive_controller_matches_reference(target: float, horizon: float, n_steps: int) -> None:
    kls = [0.0, 0.05, 0.1, 0.105, 0.3, 2.0, 0.09, 0.0]  # below, at, slightly above and far above the target
    kls = [kl * target / 0.1 for kl in kls]
    controller = AdaptiveKLController(init_kl_coef=0.01, target_kl=target, horizon=horizon)
    expected = adaptive_reference(0.01, target, horizon, kls, n_steps)
    for kl, want in zip(kls, expected):
        controller.update(kl, n_steps)
        assert controller.value == pytest.approx(want, rel=1e-12)


def test_adaptive_controller_moves_towards_the_target_with_a_clipped_step() -> None:
    controller = AdaptiveKLController(init_kl_coef=1.0, target_kl=0.1, horizon=100.0)
    controller.update(current_kl=10.0, n_steps=10)  # error clipped at +0.2: x (1 + 0.2 * 0.1)
    assert controller.value == pytest.approx(1.02)
    controller.update(current_kl=0.1, n_steps=10)  # on target: unchanged
    assert controller.value == pytest.approx(1.02)
    controller.update(current_kl=0.0, n_steps=10)  # error clipped at -0.2
    assert controller.value == pytest.approx(1.02 * 0.98)


def test_fixed_controller_never_changes() -> None:
    controller = FixedKLController(0.05)
    for kl in (0.0, 1.0, 100.0):
        controller.update(kl, 1000)
    assert controller.value == 0.05


@pytest.mark.parametrize("kind", ["fixed", "adaptive"])
def test_controller_state_round_trip_continues_exactly(kind: str) -> None:
    first = build_kl_controller(kind, kl_coef=0.01, kl_target=0.05, kl_horizon=200.0)
    for kl in (0.2, 0.01, 0.07):
        first.update(kl, 16)
    resumed = build_kl_controller(kind, kl_coef=0.01, kl_target=0.05, kl_horizon=200.0)
    resumed.load_state_dict(first.state_dict())
    assert resumed.value == first.value
    first.update(0.3, 16)
    resumed.update(0.3, 16)
    assert resumed.value == first.value
    with pytest.raises(ValueError, match="'value': float"):
        resumed.load_state_dict({"kl_coef": 0.1})


def test_controller_settings_are_validated() -> None:
    assert isinstance(build_kl_controller("fixed", 0.001), FixedKLController)
    assert isinstance(build_kl_controller("adaptive", 0.001, 0.1, 10000.0), AdaptiveKLController)
    with pytest.raises(ConfigError, match="algorithm.kl_type='pid'.*fixed, adaptive"):
        build_kl_controller("pid", 0.001)
    with pytest.raises(ConfigError, match="algorithm.kl_horizon"):
        AdaptiveKLController(0.001, 0.1, 0.0)
    with pytest.raises(ConfigError, match="algorithm.kl_target"):
        AdaptiveKLController(0.001, 0.0, 100.0)
    with pytest.raises(ConfigError, match="algorithm.kl_coef"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError, match="measured KL is nan"):
        AdaptiveKLController(0.001, 0.1, 100.0).update(float("nan"), 1)


def kl_in_reward_reference(scores, old, ref, mask, coef, kind):
    """Token by token in plain python: reward = score - coef * KL on response tokens; the mean per-response KL."""
    rewards, per_response = [], []
    for score_row, old_row, ref_row, mask_row in zip(scores, old, ref, mask):
        row, total = [], 0.0
        for score, p, q, m in zip(score_row, old_row, ref_row, mask_row):
            if kind == "k1":
                kl = p - q
            else:  # k3: q/p - log(q/p) - 1 on the log-ratio log q - log p
                kl = math.exp(q - p) - (q - p) - 1
            kl *= m
            total += kl
            row.append(score - coef * kl)
        rewards.append(row)
        per_response.append(total / max(sum(mask_row), 1))
    return rewards, sum(per_response) / len(per_response)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_in_reward_matches_a_hand_written_reference(kind: str) -> None:
    scores = [[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    old = [[-1.0, -0.5, -2.0, -3.0], [-0.2, -1.5, -0.7, -0.1], [-0.3, -0.3, -0.3, -0.3]]
    ref = [[-1.2, -0.4, -2.5, -0.1], [-0.2, -1.0, -0.9, -4.0], [-0.3, -0.3, -0.3, -0.3]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]  # the last response is empty: its KL counts as 0
    rewards, metrics = kl_in_reward(
        torch.tensor(scores), torch.tensor(old), torch.tensor(ref), torch.tensor(mask, dtype=torch.float32), 0.1, kind
    )
    expected_rewards, expected_kl = kl_in_reward_reference(scores, old, ref, mask, 0.1, kind)
    torch.testing.assert_close(rewards, torch.tensor(expected_rewards), rtol=0, atol=1e-6)
    assert rewards[0, 3] == 0.0 and rewards[2].abs().sum() == 0  # nothing outside the response
    assert metrics == {"reward_kl": pytest.approx(expected_kl, rel=1e-6), "kl_coef": 0.1}
