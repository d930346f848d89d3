"""What every rollout engine does, and the response packing they share.

An engine receives a batch of prompts (one sample per row; the driver repeats each prompt ``n`` times
beforehand) and returns the same rows with:

- ``responses`` (B, R) generated ids, right-padded with the pad id,
- ``response_mask`` (B, R) 1 on generated tokens (the final EOS included),
- ``rollout_log_probs`` (B, R) the engine's log-prob of each sampled token (0 on padding),
- ``input_ids`` / ``attention_mask`` (B, P + R) prompt and response side by side,
- ``position_ids`` (B, 4, P + R) for vision-language models, (B, P + R) otherwise.

Partial responses (``async_training.schedule=partial_rollout``): a row may carry ``partial_ids`` and
``partial_log_probs`` (the tokens an earlier call sampled, under older weights); the engine continues after them with
the remaining token budget, and the returned response is the partial one followed by the new tokens. With a
:class:`StopRule` the call may stop before every row is done: ``finished`` (B,) says which rows ended (EOS or the
token budget) and ``new_tokens`` (B,) how many tokens each row gained. Rows whose ``active`` is false are not
generated (padding that keeps the workers' shares equal) and come back empty.
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


@dataclass(frozen=True)
class StopRule:
    """When a generate call may stop before every row is done.

    The call stops once ``groups`` groups of rows (rows sharing a ``uid``) have all their rows finished and every
    row flagged ``must_finish`` is finished; the rows still running then come back unfinished, with what they have
    sampled so far.
    """

    groups: int


def stop_position(
    lengths: list[int], finished: list[bool], uids: list[str], must_finish: list[bool], groups: int
) -> int:
    """The decoding position at which a call under ``StopRule(groups)`` stops, were every row decoded in lockstep
    (one token per row per position): the first position where ``groups`` groups and every ``must_finish`` row are
    finished. ``lengths`` are the rows' new tokens if run to the end, ``finished`` whether they ended there."""
    done_at: dict[str, int] = {}
    required = 0
    for length, ended, uid, must in zip(lengths, finished, uids, must_finish):
        end = length if ended else 2**62  # a row that never ends within the call finishes no group
        done_at[uid] = max(done_at.get(uid, 0), end)
        if must:
            required = max(required, end)
    completions = sorted(done_at.values())
    quota = completions[min(groups, len(completions)) - 1] if completions and groups > 0 else 0
    return max(quota, required)


class RolloutEngine(Protocol):
    """Interface shared by the vLLM and Hugging Face engines.

    A rollout runs ``wake_weights()``, then ``sync_weights`` if the actor changed or ``weights_discarded``,
    then ``wake_kv_cache()``, ``generate`` and ``sleep()``: weights are only ever written into an awake engine.
    """

    weights_discarded: bool
    """True after a sleep that dropped the weights: the next rollout must sync even if the actor is unchanged."""

    def generate(
        self, prompts: Batch, sampling: SamplingSettings, seeds: list[int], stop: StopRule | None = None
    ) -> Batch:
        """Sample one response per row of ``prompts`` (continuing its ``partial_ids`` if any); ``seeds`` makes each
        row's sampling reproducible; with ``stop`` the call may end before every row is done."""

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


def partial_of(prompts: Batch, row: int) -> tuple[list[int], list[float]]:
    """The tokens and log-probs row ``row`` already has (empty unless it continues a partial response)."""
    if "partial_ids" not in prompts:
        return [], []
    return list(prompts["partial_ids"][row]), list(prompts["partial_log_probs"][row])


def is_active(prompts: Batch, row: int) -> bool:
    """Whether row ``row`` is to be generated (rows with ``active`` false only pad a worker's share)."""
    return "active" not in prompts or bool(prompts["active"][row])


def pack_continued(
    prompts: Batch,
    new_ids: list[list[int]],
    new_log_probs: list[list[float]],
    ended: list[bool],
    response_length: int,
    pad_token_id: int,
) -> Batch:
    """:func:`pack_responses` of each row's partial response followed by its new tokens, with ``finished`` (the row
    ended: EOS, or the whole token budget used) and ``new_tokens``."""
    ids, log_probs, finished = [], [], []
    for row in range(len(prompts)):
        old_ids, old_log_probs = partial_of(prompts, row)
        ids.append(old_ids + new_ids[row])
        log_probs.append(old_log_probs + new_log_probs[row])
        finished.append(bool(ended[row]) or len(ids[-1]) >= response_length)
    out = pack_responses(prompts, ids, log_probs, response_length, pad_token_id)
    out["finished"] = torch.tensor(finished, dtype=torch.bool)
    out["new_tokens"] = torch.tensor([len(row) for row in new_ids], dtype=torch.long)
    return out
