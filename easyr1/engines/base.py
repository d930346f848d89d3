"""What every rollout engine does, and the response packing they share.

An engine receives a batch of prompts (one sample per row; the driver repeats each prompt ``n`` times
beforehand) and returns the same rows with:

- ``responses`` (B, R) generated ids, right-padded with the pad id,
- ``response_mask`` (B, R) 1 on generated tokens (the final EOS included),
- ``rollout_log_probs`` (B, R) the engine's log-prob of each sampled token (0 on padding),
- ``input_ids`` / ``attention_mask`` (B, P + R) prompt and response side by side,
- ``position_ids`` (B, 4, P + R) for vision-language models, (B, P + R) otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from easyr1.models.rope import extend_position_ids
from easyr1.protocol import Batch


@dataclass
class SamplingSettings:
    """Sampling knobs for one generate call (the rollout config, possibly overridden for validation)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    ignore_eos: bool = False
    greedy: bool = False


class RolloutEngine(Protocol):
    """Interface shared by the vLLM and Hugging Face engines.

    A rollout runs ``wake_weights()``, then ``sync_weights`` if the actor changed or ``weights_discarded``,
    then ``wake_kv_cache()``, ``generate`` and ``sleep()``: weights are only ever written into an awake engine.
    """

    weights_discarded: bool
    """True after a sleep that dropped the weights: the next rollout must sync even if the actor is unchanged."""

    def generate(self, prompts: Batch, sampling: SamplingSettings, seeds: list[int]) -> Batch:
        """Sample one response per row of ``prompts``; ``seeds`` makes each row's sampling reproducible."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's current full weights (Hugging Face parameter names)."""

    def sleep(self) -> None:
        """Release device memory held by the engine (weights, KV cache) where the platform supports it."""

    def wake_weights(self) -> None:
        """Re-allocate the weights' memory (contents undefined if ``weights_discarded``)."""

    def wake_kv_cache(self) -> None:
        """Re-allocate the KV cache."""

    def close(self) -> None:
        """Release what the engine holds beyond its memory (an in-process engine's parallel state), so that the
        process can build another one (a worker in the driver's process, ``trainer.single_process``)."""


def pack_responses(
    prompts: Batch,
    response_ids: list[list[int]],
    response_log_probs: list[list[float]],
    response_length: int,
    pad_token_id: int,
) -> Batch:
    """Pad the engine's responses to ``response_length`` and append them to the prompt tensors."""
    batch_size = len(response_ids)
    responses = torch.full((batch_size, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((batch_size, response_length), dtype=torch.long)
    rollout_log_probs = torch.zeros((batch_size, response_length), dtype=torch.float32)
    for row, (ids, log_probs) in enumerate(zip(response_ids, response_log_probs)):
        ids, log_probs = ids[:response_length], log_probs[:response_length]
        responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[row, : len(ids)] = 1
        rollout_log_probs[row, : len(ids)] = torch.tensor(log_probs, dtype=torch.float32)

    out = prompts.union(Batch())  # shallow copy of the prompt fields
    out["prompts"] = prompts["input_ids"]
    out["responses"] = responses
    out["response_mask"] = response_mask
    out["rollout_log_probs"] = rollout_log_probs
    out["input_ids"] = torch.cat([prompts["input_ids"], responses], dim=-1)
    out["attention_mask"] = torch.cat([prompts["attention_mask"], response_mask], dim=-1)
    out["position_ids"] = extend_position_ids(prompts["position_ids"], response_length)
    return out
