"""Sampling in which every row of a batch draws from a random stream of its own, inside transformers' ``generate``.

``generate`` samples all rows of a batch from one global generator, so a row's tokens would depend on which rows
share its batch. :class:`SeededSampler` takes the choice of token away from it: ``generate`` runs greedy
(``do_sample=False``) with the sampler as its last logits processor, and the sampler, for each row,

1. warps the scores as transformers' own sampling does (temperature, then top-k, then top-p, with transformers'
   warpers);
2. picks the token by an exponential race: ``argmax(log p - log E)``, ``E ~ Exp(1)`` drawn from the row's own
   generator, is a draw from ``p`` (the softmax of the warped scores), the way vLLM samples seeded requests;
3. records that token's log-prob under ``p``, and hands back scores whose only finite entry is the token, so the
   greedy step takes it.

A row's tokens then depend on its inputs and its seed alone, whatever rows share its ``generate``.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from easyr1.engines.base import SamplingSettings


class SeededSampler(LogitsProcessor):
    """Chooses each row's next token from the row's own generator (seeded with ``seeds[row]``); greedy when
    ``sampling.greedy``. Pass it as the last logits processor of a greedy ``generate``; :meth:`log_probs` gives
    the chosen tokens' log-probs afterwards."""

    def __init__(self, seeds: list[int], sampling: SamplingSettings) -> None:
        self.seeds = seeds
        self.greedy = sampling.greedy
        self.warpers: list[LogitsProcessor] = []
        if not sampling.greedy:
            self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                self.warpers.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
        self.generators: list[torch.Generator] = []  # made on the first call, on the scores' device
        self.chosen_log_probs: list[torch.Tensor] = []  # one (rows,) tensor per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Scores (rows, vocab) -> scores that leave each row one token: the one its generator chose."""
        rows, vocab = scores.shape
        if len(self.seeds) != rows:
            raise ValueError(f"SeededSampler has {len(self.seeds)} seeds for a batch of {rows} rows")
        scores = scores.float()
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        log_probs = torch.log_softmax(scores, dim=-1)
        if self.greedy:
            tokens = log_probs.argmax(dim=-1)
        else:
            if not self.generators:
                self.generators = [torch.Generator(scores.device).manual_seed(seed) for seed in self.seeds]
            race = torch.stack(
                [torch.empty(vocab, device=scores.device).exponential_(generator=gen) for gen in self.generators]
            )
            tokens = (log_probs - race.log()).argmax(dim=-1)
        self.chosen_log_probs.append(log_probs.gather(-1, tokens[:, None]).squeeze(-1))
        choice = torch.full_like(scores, float("-inf"))
        return choice.scatter_(-1, tokens[:, None], 0.0)

    def log_probs(self) -> list[list[float]]:
        """Each row's chosen tokens' log-probs, one per step ``generate`` took (finished rows included)."""
        if not self.chosen_log_probs:
            return [[] for _ in self.seeds]
        return torch.stack(self.chosen_log_probs, dim=-1).tolist()
