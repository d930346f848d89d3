"""GSPO, GSPO-token, CISPO and SAPO losses and rollout correction weights against float64 loop references.

Values are checked token by token; gradients are checked against hand-derived formulas where the method is defined
by its gradient (stop-gradients in CISPO and GSPO-token, SAPO's gate weight, GSPO's broadcast of the sequence
ratio), and by finite differences where it is defined by its value.
"""

import math

import pytest
import torch

from easyr1.algorithms import (
    POLICY_LOSSES,
    PolicyLossParams,
    aggregate_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_gspo,
    compute_policy_loss_gspo_token,
    compute_policy_loss_sapo,
    get_policy_loss,
    rollout_correction,
    rollout_mismatch_metrics,
)
from easyr1.algorithms.rollout_correction import Bounds, CorrectionSettings
from easyr1.errors import ConfigError


SHAPES = [(1, 1), (3, 5), (8, 16)]


def random_mask(batch: int, length: int, generator: torch.Generator, allow_empty: bool = True) -> torch.Tensor:
    """Right-padded response mask with random lengths (0 allowed when allow_empty)."""
    low = 0 if allow_empty else 1
    lengths = torch.randint(low, length + 1, (batch,), generator=generator)
    return (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()


def random_inputs(batch: int, length: int, seed: int, spread: float = 0.8):
    """old/new log-probs (many ratios outside the clip range), row-constant advantages of both signs, a mask."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    new = old + torch.randn(batch, length, generator=generator, dtype=torch.float64) * spread
    adv = torch.randn(batch, 1, generator=generator, dtype=torch.float64).expand(batch, length).contiguous()
    mask = random_mask(batch, length, generator, allow_empty=False)
    return old, new, adv, mask


def clipped_reference(ratio: float, adv: float, low: float, high: float, dual: float) -> tuple[float, bool]:
    """PPO-clip + dual-clip loss for one ratio, and whether the token keeps its gradient."""
    surrogate = -adv * ratio
    loss = max(surrogate, -adv * min(max(ratio, 1 - low), 1 + high))
    if adv < 0 and loss > -adv * dual:
        return -adv * dual, False
    return loss, loss == surrogate


def sequence_ratio(old: list[float], new: list[float], mask: list[int]) -> float:
    diffs = [n - o for o, n, m in zip(old, new, mask) if m]
    return math.exp(sum(diffs) / len(diffs)) if diffs else 1.0


def valid_token_mean(values: list[list[float]], mask: list[list[int]]) -> float:
    picked = [v for row, m_row in zip(values, mask) for v, m in zip(row, m_row) if m]
    return sum(picked) / len(picked)


# ----------------------------------------------------------------------------------------------------------------
# GSPO


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize(("low", "high", "dual"), [(0.2, 0.3, 3.0), (3e-4, 4e-4, 3.0), (0.2, 0.2, 1.5)])
@pytest.mark.parametrize("loss_type", ["gspo", "gspo_token"])
def test_gspo_values_match_reference(
    batch: int, length: int, low: float, high: float, dual: float, loss_type: str
) -> None:
    old, new, adv, mask = random_inputs(batch, length, seed=batch + length, spread=0.3)
    params = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_dual=dual)
    out = get_policy_loss(loss_type)(old, new, adv, mask, params)

    higher, lower = [], []
    for i in range(batch):
        s = sequence_ratio(old[i].tolist(), new[i].tolist(), mask[i].tolist())
        for t in range(length):
            if not mask[i, t]:
                continue
            loss, _ = clipped_reference(s, adv[i, t].item(), low, high, dual)
            assert out.loss_mat[i, t].item() == pytest.approx(loss, rel=1e-12, abs=1e-12)
            clipped_surrogate = -adv[i, t].item() * min(max(s, 1 - low), 1 + high)
            higher.append(clipped_surrogate > -adv[i, t].item() * s)
            lower.append(
                adv[i, t].item() < 0 and max(-adv[i, t].item() * s, clipped_surrogate) > -adv[i, t].item() * dual
            )
    assert out.metrics["pg_clipfrac_higher"] == pytest.approx(sum(higher) / len(higher))
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(sum(lower) / len(lower))
    kl = [[o - n for o, n in zip(o_row, n_row)] for o_row, n_row in zip(old.tolist(), new.tolist())]
    assert out.metrics["ppo_kl"] == pytest.approx(valid_token_mean(kl, mask.tolist()))


def gspo_gradient_reference(
    old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, params: PolicyLossParams, mode: str
) -> list[list[float]]:
    """d(aggregated loss)/d(new) for row-constant advantages, written out: d s_i / d new_it = s_i / |y_i|."""
    batch, length = new.shape
    lengths = [int(mask[i].sum()) for i in range(batch)]
    num_tokens, num_seqs = sum(lengths), sum(1 for n in lengths if n)
    grads = []
    for i in range(batch):
        s = sequence_ratio(old[i].tolist(), new[i].tolist(), mask[i].tolist())
        a = adv[i, 0].item()
        _, active = clipped_reference(s, a, params.clip_ratio_low, params.clip_ratio_high, params.clip_ratio_dual)
        # the row's total weight in the aggregated loss: each of its |y_i| tokens carries loss -A s_i
        row_weight = lengths[i] / num_tokens if mode == "token-mean" else 1 / num_seqs
        grad = -a * s / lengths[i] * row_weight if active else 0.0
        grads.append([grad if mask[i, t] else 0.0 for t in range(length)])
    return grads


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("loss_type", ["gspo", "gspo_token"])
def test_gspo_gradient_is_the_sequence_ratio_broadcast(batch: int, length: int, mode: str, loss_type: str) -> None:
    """With row-constant advantages both variants give every token of a row s_i / |y_i| of the row's gradient."""
    old, new, adv, mask = random_inputs(batch, length, seed=3 * batch + length, spread=0.15)
    params = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_dual=1.02)
    new.requires_grad_(True)
    out = get_policy_loss(loss_type)(old, new, adv, mask, params)
    aggregate_loss(out.loss_mat, mask, mode).backward()
    expected = gspo_gradient_reference(old, new.detach(), adv, mask, params, mode)
    for i in range(batch):
        for t in range(length):
            assert new.grad[i, t].item() == pytest.approx(expected[i][t], rel=1e-10, abs=1e-14)


def test_gspo_gradcheck() -> None:
    old, new, adv, mask = random_inputs(4, 6, seed=11, spread=0.1)
    adv = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # token-level too

    def loss_fn(log_probs: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(
            compute_policy_loss_gspo(old, log_probs, adv, mask).loss_mat, mask, "seq-mean-token-mean"
        )

    assert torch.autograd.gradcheck(loss_fn, (new.clone().requires_grad_(True),), eps=1e-7, atol=1e-6)


def test_gspo_token_gradient_uses_each_tokens_own_advantage() -> None:
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.tensor([[0.02, -0.01, 0.05]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    out = compute_policy_loss_gspo_token(old, new, adv, mask, PolicyLossParams(0.2, 0.2, 3.0))
    out.loss_mat.sum().backward()
    s = math.exp((0.02 - 0.01 + 0.05) / 3)
    torch.testing.assert_close(out.loss_mat.detach(), -adv * s)  # the value is the sequence ratio's
    torch.testing.assert_close(new.grad, -adv * s)  # d/d new_t only through token t: -A_t * s
    # GSPO proper spreads every token's advantage over the whole row instead: -mean(A) * s on each token
    new_seq = new.detach().clone().requires_grad_(True)
    compute_policy_loss_gspo(old, new_seq, adv, mask, PolicyLossParams(0.2, 0.2, 3.0)).loss_mat.sum().backward()
    torch.testing.assert_close(new_seq.grad, torch.full((1, 3), -adv.mean().item() * s, dtype=torch.float64))


def test_gspo_sequence_ratio_exactly_on_the_clip_boundary_is_not_clipped() -> None:
    # every token ratio 2 (or 1/2): the sequence ratio is exactly 2 (1/2), the boundary of low=0.5, high=1
    params = PolicyLossParams(clip_ratio_low=0.5, clip_ratio_high=1.0, clip_ratio_dual=4.0)
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[math.log(2.0)] * 3, [math.log(0.5)] * 3], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    out = compute_policy_loss_gspo(old, new, adv, torch.ones(2, 3), params)
    assert out.metrics["pg_clipfrac_higher"] == 0.0 and out.metrics["pg_clipfrac_lower"] == 0.0
    torch.testing.assert_close(out.loss_mat.detach(), torch.tensor([[-2.0] * 3, [0.5] * 3], dtype=torch.float64))
    out.loss_mat.sum().backward()
    # the unclipped branch stays active: each token receives 3 * (-A s / 3)
    torch.testing.assert_close(new.grad, torch.tensor([[-2.0] * 3, [0.5] * 3], dtype=torch.float64))


def test_gspo_dual_clip_caps_negative_advantages() -> None:
    params = PolicyLossParams(clip_ratio_low=3e-4, clip_ratio_high=4e-4, clip_ratio_dual=3.0)
    old = torch.zeros(2, 2, dtype=torch.float64)
    new = torch.log(torch.tensor([[4.0, 4.0], [2.0, 2.0]], dtype=torch.float64)).requires_grad_(True)
    adv = -torch.ones(2, 2, dtype=torch.float64)
    out = compute_policy_loss_gspo(old, new, adv, torch.ones(2, 2), params)
    torch.testing.assert_close(out.loss_mat.detach(), torch.tensor([[3.0, 3.0], [2.0, 2.0]], dtype=torch.float64))
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(0.5)
    out.loss_mat.sum().backward()
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 0.0], [2.0, 2.0]], dtype=torch.float64))


def test_gspo_ignores_masked_tokens_and_empty_rows() -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [0, 0, 0]])
    adv = torch.ones(2, 3, dtype=torch.float64)
    for loss in (compute_policy_loss_gspo, compute_policy_loss_gspo_token):
        # padding positions hold arbitrary log-probs; they must not enter the sequence ratio
        new = torch.tensor([[0.1, 50.0, -50.0], [7.0, 7.0, 7.0]], dtype=torch.float64, requires_grad=True)
        out = loss(old, new, adv, mask)
        assert out.loss_mat[0, 0].item() == pytest.approx(-math.exp(0.1))
        value = aggregate_loss(out.loss_mat, mask, "seq-mean-token-mean")
        value.backward()
        assert value.item() == pytest.approx(-math.exp(0.1))
        expected_grad = torch.zeros(2, 3, dtype=torch.float64)
        expected_grad[0, 0] = -math.exp(0.1)
        torch.testing.assert_close(new.grad, expected_grad)


# ----------------------------------------------------------------------------------------------------------------
# CISPO


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize(("low", "high"), [(0.2, 0.28), (0.0, 4.0), (1.0, 0.5)])
def test_cispo_value_and_gradient_match_reference(batch: int, length: int, low: float, high: float) -> None:
    old, new, _, mask = random_inputs(batch, length, seed=5 * batch + length, spread=1.0)
    adv = torch.randn(batch, length, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    params = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high)
    new.requires_grad_(True)
    out = compute_policy_loss_cispo(old, new, adv, mask, params)
    out.loss_mat.sum().backward()
    above, below = [], []
    for i in range(batch):
        for t in range(length):
            ratio = math.exp(new[i, t].item() - old[i, t].item())
            weight = min(max(ratio, 1 - low), 1 + high)
            a = adv[i, t].item()
            assert out.loss_mat[i, t].item() == pytest.approx(-weight * a * new[i, t].item(), rel=1e-12, abs=1e-12)
            # the weight is a constant: the gradient is the REINFORCE one, scaled, and never zeroed by clipping
            assert new.grad[i, t].item() == pytest.approx(-weight * a, rel=1e-12, abs=1e-12)
            if mask[i, t]:
                above.append(ratio > 1 + high)
                below.append(ratio < 1 - low)
    assert out.metrics["pg_clipfrac_higher"] == pytest.approx(sum(above) / len(above))
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(sum(below) / len(below))


def test_cispo_sends_no_gradient_through_the_weight() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.tensor([[0.1, 3.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    out = compute_policy_loss_cispo(old, new, adv, torch.ones(1, 2), PolicyLossParams(0.2, 0.5))
    out.loss_mat.sum().backward()
    # first token: weight e^0.1 (unclipped) -- with the weight differentiated it would be -(1 + 0.1) e^0.1
    torch.testing.assert_close(new.grad, torch.tensor([[-math.exp(0.1), -1.5]], dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------------------
# SAPO


def sapo_reference(ratio: float, adv: float, tau_pos: float, tau_neg: float) -> tuple[float, float]:
    """Loss and d loss / d log_prob for one token."""
    tau = tau_pos if adv >= 0 else tau_neg
    sigma = 1 / (1 + math.exp(-tau * (ratio - 1)))
    return -adv * 4 / tau * sigma, -adv * 4 * sigma * (1 - sigma) * ratio


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@pytest.mark.parametrize(("tau_pos", "tau_neg"), [(1.0, 1.05), (0.5, 4.0)])
def test_sapo_value_and_gradient_match_reference(batch: int, length: int, tau_pos: float, tau_neg: float) -> None:
    old, new, _, mask = random_inputs(batch, length, seed=7 * batch + length, spread=0.7)
    adv = torch.randn(batch, length, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = PolicyLossParams(tau_positive=tau_pos, tau_negative=tau_neg)
    new.requires_grad_(True)
    out = compute_policy_loss_sapo(old, new, adv, mask, params)
    out.loss_mat.sum().backward()
    weights = []
    for i in range(batch):
        for t in range(length):
            ratio = math.exp(new[i, t].item() - old[i, t].item())
            loss, grad = sapo_reference(ratio, adv[i, t].item(), tau_pos, tau_neg)
            assert out.loss_mat[i, t].item() == pytest.approx(loss, rel=1e-12, abs=1e-12)
            assert new.grad[i, t].item() == pytest.approx(grad, rel=1e-10, abs=1e-12)
            if mask[i, t]:
                tau = tau_pos if adv[i, t] >= 0 else tau_neg
                sigma = 1 / (1 + math.exp(-tau * (ratio - 1)))
                weights.append(4 * sigma * (1 - sigma))
    assert out.metrics["sapo_gate_weight"] == pytest.approx(sum(weights) / len(weights))


def test_sapo_is_on_policy_gradient_at_ratio_one_and_damps_away_from_it() -> None:
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, -2.0, 2.0, -2.0]], dtype=torch.float64)
    out = compute_policy_loss_sapo(
        old, new, adv, torch.ones(1, 4), PolicyLossParams(tau_positive=1.0, tau_negative=3.0)
    )
    out.loss_mat.sum().backward()
    assert new.grad[0, 0].item() == pytest.approx(-2.0) and new.grad[0, 1].item() == pytest.approx(2.0)
    assert out.loss_mat[0, 0].item() == pytest.approx(-4.0)  # -A * (4 / tau) * sigmoid(0)
    # at ratio e the negative-advantage gate (tau 3) has closed further than the positive one (tau 1)
    positive_weight = new.grad[0, 2].item() / (-2.0 * math.e)
    negative_weight = new.grad[0, 3].item() / (2.0 * math.e)
    assert 0 < negative_weight < positive_weight < 1


def test_sapo_gradcheck() -> None:
    old, new, _, mask = random_inputs(3, 5, seed=13)
    adv = torch.randn(3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def loss_fn(log_probs: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(compute_policy_loss_sapo(old, log_probs, adv, mask).loss_mat, mask, "token-mean")

    assert torch.autograd.gradcheck(loss_fn, (new.clone().requires_grad_(True),), eps=1e-7, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Every loss


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_is_finite_for_huge_ratios_and_zero_for_zero_advantages(name: str) -> None:
    loss = get_policy_loss(name)
    old = torch.zeros(2, 3)
    new = torch.tensor([[80.0, -80.0, 0.5], [0.0, -3.0, 40.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = loss(old, new, torch.tensor([[1.0, -1.0, 1.0], [-1.0, 1.0, 1.0]]), mask, PolicyLossParams())
    aggregate_loss(out.loss_mat, mask).backward()
    assert torch.isfinite(out.loss_mat).all() and torch.isfinite(new.grad).all()
    assert all(math.isfinite(value) for value in out.metrics.values()) and "ppo_kl" in out.metrics

    new.grad = None
    out = loss(old, new, torch.zeros(2, 3), mask, PolicyLossParams())
    aggregate_loss(out.loss_mat, mask).backward()
    assert torch.all(new.grad == 0)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_rejects_mismatched_shapes(name: str) -> None:
    with pytest.raises(ValueError, match="one \\(B, T\\) shape"):
        get_policy_loss(name)(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), None)


# ----------------------------------------------------------------------------------------------------------------
# Rollout correction


# Each method against a written-out reference: tests/test_rollout_correction_menu.py.


def test_rollout_correction_weights_scale_the_loss_without_gradient() -> None:
    old = torch.log(torch.tensor([[0.5, 0.4, 0.9]], dtype=torch.float64))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.1]], dtype=torch.float64))
    mask = torch.ones(1, 3)
    settings = CorrectionSettings(rollout_is="token", is_bounds=Bounds(None, 4.0))
    weights, _, metrics = rollout_correction(old, rollout, mask, settings)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0, 4.0]], dtype=torch.float64))  # 9 truncated to 4
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert metrics["rollout_corr/rollout_is_max"] == 4.0 and not weights.requires_grad

    new = old.clone().requires_grad_(True)
    adv = torch.ones(1, 3, dtype=torch.float64)
    loss_mat = compute_policy_loss_cispo(old, new, adv, mask, PolicyLossParams(1.0, 10.0)).loss_mat * weights
    loss_mat.sum().backward()
    torch.testing.assert_close(new.grad, -weights)  # ratio 1 -> weight 1, so the gradient is -A * w


def test_rollout_correction_handles_empty_rows_and_rejects_bad_settings() -> None:
    settings = CorrectionSettings(rollout_is="sequence")
    weights, mask, metrics = rollout_correction(
        torch.zeros(2, 2), torch.full((2, 2), -5.0), torch.zeros(2, 2), settings
    )
    assert torch.all(weights == 0) and torch.all(mask == 0) and metrics["rollout_corr/rollout_is_mean"] == 0.0
    with pytest.raises(ConfigError, match="token, sequence, icepop"):
        rollout_correction(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), CorrectionSettings("tis"))
    with pytest.raises(ValueError, match="one \\(B, T\\) shape"):
        rollout_mismatch_metrics(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))


def test_rollout_mismatch_is_zero_for_identical_log_probs() -> None:
    log_probs = -torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    metrics = rollout_mismatch_metrics(log_probs, log_probs.clone(), torch.ones(3, 4))
    assert metrics == {"rollout_kl_k1": 0.0, "rollout_kl_k3": 0.0, "rollout_log_prob_abs_diff": 0.0}
