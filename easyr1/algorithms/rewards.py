"""Token-level reward placement: scores (one per sample, or one per turn of an episode) -> (B, T) token rewards.

A response's reward sits on its last model token. In a multi-turn trajectory the response region interleaves the
model's turns with the environment's observation tokens, so ``response_mask`` has gaps: the last token is the
position of the last 1 in the mask, not ``mask.sum() - 1``. ``turn_ids`` (B, T) numbers the model tokens by their
turn (0, 1, ...) and is -1 on environment tokens and padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def last_valid_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B,) long: the position of the last 1 of each row; 0 for a row without any."""
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected (B, T)")
    valid = response_mask.bool()
    if valid.shape[1] == 0:
        return torch.zeros(valid.shape[0], dtype=torch.long, device=valid.device)
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    return torch.where(valid, positions, torch.zeros_like(positions)).amax(dim=-1)


def place_scores_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence scores -> (B, T) float32 token rewards with each score on its row's last model token.

    The last model token is the last 1 of ``response_mask``, which may have gaps (environment tokens inside a
    multi-turn trajectory); for a contiguous mask it is ``mask.sum() - 1``. A row without model tokens keeps its
    score at position 0, so a sequence score read as the sum of its row is never lost.
    """
    if scores.shape != (response_mask.shape[0],):
        raise ValueError(
            f"scores has shape {tuple(scores.shape)}, expected ({response_mask.shape[0]},): one score per sample"
        )
    token_rewards = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    rows = torch.arange(len(scores), device=response_mask.device)
    token_rewards[rows, last_valid_positions(response_mask)] = scores.to(token_rewards)
    return token_rewards


def turn_last_positions(turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """(B, T) turn indices -> (B, num_turns) long: the position of each turn's last token, -1 for a turn absent from
    the row. Tokens with turn id -1 (environment, padding) or ``>= num_turns`` belong to no counted turn."""
    if turn_ids.dim() != 2:
        raise ValueError(f"turn_ids has shape {tuple(turn_ids.shape)}, expected (B, T)")
    batch, length = turn_ids.shape
    counted = (turn_ids >= 0) & (turn_ids < num_turns)
    # Tokens of no counted turn go to an extra column that is dropped at the end.
    columns = torch.where(counted, turn_ids.long(), torch.full_like(turn_ids, num_turns, dtype=torch.long))
    positions = torch.arange(length, device=turn_ids.device).expand(batch, length)
    last = torch.full((batch, num_turns + 1), -1, dtype=torch.long, device=turn_ids.device)
    last.scatter_reduce_(1, columns, positions, reduce="amax")
    return last[:, :num_turns]


def place_turn_rewards(turn_rewards: Sequence[Sequence[float]], turn_ids: torch.Tensor) -> torch.Tensor:
    """Per-turn rewards -> (B, T) float32 token rewards: reward ``k`` of row ``b`` on the last token of turn ``k``.

    A turn without tokens (the model ended its message at once) has no token of its own: its reward is added on
    the last token of the latest earlier turn (position 0 when there is none), so it stays with the turns that led
    to it and the row's sum is still the episode's return.

    Args:
        turn_rewards: for each of the B rows, the reward of each of its turns, in turn order.
        turn_ids: (B, T) long, the turn index on every model token, -1 on environment tokens and padding.

    Returns:
        (B, T) float32, 0 everywhere but on the turns' last tokens.

    Raises:
        ValueError: when the rows disagree in number, or a row has tokens of a turn it has no reward for.
    """
    if turn_ids.dim() != 2:
        raise ValueError(f"turn_ids has shape {tuple(turn_ids.shape)}, expected (B, T)")
    batch = turn_ids.shape[0]
    if len(turn_rewards) != batch:
        raise ValueError(f"turn_rewards has {len(turn_rewards)} rows but turn_ids has {batch}: one list per sample")
    num_turns = max((len(row) for row in turn_rewards), default=0)
    counts = torch.tensor([len(row) for row in turn_rewards], dtype=torch.long, device=turn_ids.device)
    beyond = (turn_ids >= counts.unsqueeze(1)).any(dim=1)
    if beyond.any():
        row = int(beyond.nonzero()[0])
        raise ValueError(
            f"row {row} has tokens of turn {int(turn_ids[row].max())} but only {len(turn_rewards[row])} turn rewards"
        )
    token_rewards = torch.zeros(turn_ids.shape, dtype=torch.float32, device=turn_ids.device)
    if num_turns == 0:
        return token_rewards
    last = turn_last_positions(turn_ids, num_turns)
    # An empty turn falls back to the last token of the turns before it: the running maximum of their last tokens.
    positions = torch.where(last >= 0, last, last.cummax(dim=1).values.clamp(min=0))
    rewards = torch.zeros((batch, num_turns), dtype=torch.float32, device=turn_ids.device)
    has_reward = torch.zeros((batch, num_turns), dtype=torch.bool, device=turn_ids.device)
    for row, row_rewards in enumerate(turn_rewards):
        rewards[row, : len(row_rewards)] = torch.tensor([float(r) for r in row_rewards], dtype=torch.float32)
        has_reward[row, : len(row_rewards)] = True
    rows, turns = has_reward.nonzero(as_tuple=True)
    # accumulate: an empty turn's reward joins the reward already on its fallback token
    token_rewards.index_put_((rows, positions[rows, turns]), rewards[rows, turns], accumulate=True)
    return token_rewards
