"""Advantage, policy loss, KL, aggregation and logits helpers against plain-python float64 references."""

import math
import random

import numpy as np
import pytest
import torch

from easyr1.algorithms import (
    ADV_ESTIMATORS,
    LOSS_AGG_MODES,
    PolicyLossParams,
    Registry,
    aggregate_loss,
    compute_advantages,
    compute_grpo_advantages,
    compute_policy_loss_ppo,
    count_normalizers,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    log_probs_from_logits,
)
from easyr1.errors import ConfigError


def random_mask(batch: int, length: int, generator: torch.Generator, allow_empty: bool = True) -> torch.Tensor:
    """Right-padded response mask with random lengths (0 allowed when allow_empty)."""
    low = 0 if allow_empty else 1
    lengths = torch.randint(low, length + 1, (batch,), generator=generator)
    return (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()


# ----------------------------------------------------------------------------------------------------------------
# GRPO


def grpo_reference(scores: list[float], labels: list, eps: float, norm_by_std: bool) -> list[float]:
    """Loop implementation: per-group mean and unbiased std; singleton groups get 0."""
    result = []
    for i, label in enumerate(labels):
        group = [scores[j] for j in range(len(scores)) if labels[j] == label]
        n = len(group)
        if n == 1:
            result.append(0.0)
            continue
        mean = sum(group) / n
        std = math.sqrt(sum((s - mean) ** 2 for s in group) / (n - 1))
        result.append((scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean)
    return result


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_loop_reference(seed: int, norm_by_std: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    group_sizes = [rng.choice([1, 2, 3, 5, 8]) for _ in range(6)]
    labels = [f"uid-{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    rng.shuffle(labels)  # groups need not be contiguous
    batch, length = len(labels), 7
    mask = random_mask(batch, length, generator, allow_empty=False)
    # Discrete scores make ties (and all-equal groups) likely, as with 0/1 accuracy rewards.
    scores = torch.randint(0, 3, (batch,), generator=generator).double() * 0.5
    token_rewards = torch.zeros(batch, length, dtype=torch.float64)
    last = mask.sum(-1) - 1
    token_rewards[torch.arange(batch), last] = scores

    advantages, returns = compute_grpo_advantages(
        token_rewards, mask, np.array(labels, dtype=object), eps=1e-6, norm_adv_by_std=norm_by_std
    )
    expected = grpo_reference(scores.tolist(), labels, 1e-6, norm_by_std)
    for i in range(batch):
        for t in range(length):
            want = expected[i] if mask[i, t] else 0.0
            assert advantages[i, t].item() == pytest.approx(want, abs=1e-9)
    assert torch.equal(advantages, returns)


def test_grpo_scores_input_equals_token_rewards_input() -> None:
    generator = torch.Generator().manual_seed(3)
    mask = random_mask(6, 5, generator, allow_empty=False)
    scores = torch.rand(6, generator=generator)
    token_rewards = torch.zeros(6, 5)
    token_rewards[torch.arange(6), mask.sum(-1) - 1] = scores
    index = np.array([0, 0, 0, 1, 1, 1])
    from_scores, _ = compute_grpo_advantages(scores, mask, index)
    from_tokens, _ = compute_grpo_advantages(token_rewards, mask, index)
    torch.testing.assert_close(from_scores, from_tokens)
    assert from_scores.dtype == torch.float32


def test_grpo_singleton_and_constant_groups_get_zero_advantage() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 0.7, 0.0, 1.0])
    mask = torch.ones(6, 4)
    advantages, _ = compute_grpo_advantages(scores, mask, np.array(["a", "a", "a", "b", "c", "c"], dtype=object))
    assert torch.all(advantages[:4] == 0)  # constant group "a", singleton group "b"
    # scores 0 and 1: mean 0.5, unbiased std sqrt(0.5)
    assert advantages[4, 0].item() == pytest.approx(-0.5 / math.sqrt(0.5), rel=1e-5)
    assert advantages[5, 0].item() == pytest.approx(0.5 / math.sqrt(0.5), rel=1e-5)


def test_grpo_group_advantages_sum_to_zero_and_have_unit_std() -> None:
    generator = torch.Generator().manual_seed(4)
    scores = torch.rand(16, generator=generator, dtype=torch.float64)
    index = np.repeat(np.arange(4), 4)
    advantages, _ = compute_grpo_advantages(scores, torch.ones(16, 1), index, eps=0.0)
    per_group = advantages[:, 0].reshape(4, 4)
    torch.testing.assert_close(per_group.sum(-1), torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(per_group.std(-1), torch.ones(4, dtype=torch.float64))


def test_grpo_rejects_mismatched_index() -> None:
    with pytest.raises(ValueError, match="one label per sample"):
        compute_grpo_advantages(torch.zeros(4), torch.ones(4, 2), np.array([0, 0, 1]))


def test_compute_advantages_passes_only_accepted_inputs() -> None:
    scores = torch.tensor([1.0, 0.0])
    mask = torch.ones(2, 3)
    advantages, _ = compute_advantages(
        "grpo", token_level_rewards=scores, response_mask=mask, index=np.array([0, 0]), values=None, gamma=1.0
    )
    assert advantages[0, 0] > 0 > advantages[1, 0]
    with pytest.raises(ValueError, match="index"):
        compute_advantages("grpo", token_level_rewards=scores, response_mask=mask)


def test_unknown_names_list_valid_choices() -> None:
    with pytest.raises(ConfigError, match="Valid names: .*grpo"):
        compute_advantages("grpoo", token_level_rewards=torch.zeros(1))
    with pytest.raises(ConfigError, match="Did you mean 'ppo'"):
        get_policy_loss("ppo2")
    with pytest.raises(ConfigError, match="low_var_kl"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ConfigError, match="token-mean"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "token-sum")


def test_registry_rejects_a_second_function_under_the_same_name() -> None:
    registry: Registry = Registry("widget", "x.widget")

    @registry.register("a")
    def first() -> int:
        return 1

    registry.register("a")(first)  # re-registering the same function is harmless (module reloads)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(lambda: 2)
    assert registry.get("a") is first and registry.names() == ["a"] and "grpo" in ADV_ESTIMATORS


# ----------------------------------------------------------------------------------------------------------------
# PPO policy loss


def ppo_reference(old: float, new: float, adv: float, low: float, high: float, dual: float) -> tuple[float, int, int]:
    """Per-token loss, clipped-higher flag and dual-clipped flag, written out case by case."""
    ratio = math.exp(new - old)
    surrogate = -adv * ratio
    clipped_surrogate = -adv * min(max(ratio, 1 - low), 1 + high)
    loss = max(surrogate, clipped_surrogate)
    clipped_higher = int(clipped_surrogate > surrogate)
    clipped_lower = 0
    if adv < 0 and loss > -adv * dual:
        loss, clipped_lower = -adv * dual, 1
    return loss, clipped_higher, clipped_lower


@pytest.mark.parametrize(("batch", "length", "seed"), [(1, 1, 0), (3, 5, 1), (8, 16, 2)])
@pytest.mark.parametrize(("low", "high", "dual"), [(0.2, 0.2, 3.0), (0.2, 0.28, 1.5)])
def test_ppo_loss_matches_loop_reference(
    batch: int, length: int, seed: int, low: float, high: float, dual: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    new = old + torch.randn(batch, length, generator=generator, dtype=torch.float64) * 0.8  # many clipped tokens
    adv = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    mask = random_mask(batch, length, generator, allow_empty=False)
    params = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_dual=dual)

    out = compute_policy_loss_ppo(old, new, adv, mask, params)

    flags_higher, flags_lower, kls = [], [], []
    for i in range(batch):
        for t in range(length):
            loss, higher, lower = ppo_reference(old[i, t].item(), new[i, t].item(), adv[i, t].item(), low, high, dual)
            assert out.loss_mat[i, t].item() == pytest.approx(loss, rel=1e-12, abs=1e-12)
            if mask[i, t]:
                flags_higher.append(higher)
                flags_lower.append(lower)
                kls.append(old[i, t].item() - new[i, t].item())
    assert out.metrics["pg_clipfrac_higher"] == pytest.approx(sum(flags_higher) / len(flags_higher))
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(sum(flags_lower) / len(flags_lower))
    assert out.metrics["ppo_kl"] == pytest.approx(sum(kls) / len(kls))


def test_ppo_ratio_exactly_on_the_clip_boundary_is_not_clipped() -> None:
    # Powers of two survive exp(log(x)) exactly, so the ratio sits exactly on the boundary.
    params = PolicyLossParams(clip_ratio_low=0.5, clip_ratio_high=1.0, clip_ratio_dual=4.0)
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = torch.tensor([[math.log(2.0), math.log(0.5), math.log(2.0), math.log(0.5)]], dtype=torch.float64)
    assert torch.equal(torch.exp(new - old), torch.tensor([[2.0, 0.5, 2.0, 0.5]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    new.requires_grad_(True)
    out = compute_policy_loss_ppo(old, new, adv, torch.ones(1, 4), params)
    assert out.metrics["pg_clipfrac_higher"] == 0.0 and out.metrics["pg_clipfrac_lower"] == 0.0
    torch.testing.assert_close(out.loss_mat.detach(), torch.tensor([[-2.0, 0.5, 2.0, -0.5]], dtype=torch.float64))
    # On the boundary the unclipped branch is still active, so every token gets the full gradient -A * r.
    out.loss_mat.sum().backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-2.0, 0.5, 2.0, -0.5]], dtype=torch.float64))


def test_ppo_dual_clip_caps_negative_advantage_loss() -> None:
    params = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_dual=3.0)
    old = torch.zeros(1, 3, dtype=torch.float64)
    # ratios 10, 2, 10 with advantages -1, -1, +1
    new = torch.log(torch.tensor([[10.0, 2.0, 10.0]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    out = compute_policy_loss_ppo(old, new, adv, torch.ones(1, 3), params)
    torch.testing.assert_close(out.loss_mat.detach(), torch.tensor([[3.0, 2.0, -1.2]], dtype=torch.float64))
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    assert out.metrics["pg_clipfrac_higher"] == pytest.approx(1 / 3)  # the third token (A > 0, r > 1 + high)
    out.loss_mat.sum().backward()
    # dual-clipped and PPO-clipped tokens carry no gradient; the second is unclipped: d(-A r)/dlogp = -A r = 2
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 2.0, 0.0]], dtype=torch.float64))


def test_ppo_loss_gradcheck() -> None:
    generator = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 6, generator=generator, dtype=torch.float64)
    new = (old + torch.randn(3, 6, generator=generator, dtype=torch.float64) * 0.5).requires_grad_(True)
    adv = torch.randn(3, 6, generator=generator, dtype=torch.float64)
    mask = random_mask(3, 6, generator, allow_empty=False)

    def loss_fn(log_probs: torch.Tensor) -> torch.Tensor:
        loss_mat = compute_policy_loss_ppo(old, log_probs, adv, mask, PolicyLossParams()).loss_mat
        return aggregate_loss(loss_mat, mask, "token-mean")

    assert torch.autograd.gradcheck(loss_fn, (new,), eps=1e-7, atol=1e-6)


def test_ppo_handles_huge_log_ratio_without_nan() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[80.0, -80.0]], requires_grad=True)
    out = compute_policy_loss_ppo(old, new, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    aggregate_loss(out.loss_mat, torch.ones(1, 2)).backward()
    assert torch.isfinite(out.loss_mat).all() and torch.isfinite(new.grad).all()


def test_policy_loss_params_are_validated() -> None:
    with pytest.raises(ConfigError, match="clip_ratio_dual"):
        PolicyLossParams(clip_ratio_dual=1.0)
    with pytest.raises(ConfigError, match="clip_ratio_low"):
        PolicyLossParams(clip_ratio_low=1.5)
    with pytest.raises(ConfigError, match="tau_negative"):
        PolicyLossParams(tau_negative=0.0)
    PolicyLossParams(clip_ratio_low=1.0)  # no lower bound (CISPO as in MiniMax-M1)


# ----------------------------------------------------------------------------------------------------------------
# KL


def kl_reference(logp: float, ref: float, kind: str) -> float:
    if kind in ("kl", "k1"):
        return logp - ref
    if kind == "abs":
        return abs(logp - ref)
    if kind in ("mse", "k2"):
        return 0.5 * (logp - ref) ** 2
    log_ratio = min(max(ref - logp, -20.0), 20.0)
    return min(max(math.exp(log_ratio) - log_ratio - 1, -10.0), 10.0)


@pytest.mark.parametrize("kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_estimators_match_reference(kind: str) -> None:
    generator = torch.Generator().manual_seed(6)
    logp = -torch.rand(4, 5, generator=generator, dtype=torch.float64) * 4
    ref = -torch.rand(4, 5, generator=generator, dtype=torch.float64) * 4
    ref[0, 0] = logp[0, 0] + 5.0  # large gap: exercises the k3 clamp (e^5 - 6 > 10)
    kl = kl_penalty(logp, ref, kind)
    for i in range(4):
        for t in range(5):
            assert kl[i, t].item() == pytest.approx(kl_reference(logp[i, t].item(), ref[i, t].item(), kind))
    assert kl_penalty(logp.float(), ref.float(), kind).dtype == torch.float32
    assert kl_penalty(logp.bfloat16(), ref.bfloat16(), kind).dtype == torch.float32


def test_kl_low_var_is_clamped_and_nonnegative() -> None:
    kl = kl_penalty(torch.tensor([[0.0, 0.0, -1.0]]), torch.tensor([[30.0, -30.0, -1.0]]), "low_var_kl")
    # unclamped: e^20 - 21 and e^-20 + 19, both above the clamp
    assert kl[0, 0].item() == 10.0 and kl[0, 1].item() == 10.0
    assert kl[0, 2].item() == 0.0 and (kl >= 0).all()


def test_kl_full_matches_explicit_sum_and_needs_distributions() -> None:
    generator = torch.Generator().manual_seed(7)
    logp = torch.log_softmax(torch.randn(2, 3, 6, generator=generator, dtype=torch.float64), -1)
    ref = torch.log_softmax(torch.randn(2, 3, 6, generator=generator, dtype=torch.float64), -1)
    kl = kl_penalty(logp, ref, "full")
    for i in range(2):
        for t in range(3):
            expected = sum(math.exp(p) * (p - q) for p, q in zip(logp[i, t].tolist(), ref[i, t].tolist()))
            assert kl[i, t].item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="full log-distributions"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")


# ----------------------------------------------------------------------------------------------------------------
# Aggregation


def aggregate_reference(loss: list[list[float]], mask: list[list[int]], mode: str, scale: float) -> float:
    """Full-batch loss of each mode, written with loops; empty rows are not sequences."""
    rows = [[v for v, m in zip(lr, mr) if m] for lr, mr in zip(loss, mask)]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / max(sum(len(r) for r in rows), 1)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / max(len(rows), 1)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / max(len(rows), 1)
    return sum(sum(r) for r in rows) / (max(len(rows), 1) * scale)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_matches_reference_with_empty_rows(mode: str) -> None:
    generator = torch.Generator().manual_seed(8)
    loss = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    mask = random_mask(6, 5, generator)
    mask[2] = 0  # an all-masked row
    loss[2] = float("nan")  # whatever sits under the mask must not leak
    value = aggregate_loss(loss, mask, mode, loss_scale_factor=8.0)
    assert value.item() == pytest.approx(aggregate_reference(loss.tolist(), mask.tolist(), mode, 8.0))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_of_fully_masked_batch_is_zero(mode: str) -> None:
    loss = torch.randn(3, 4, requires_grad=True)
    value = aggregate_loss(loss, torch.zeros(3, 4), mode)
    value.backward()
    assert value.item() == 0.0 and torch.all(loss.grad == 0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_micro_batches_over_workers_reproduce_the_full_batch(mode: str, world_size: int, seed: int) -> None:
    """Sum of micro-batch losses per worker, averaged over workers == full-batch loss, for values and gradients."""
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    batch, length = 12, 6
    base = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    mask = random_mask(batch, length, generator)

    full_input = base.clone().requires_grad_(True)
    full = aggregate_loss(full_input, mask, mode, loss_scale_factor=10.0)
    full.backward()

    num_tokens, num_seqs = count_normalizers(mask)  # the all-reduced counts of the mini-batch
    split_input = base.clone().requires_grad_(True)
    per_worker = np.array_split(np.arange(batch), world_size)
    worker_losses = []
    for rows in per_worker:
        cuts = sorted(rng.sample(range(1, len(rows)), k=min(2, len(rows) - 1))) if len(rows) > 1 else []
        worker_total = torch.zeros((), dtype=torch.float64)
        for micro in np.split(rows, cuts):
            index = torch.as_tensor(micro)
            worker_total = worker_total + aggregate_loss(
                split_input[index],
                mask[index],
                mode,
                num_global_tokens=num_tokens,
                num_global_seqs=num_seqs,
                world_size=world_size,
                loss_scale_factor=10.0,
            )
        worker_losses.append(worker_total)
    # FSDP averages gradients over workers: the mean of the worker losses has exactly that gradient.
    averaged = torch.stack(worker_losses).mean()
    averaged.backward()
    assert averaged.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(split_input.grad, full_input.grad, rtol=1e-12, atol=1e-12)


def test_count_normalizers_ignores_empty_rows() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert count_normalizers(mask) == (3.0, 2.0)


# ----------------------------------------------------------------------------------------------------------------
# Logits helpers


def log_softmax_reference(row: list[float]) -> list[float]:
    top = max(row)
    log_total = top + math.log(sum(math.exp(z - top) for z in row))
    return [z - log_total for z in row]


@pytest.mark.parametrize(("shape", "chunk"), [((2, 3, 7), 1), ((1, 9, 5), 4), ((4, 2, 11), 1024)])
def test_log_probs_and_entropy_match_reference(shape: tuple[int, int, int], chunk: int) -> None:
    generator = torch.Generator().manual_seed(9)
    logits = torch.randn(*shape, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, shape[-1], shape[:-1], generator=generator)
    log_probs = log_probs_from_logits(logits, labels, chunk_tokens=chunk)
    entropy = entropy_from_logits(logits, chunk_tokens=chunk)
    assert log_probs.shape == shape[:-1] and entropy.shape == shape[:-1]
    for i in range(shape[0]):
        for t in range(shape[1]):
            reference = log_softmax_reference(logits[i, t].tolist())
            assert log_probs[i, t].item() == pytest.approx(reference[labels[i, t]], abs=1e-12)
            expected_entropy = -sum(math.exp(lp) * lp for lp in reference)
            assert entropy[i, t].item() == pytest.approx(expected_entropy, abs=1e-12)


def test_logits_helpers_are_stable_and_upcast_half_precision() -> None:
    generator = torch.Generator().manual_seed(10)
    logits = torch.randn(2, 4, 9, generator=generator)
    labels = torch.randint(0, 9, (2, 4), generator=generator)
    shifted = logits + 1000.0
    assert torch.isinf(torch.exp(shifted)).all()  # a naive softmax would overflow
    # float32 spacing near 1000 is 6e-5, which bounds how close the shifted results can be
    torch.testing.assert_close(
        log_probs_from_logits(shifted, labels), log_probs_from_logits(logits, labels), atol=1e-3, rtol=0
    )
    torch.testing.assert_close(entropy_from_logits(shifted), entropy_from_logits(logits), atol=1e-3, rtol=0)
    half = log_probs_from_logits(logits.bfloat16(), labels)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, log_probs_from_logits(logits.bfloat16().float(), labels))
    uniform = entropy_from_logits(torch.zeros(3, 9))
    torch.testing.assert_close(uniform, torch.full((3,), math.log(9)))


def test_log_probs_gradient_is_onehot_minus_softmax() -> None:
    logits = torch.randn(1, 2, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 4]])
    log_probs_from_logits(logits, labels, chunk_tokens=1).sum().backward()
    expected = torch.nn.functional.one_hot(labels, 5).double() - torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(logits.grad, expected)
