import pytest
import torch

from easyr1.algorithms.value_loss import compute_value_loss


def reference(values, old_values, returns, clip):
    out = torch.zeros_like(values, dtype=torch.float64)
    clipped_count = 0
    for i in range(values.shape[0]):
        for t in range(values.shape[1]):
            v, o, r = float(values[i, t]), float(old_values[i, t]), float(returns[i, t])
            vc = o + min(max(v - o, -clip), clip)
            a, b = (v - r) ** 2, (vc - r) ** 2
            out[i, t] = 0.5 * max(a, b)
            clipped_count += b > a
    return out, clipped_count


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (4, 9)])
def test_matches_loop_reference(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    values, old_values, returns = (torch.randn(*shape, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(shape)
    loss, metrics = compute_value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    expected, clipped = reference(values, old_values, returns, 0.2)
    torch.testing.assert_close(loss, expected)
    assert metrics["vf_clipfrac"] == pytest.approx(clipped / values.numel())


def test_no_gradient_through_the_clipped_branch_when_it_dominates():
    old = torch.zeros(1, 1, dtype=torch.float64)
    returns = torch.full((1, 1), -1.0, dtype=torch.float64)
    # the value moved far away from old towards +: the clipped term (0.2 - (-1))^2 < (1 - (-1))^2, unclipped wins
    values = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
    compute_value_loss(values, old, returns, torch.ones(1, 1), 0.2)[0].sum().backward()
    assert values.grad.item() == pytest.approx(2.0)  # d/dv 0.5 (v - r)^2 = v - r
    # moving towards the target beyond the clip range: the clipped term dominates and has zero gradient
    values = torch.full((1, 1), 0.9, dtype=torch.float64, requires_grad=True)
    returns = torch.full((1, 1), 1.0, dtype=torch.float64)
    loss, metrics = compute_value_loss(values, old, returns, torch.ones(1, 1), 0.2)
    loss.sum().backward()
    assert metrics["vf_clipfrac"] == 1.0 and values.grad.item() == 0.0
