"""The HF engine's per-row sampler (engines/seeded_sampling.py) against a hand-written reference on small tensors."""

from __future__ import annotations

import torch

from easyr1.engines.base import SamplingSettings
from easyr1.engines.seeded_sampling import SeededSampler


SCORES = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, float("-inf")])  # the last: a banned token


def reference_distribution(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """What sampling with these settings draws from, written out: scores over temperature, the top_k highest kept,
    then the fewest highest whose probabilities reach top_p kept; the kept ones renormalised."""
    probs = torch.softmax(scores.double() / temperature, dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    if top_k > 0:
        keep[order[:top_k]] = True
    else:
        keep[:] = True
    kept = torch.where(keep, probs, 0.0)
    kept = kept / kept.sum()
    total = 0.0
    nucleus = torch.zeros_like(keep)
    for token in torch.argsort(kept, descending=True).tolist():
        if total >= top_p:
            break
        nucleus[token] = kept[token] > 0
        total += float(kept[token])
    kept = torch.where(nucleus, kept, 0.0)
    return kept / kept.sum()


def draw(seeds: list[int], sampling: SamplingSettings, scores: torch.Tensor = SCORES):
    """One step of the sampler over ``len(seeds)`` rows of the same scores: (tokens, log-probs, returned scores)."""
    sampler = SeededSampler(seeds, sampling)
    batch = scores.expand(len(seeds), -1).clone()
    returned = sampler(torch.zeros(len(seeds), 1, dtype=torch.long), batch)
    tokens = returned.argmax(dim=-1)
    return tokens, torch.tensor([row[0] for row in sampler.log_probs()]), returned


def test_draws_follow_the_warped_distribution_and_log_probs_are_its_own():
    rows = 6000
    for temperature, top_k, top_p in ((1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 3, 1.0), (1.0, -1, 0.8), (0.9, 5, 0.9)):
        sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)
        expected = reference_distribution(SCORES, temperature, top_k, top_p)
        tokens, log_probs, returned = draw(list(range(rows)), sampling)
        frequency = torch.bincount(tokens, minlength=len(SCORES)).double() / rows
        # 6000 draws: a frequency's standard error is at most 0.0065; the bound is five of them
        assert (frequency - expected).abs().max() < 0.033, (temperature, top_k, top_p, frequency, expected)
        assert frequency[expected == 0].sum() == 0  # nothing outside top-k / top-p, never the banned token
        torch.testing.assert_close(log_probs.double(), expected.log()[tokens], rtol=0, atol=1e-5)
        # generate is left one finite score per row: the chosen token's
        assert torch.equal(torch.isfinite(returned).sum(dim=-1), torch.ones(rows, dtype=torch.long))


def test_a_rows_tokens_depend_on_its_seed_alone():
    sampling = SamplingSettings(temperature=1.0)
    sampler = SeededSampler([11, 12, 13], sampling)
    alone = [SeededSampler([seed], sampling) for seed in (11, 12, 13)]
    generator = torch.Generator().manual_seed(0)
    together_tokens, alone_tokens = [], []
    for _ in range(20):  # a step's scores differ between rows and steps, as a model's do
        scores = torch.randn(3, 50, generator=generator)
        ids = torch.zeros(3, 1, dtype=torch.long)
        together_tokens.append(sampler(ids, scores.clone()).argmax(dim=-1))
        alone_tokens.append(
            torch.cat([one(ids[:1], scores[row : row + 1].clone()).argmax(-1) for row, one in enumerate(alone)])
        )
    assert torch.equal(torch.stack(together_tokens), torch.stack(alone_tokens))
    assert sampler.log_probs() == [one.log_probs()[0] for one in alone]
    # other seeds, other tokens: the equality is not one of constant draws
    other = SeededSampler([21, 22, 23], sampling)
    generator = torch.Generator().manual_seed(0)
    other_tokens = [
        other(torch.zeros(3, 1, dtype=torch.long), torch.randn(3, 50, generator=generator)).argmax(-1)
        for _ in range(20)
    ]
    assert not torch.equal(torch.stack(other_tokens), torch.stack(together_tokens))


def test_greedy_takes_the_highest_score_and_ignores_the_warpers():
    tokens, log_probs, _ = draw([0, 1, 2], SamplingSettings(temperature=0.5, top_k=2, greedy=True))
    assert tokens.tolist() == [0, 0, 0]
    torch.testing.assert_close(log_probs, torch.log_softmax(SCORES, dim=-1)[0].expand(3), rtol=0, atol=1e-6)
