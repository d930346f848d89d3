"""Advantage estimators: turn rewards into per-token advantages (and returns) for the policy update.

Every estimator is registered by name with :func:`register_adv_estimator` and called through
:func:`compute_advantages`, which passes each estimator only the keyword arguments its signature names, so the
trainer can hand over everything it has (rewards, mask, group index, values, gamma, ...) without knowing which
estimator needs what. Shapes: ``B`` samples, ``T`` response tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from easyr1.algorithms.registry import Registry


AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "algorithm.adv_estimator")


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator needs besides rewards, declared where it is registered so that neither the config checks
    nor the trainer compare estimator names.

    Attributes:
        critic: values from a critic model (the critic is built and trained).
        greedy_baseline: each prompt's greedy response's score as ``reward_baselines`` (one extra generation round).
        min_group_size: fewest samples per prompt (``worker.rollout.n``) the estimator can compare.
        turn_ids: each token's turn index as ``turn_ids``, which only a multi-turn rollout (the ``env`` section)
            gives.
        one_per_sample: the advantage is one number per sample, put on all its tokens, and depends on the sample's
            rewards only through their sum; so an episode whose turns are separate rows (``env.context=latest``)
            can be scored as one sample and share its advantage with all its rows.
    """

    critic: bool = False
    greedy_baseline: bool = False
    min_group_size: int = 1
    turn_ids: bool = False
    one_per_sample: bool = False


def register_adv_estimator(
    name: str, *, needs: EstimatorNeeds | None = None
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering an estimator ``fn(**inputs) -> (advantages (B, T), returns (B, T))`` as ``name``,
    with what it needs besides rewards (nothing by default)."""
    return ADV_ESTIMATORS.register(name, traits=needs or EstimatorNeeds())


def estimator_needs(name: str) -> EstimatorNeeds:
    """What the estimator registered as ``name`` needs (ConfigError listing the valid names for an unknown one)."""
    return ADV_ESTIMATORS.traits(name)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """Return the estimator registered as ``name`` (ConfigError listing the valid names otherwise)."""
    return ADV_ESTIMATORS.get(name)


def compute_advantages(name: str, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator ``name`` on the subset of ``inputs`` that its signature accepts.

    Returns:
        (advantages (B, T), returns (B, T)), zero outside the response mask.
    """
    estimator = get_adv_estimator(name)
    parameters = inspect.signature(estimator).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return estimator(**inputs)
    missing = [
        p.name
        for p in parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and p.name not in inputs
    ]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs {missing}, which the caller did not provide")
    return estimator(**{key: value for key, value in inputs.items() if key in parameters})


def group_ids_from_index(index: np.ndarray | Sequence[Any] | torch.Tensor, batch_size: int) -> torch.Tensor:
    """Map arbitrary group labels (uids, ints) to dense ids 0..G-1.

    Args:
        index: (B,) group label of every sample; samples generated from the same prompt share a label.
        batch_size: B, to check the length.

    Returns:
        (B,) long tensor of dense group ids.
    """
    labels = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    if labels.shape != (batch_size,):
        raise ValueError(f"group index has shape {labels.shape}, expected ({batch_size},): one label per sample")
    _, inverse = np.unique(labels, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def sequence_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Sequence score from token rewards: (B, T) -> (B,) sum over tokens; a (B,) input is returned as is."""
    if token_level_rewards.dim() == 1:
        return token_level_rewards
    if token_level_rewards.dim() == 2:
        return token_level_rewards.sum(dim=-1)
    shape = tuple(token_level_rewards.shape)
    raise ValueError(f"rewards must be (B, T) token rewards or (B,) scores, got shape {shape}")


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten ``values`` over the valid positions of the whole batch: ``(x - mean) / sqrt(var + eps)``.

    ``mean`` and ``var`` are taken over every position where ``mask`` is true (all rows together); ``var`` is the
    unbiased (``n - 1``) variance, as in EasyR1/verl, except with a single valid position, where it is 0. Computed in
    float64.

    Args:
        values: (B, T) values to whiten.
        mask: (B, T) valid positions, bool or 0/1.
        eps: added to the variance.

    Returns:
        (B, T) float64 whitened values, 0 outside the mask (all 0 when nothing is valid).
    """
    valid = mask.bool()
    values64 = torch.where(valid, values.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    count = int(valid.sum().item())
    if count == 0:
        return torch.zeros_like(values64)
    mean = values64.sum() / count
    centered = torch.where(valid, values64 - mean, torch.zeros((), dtype=torch.float64))
    variance = centered.square().sum() / max(count - 1, 1)
    return centered * torch.rsqrt(variance + eps)


def _check_mask(response_mask: torch.Tensor, batch_size: int) -> None:
    if response_mask.dim() != 2 or response_mask.shape[0] != batch_size:
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected ({batch_size}, T)")


def _check_token_inputs(response_mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Every tensor must be (B, T), the shape of the 2-D ``response_mask``."""
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected (B, T)")
    for name, tensor in tensors.items():
        if tensor.shape != response_mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but response_mask has {tuple(response_mask.shape)}; "
                "both must be (B, T)"
            )


def _output_dtype(tensor: torch.Tensor) -> torch.dtype:
    """Advantages keep the rewards' float dtype; integer rewards give float32."""
    return tensor.dtype if tensor.is_floating_point() else torch.float32


def _on_tokens(per_sequence: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Put one value per sequence (B,) on every valid token: (B, T), 0 elsewhere."""
    return per_sequence.to(dtype).unsqueeze(-1) * response_mask.to(dtype)


def _grouped_scores(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray | Sequence[Any] | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 sequence scores (B,), dense group ids (B,) and group sizes (G,) as float64."""
    scores = sequence_scores(token_level_rewards)
    batch_size = scores.shape[0]
    _check_mask(response_mask, batch_size)
    group_ids = group_ids_from_index(index, batch_size).to(scores.device)
    num_groups = int(group_ids.max().item()) + 1 if batch_size else 0
    # Group statistics in float64: rewards are small numbers but groups can be large.
    scores64 = scores.detach().to(torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, group_ids, torch.ones_like(scores64)
    )
    return scores64, group_ids, counts


def _group_sums(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum of ``values`` (B,) within each group: (G,)."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, group_ids, values)


def _group_members(group_ids: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Sample indices of each group, in batch order: one (n_g,) tensor per group."""
    order = torch.argsort(group_ids, stable=True)
    return order.split([int(count) for count in counts.tolist()])


@register_adv_estimator("grpo", needs=EstimatorNeeds(min_group_size=2, one_per_sample=True))
def compute_grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | torch.Tensor,
    eps: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the sequence score normalised within its group of responses to one prompt.

    ``A_i = (s_i - mean_g) / (std_g + eps)`` (or ``s_i - mean_g`` with ``norm_adv_by_std=False``, Dr. GRPO), put on
    every valid token of response ``i``. ``std_g`` is the unbiased (``n - 1``) standard deviation, as
    ``torch.std`` computes it in EasyR1 and verl. A group whose scores are all equal gets advantage 0. A group of
    a single response gets advantage 0 (there is nothing to compare it with; EasyR1 refuses such groups and verl
    uses mean 0 / std 1, i.e. the raw score).

    Papers: GRPO, Shao et al. 2024, arXiv:2402.03300; Dr. GRPO, Liu et al. 2025, arXiv:2503.20783.

    Args:
        token_level_rewards: (B, T) rewards (summed into the score) or (B,) scores.
        response_mask: (B, T) valid response tokens.
        index: (B,) group label (prompt uid) of every sample.
        eps: added to the std to avoid dividing by zero.
        norm_adv_by_std: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        (advantages (B, T), returns (B, T)); both are the same tensor for GRPO.
    """
    scores, group_ids, counts = _grouped_scores(token_level_rewards, response_mask, index)
    means = _group_sums(scores, group_ids, len(counts)) / counts
    centered = scores - means[group_ids]
    std = (_group_sums(centered.square(), group_ids, len(counts)) / (counts - 1).clamp(min=1)).sqrt()
    advantages = centered / (std[group_ids] + eps) if norm_adv_by_std else centered
    advantages = torch.where(counts[group_ids] > 1, advantages, torch.zeros_like(advantages))
    token_advantages = _on_tokens(advantages, response_mask, _output_dtype(token_level_rewards))
    return token_advantages, token_advantages


@register_adv_estimator("grpo_passk", needs=EstimatorNeeds(min_group_size=2, one_per_sample=True))
def compute_grpo_passk_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | torch.Tensor,
    eps: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage (k = group size): only the best response of each group is reinforced.

    The pass@k objective of a group is the best score in it; its leave-one-out gradient estimate gives the best
    response ``A = (s_max - s_second) / (std_g + eps)`` and every other response 0 (Tang et al. 2025, "Optimizing
    Language Models for Inference Time Objectives using Reinforcement Learning", arXiv:2503.19595; the definition
    of EasyR1's and verl's ``grpo_passk``, including the division by the group's unbiased std, which
    ``norm_adv_by_std=False`` drops). A tie for the best score gives the whole group 0. A group of one response
    gets 0 (there is no second best; EasyR1 and verl refuse such groups).

    Args:
        token_level_rewards: (B, T) rewards (summed into the score) or (B,) scores.
        response_mask: (B, T) valid response tokens.
        index: (B,) group label (prompt uid) of every sample.
        eps: added to the std to avoid dividing by zero.
        norm_adv_by_std: divide the gap by the group's std.

    Returns:
        (advantages (B, T), returns (B, T)); the same tensor.
    """
    scores, group_ids, counts = _grouped_scores(token_level_rewards, response_mask, index)
    advantages = torch.zeros_like(scores)
    for members in _group_members(group_ids, counts):
        if len(members) < 2:
            continue
        group_scores = scores[members]
        top = torch.topk(group_scores, k=2)
        gap = top.values[0] - top.values[1]
        if gap == 0:  # a tie for the best (or an all-equal group): nothing to reinforce, and std may be 0
            continue
        if norm_adv_by_std:
            gap = gap / (group_scores.std() + eps)
        advantages[members[top.indices[0]]] = gap
    token_advantages = _on_tokens(advantages, response_mask, _output_dtype(token_level_rewards))
    return token_advantages, token_advantages


@register_adv_estimator("rloo", needs=EstimatorNeeds(min_group_size=2, one_per_sample=True))
def compute_rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: the baseline of a response is the mean score of the *other* responses in its group.

    ``A_i = s_i - (sum_g - s_i) / (n_g - 1)`` (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", arXiv:2402.14740), which equals
    ``n_g / (n_g - 1) * (s_i - mean_g)``. A group of one response gets 0 (no other response to form a baseline;
    EasyR1 refuses such groups).

    Args:
        token_level_rewards: (B, T) rewards (summed into the score) or (B,) scores.
        response_mask: (B, T) valid response tokens.
        index: (B,) group label (prompt uid) of every sample.

    Returns:
        (advantages (B, T), returns (B, T)); the same tensor.
    """
    scores, group_ids, counts = _grouped_scores(token_level_rewards, response_mask, index)
    sums = _group_sums(scores, group_ids, len(counts))
    others = (counts - 1)[group_ids]
    baseline = (sums[group_ids] - scores) / others.clamp(min=1)
    advantages = torch.where(others > 0, scores - baseline, torch.zeros_like(scores))
    token_advantages = _on_tokens(advantages, response_mask, _output_dtype(token_level_rewards))
    return token_advantages, token_advantages


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns, whitened over every valid token of the batch (no critic, no groups).

    ``G_t = r_t + gamma * G_next`` backwards over the valid tokens ``t`` of each row, where ``G_next`` is the return
    of the next *valid* token (0 past the last one): masked tokens are skipped and their rewards ignored, so in a
    multi-turn trajectory an earlier turn's tokens see the rewards of the later turns across the environment's
    tokens, and ``gamma`` counts model tokens only. Then ``A = whiten(G)`` with the batch mean and unbiased std over
    valid tokens (:func:`masked_whiten`). Hu et al. 2025, "REINFORCE++", arXiv:2501.03262. KL-in-reward, if any,
    is already part of ``token_level_rewards``. On a contiguous (right-padded) mask this is EasyR1's and verl's
    "reset after EOS"; on a mask with gaps they cut the sum at each gap instead, which would hide a later turn's
    reward from the earlier turns.

    Args:
        token_level_rewards: (B, T) per-token rewards.
        response_mask: (B, T) valid response tokens.
        gamma: discount factor.

    Returns:
        (advantages (B, T) whitened, returns (B, T) = G), both 0 outside the mask.
    """
    _check_token_inputs(response_mask, token_level_rewards=token_level_rewards)
    rewards = token_level_rewards.detach().to(torch.float64)
    mask = response_mask.to(torch.float64)
    valid = response_mask.bool()
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    dtype = _output_dtype(token_level_rewards)
    return masked_whiten(returns, response_mask).to(dtype), (returns * mask).to(dtype)


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: subtract the group's mean score, then whiten over the batch's valid tokens.

    ``A_it = whiten(s_i - mean_g)`` where the whitening (:func:`masked_whiten`) uses the mean and unbiased std of
    the centred scores over every valid token of the batch, so longer responses weigh more in those statistics
    (verl's ``reinforce_plus_plus_baseline``; Hu et al. 2025, arXiv:2501.03262). A group of one response uses
    baseline 0, as in verl (the batch whitening still centres it).

    Args:
        token_level_rewards: (B, T) rewards (summed into the score) or (B,) scores.
        response_mask: (B, T) valid response tokens.
        index: (B,) group label (prompt uid) of every sample.

    Returns:
        (advantages (B, T), returns (B, T)); the same tensor, 0 outside the mask.
    """
    scores, group_ids, counts = _grouped_scores(token_level_rewards, response_mask, index)
    means = _group_sums(scores, group_ids, len(counts)) / counts
    centered = scores - torch.where(counts > 1, means, torch.zeros_like(means))[group_ids]
    whitened = masked_whiten(_on_tokens(centered, response_mask, torch.float64), response_mask)
    token_advantages = whitened.to(_output_dtype(token_level_rewards))
    return token_advantages, token_advantages


@register_adv_estimator("remax", needs=EstimatorNeeds(greedy_baseline=True))
def compute_remax_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: the sampled response's score minus the score of the greedy response to the same prompt.

    ``A_it = s_i - b_i`` on every valid token, where ``b_i`` is the score of a greedy (temperature 0) rollout of the
    prompt (Li et al. 2024, "ReMax", arXiv:2310.10505; EasyR1's definition). The returns are the rewards-to-go
    ``sum_{t' >= t} r_t'`` over valid tokens (they equal ``s_i`` on every valid token when the score sits on the
    last token and no KL is in the reward); ReMax trains no critic, so they are only logged.

    Args:
        token_level_rewards: (B, T) rewards (summed into the score).
        response_mask: (B, T) valid response tokens.
        reward_baselines: (B,) score of the greedy response to each sample's prompt.

    Returns:
        (advantages (B, T), returns (B, T)), both 0 outside the mask.
    """
    _check_token_inputs(response_mask, token_level_rewards=token_level_rewards)
    if reward_baselines.shape != (token_level_rewards.shape[0],):
        raise ValueError(
            f"reward_baselines has shape {tuple(reward_baselines.shape)}, expected ({token_level_rewards.shape[0]},):"
            " one greedy-rollout score per sample"
        )
    mask = response_mask.to(torch.float64)
    rewards = token_level_rewards.detach().to(torch.float64) * mask
    advantages = rewards.sum(dim=-1) - reward_baselines.detach().to(torch.float64)
    returns = rewards.flip(dims=(-1,)).cumsum(dim=-1).flip(dims=(-1,)) * mask
    dtype = _output_dtype(token_level_rewards)
    return _on_tokens(advantages, response_mask, dtype), returns.to(dtype)


@register_adv_estimator("gae", needs=EstimatorNeeds(critic=True))
def compute_gae_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation with a critic's values (PPO; Schulman et al. 2016, arXiv:1506.02438).

    Backwards over the valid tokens ``t`` of each row: ``delta_t = r_t + gamma * V_next - V_t`` and
    ``A_t = delta_t + gamma * lam * A_next``, where ``V_next`` / ``A_next`` belong to the next *valid* token (0 past
    the end); masked tokens are skipped and carry nothing, as in verl. Then ``returns = A + V`` (the critic's
    target, before whitening) and the advantages are whitened over the batch's valid tokens
    (:func:`masked_whiten`).

    Args:
        token_level_rewards: (B, T) per-token rewards (the score on the last token, minus any in-reward KL).
        response_mask: (B, T) valid response tokens.
        values: (B, T) critic values of the response tokens (old values, computed before the update).
        gamma: discount factor.
        lam: GAE lambda (1: Monte-Carlo returns minus values; 0: one-step TD errors).

    Returns:
        (advantages (B, T) whitened, returns (B, T)), both 0 outside the mask.
    """
    _check_token_inputs(response_mask, token_level_rewards=token_level_rewards, values=values)
    rewards = token_level_rewards.detach().to(torch.float64)
    values64 = values.detach().to(torch.float64)
    valid = response_mask.bool()
    raw = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values64[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(valid[:, t], values64[:, t], next_value)
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        raw[:, t] = advantage
    mask = response_mask.to(torch.float64)
    dtype = _output_dtype(token_level_rewards)
    returns = (raw + values64) * mask
    return masked_whiten(raw, response_mask).to(dtype), returns.to(dtype)
