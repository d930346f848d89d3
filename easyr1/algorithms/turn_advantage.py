"""Turn-level credit for multi-turn trajectories: the ``turn_gae`` advantage estimator.

A multi-turn episode is one training sequence whose response region holds the model's turns with the
environment's observation tokens between them (``response_mask`` 0 there). Token-level GAE (``gae``) discounts
over every model token of the episode, so a reward ``n`` tokens away is weighted by ``(gamma * lam) ** n``: with
long turns the credit of a late reward hardly reaches the first turns unless ``gamma = lam = 1``. ``turn_gae``
discounts over *turns* instead (``algorithm.turn_gamma``, ``algorithm.turn_lam``), and over tokens only inside a
turn (``algorithm.gamma``, ``algorithm.lam``).
"""

from __future__ import annotations

import torch

from easyr1.algorithms.advantage import (
    EstimatorNeeds,
    _check_token_inputs,
    _output_dtype,
    masked_whiten,
    register_adv_estimator,
)
from easyr1.algorithms.rewards import turn_last_positions
from easyr1.errors import ConfigError


def _check_turn_ids(turn_ids: torch.Tensor, valid: torch.Tensor) -> None:
    """Every model token has a turn (id >= 0), and the turns of a row follow each other in order."""
    if turn_ids.dtype.is_floating_point or turn_ids.dtype == torch.bool:
        raise ValueError(f"turn_ids must be an integer tensor (the turn index per token), got {turn_ids.dtype}")
    without_turn = valid & (turn_ids < 0)
    if without_turn.any():
        row, position = (int(i) for i in without_turn.nonzero()[0])
        raise ValueError(
            f"response_mask is 1 at row {row}, position {position} but turn_ids is {int(turn_ids[row, position])}: "
            "every model token needs its turn index (>= 0)"
        )
    if turn_ids.shape[1] == 0:
        return
    ids = torch.where(valid, turn_ids.long(), torch.full_like(turn_ids, -1, dtype=torch.long))
    # A model token whose turn index is below an earlier token's belongs to a turn that already ended.
    out_of_order = valid & (ids < ids.cummax(dim=1).values)
    if out_of_order.any():
        row = int(out_of_order.any(dim=1).nonzero()[0])
        raise ValueError(f"turn_ids of row {row} decrease along the sequence: each turn must follow the earlier ones")


@register_adv_estimator("turn_gae", needs=EstimatorNeeds(critic=True, turn_ids=True))
def compute_turn_gae_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    turn_ids: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 1.0,
    turn_lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE: GAE over an episode's turns, then GAE over the tokens inside each turn.

    For each row, with turns ``k = 0 .. K-1`` (the model tokens where ``turn_ids == k``):

    - ``r_k`` is the sum of ``token_level_rewards`` over turn ``k``'s model tokens: the turn's reward (placed on its
      last token by the rollout) plus, when the KL is in the reward, the KL penalties of the turn's tokens. Rewards
      on environment tokens and padding are ignored.
    - ``V_k`` is the critic's value at turn ``k``'s last token (the state after the turn's text is written).
    - Turn level, backwards: ``delta_k = r_k + turn_gamma * V_{k+1} - V_k`` and
      ``A_k = delta_k + turn_gamma * turn_lam * A_{k+1}`` (``V_K = A_K = 0``, past the last turn).
    - Token level, backwards inside turn ``k``: the turn's last token gets ``A_k``; every earlier token ``t`` of
      the turn gets ``delta_t = gamma * V_next - V_t`` (no reward on these tokens) and
      ``A_t = delta_t + gamma * lam * A_next``, where ``next`` is the turn's next model token. Environment tokens
      are skipped and carry nothing; no token sees past its turn's last token except through ``A_k``.
    - ``returns = A + V`` on model tokens (the critic's targets, before whitening); the advantages are whitened over
      the batch's model tokens (:func:`masked_whiten`), as for ``gae``. Both are 0 on environment tokens and padding.

    With one turn this is ``gae`` with the reward on the last token; with one model token per turn and
    ``turn_gamma = gamma``, ``turn_lam = lam`` it is ``gae`` over the model tokens.

    Where it follows and differs from the published bi-level GAE:

    - RAGEN's ``compute_bi_level_gae_advantage_return`` (also VAGEN's first version): the same two passes (turn
      values at each turn's last token, the turn's advantage on its last token, token GAE inside the turn with no
      reward on earlier tokens). Differences: turns come from ``turn_ids`` instead of the nonzero rewards (a turn
      with reward 0 vanishes there, and a per-token KL penalty makes every token a turn); the turn level has its
      own lambda (``turn_lam``; RAGEN reuses the token ``lam``); a turn's per-token rewards (the in-reward KL) are
      summed into its turn reward.
    - VAGEN's current ``bi_level_gae`` ("variable clock"): one recursion over the model tokens that spends
      ``gamma_turn``/``lambda_turn`` when it crosses a turn boundary, with no discount inside a turn, bootstrapping
      from the next turn's *first* token, optionally mixed with token GAE. Here the turn level bootstraps from the
      next turn's *last* token and the token discount inside a turn is ``algorithm.gamma``; with both lambdas of
      each at 1 and ``gamma = 1`` the turns' last tokens get the same advantages from both.
    - StarPO (RAGEN's paper) is the trajectory-level objective these estimators serve: the episode, not the turn,
      is the sample, and the return sums the turns' rewards.

    Args:
        token_level_rewards: (B, T) rewards: each turn's reward on its last model token (minus any in-reward KL).
        response_mask: (B, T) 1 on model tokens, 0 on environment tokens and padding.
        values: (B, T) critic values (old values, computed before the update).
        turn_ids: (B, T) integer, the turn index (0, 1, ...) on every model token, -1 elsewhere; given by the
            multi-turn rollout only.
        gamma: token-level discount inside a turn.
        lam: token-level GAE lambda inside a turn.
        turn_gamma: discount from one turn to the next.
        turn_lam: GAE lambda over turns.

    Returns:
        (advantages (B, T) whitened, returns (B, T)), both 0 outside the mask.
    """
    if turn_ids is None:
        raise ConfigError(
            "algorithm.adv_estimator=turn_gae assigns credit over an episode's turns and is for multi-turn runs: set "
            "env.name or env.env_class (the env section), or use algorithm.adv_estimator=gae for single-turn runs"
        )
    _check_token_inputs(response_mask, token_level_rewards=token_level_rewards, values=values, turn_ids=turn_ids)
    valid = response_mask.bool()
    _check_turn_ids(turn_ids, valid)
    dtype = _output_dtype(token_level_rewards)
    if not valid.any():
        return torch.zeros(valid.shape, dtype=dtype), torch.zeros(valid.shape, dtype=dtype)
    rewards = torch.where(valid, token_level_rewards.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    values64 = values.detach().to(torch.float64)
    ids = torch.where(valid, turn_ids.long(), torch.full_like(turn_ids, -1, dtype=torch.long))
    num_turns = int(ids.max().item()) + 1
    columns = ids.clamp(min=0)  # gather/scatter index; only read where valid

    # Turn level: each turn's reward, its value at its last token, and the backward GAE over the present turns.
    last = turn_last_positions(ids, num_turns)
    present = last >= 0
    turn_rewards = torch.zeros_like(last, dtype=torch.float64).scatter_add_(1, columns, rewards)
    turn_values = torch.where(present, values64.gather(1, last.clamp(min=0)), torch.zeros((), dtype=torch.float64))
    turn_advantages = torch.zeros_like(turn_values)
    next_value = torch.zeros_like(values64[:, 0])
    next_advantage = torch.zeros_like(values64[:, 0])
    for k in reversed(range(num_turns)):
        delta = turn_rewards[:, k] + turn_gamma * next_value - turn_values[:, k]
        advantage = delta + turn_gamma * turn_lam * next_advantage
        turn_advantages[:, k] = advantage
        # A turn id a row skips (absent turn) passes the later turn's value and advantage on unchanged.
        next_value = torch.where(present[:, k], turn_values[:, k], next_value)
        next_advantage = torch.where(present[:, k], advantage, next_advantage)

    # Token level: backwards inside each turn, starting from the turn's advantage on its last token.
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    is_last = valid & (positions == last.gather(1, columns))
    advantage_of_turn = turn_advantages.gather(1, columns)
    raw = torch.zeros_like(values64)
    next_value = torch.zeros_like(values64[:, 0])
    next_advantage = torch.zeros_like(values64[:, 0])
    for t in reversed(range(ids.shape[1])):
        inside = gamma * next_value - values64[:, t] + gamma * lam * next_advantage
        advantage = torch.where(is_last[:, t], advantage_of_turn[:, t], inside)
        next_value = torch.where(valid[:, t], values64[:, t], next_value)
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        raw[:, t] = advantage
    mask = response_mask.to(torch.float64)
    returns = (raw + values64) * mask
    return masked_whiten(raw, response_mask).to(dtype), returns.to(dtype)
