"""The policy (and reference) model: log-probs of responses and the PPO-style policy update.

The model is FSDP2-sharded by the caller. A forward takes the full ``input_ids`` (left-padded prompt
+ right-padded response), the explicit position ids and the vision inputs, and scores only the
response tokens. Updates split the worker's share of the batch into mini-batches (one optimizer step
each) and micro-batches (gradient accumulation); losses are normalised by counts over the *global*
mini-batch, so the update does not depend on the micro-batch size or the number of workers.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from easyr1.algorithms import (
    PolicyLossParams,
    aggregate_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    log_probs_from_logits,
    masked_mean,
)
from easyr1.algorithms.logits import banned_token_bias, compile_allowed
from easyr1.algorithms.rollout_correction import TOKEN_MEAN_METRICS, CorrectionSettings, rollout_correction
from easyr1.distributed import sequence_parallel
from easyr1.models.families import family_of, forward_token_types
from easyr1.models.linear_attention import has_linear_attention
from easyr1.models.moe import load_balancing_loss, moe_settings, recorded_router_logits
from easyr1.models.vision_tower import vision_keepalive
from easyr1.protocol import Batch, merge_vision_inputs
from easyr1.workers.packing import (
    packed_response_logits,
    prompt_group_units,
    prompt_groups,
    shared_response_logits,
    shared_token_count,
    split_response_logits,
    token_budget_groups,
)
from easyr1.workers.placement import batch_to, to_host
from easyr1.workers.ppo_update import MicroLoss, PPOUpdate


logger = logging.getLogger(__name__)


def forward_inputs(micro_batch: Batch) -> dict[str, torch.Tensor]:
    """Model inputs of a micro-batch: ids, mask, explicit position ids and the merged vision inputs (the token
    types a family computes from the ids come from :func:`~easyr1.models.families.forward_token_types`)."""
    position_ids = micro_batch["position_ids"]
    if position_ids.dim() == 3:  # (B, 4, L) -> (4, B, L): text positions, then the three m-rope rows
        position_ids = position_ids.transpose(0, 1).contiguous()
    vision = merge_vision_inputs(micro_batch["multi_modal_inputs"]) if "multi_modal_inputs" in micro_batch else {}
    return {
        "input_ids": micro_batch["input_ids"],
        "attention_mask": micro_batch["attention_mask"],
        "position_ids": position_ids,
        **vision,
    }


def shares_prompts(model: nn.Module, requested: bool) -> bool:
    """Whether the forward can share prompts (``requested``, an attention that honours a custom 4D mask, and no
    linear-attention layer).

    Flash attention takes no dense mask, so there the forward falls back to padding-free packing (one notice).
    A linear-attention layer (Qwen3.5's GatedDeltaNet) reads no mask at all: a shared prompt's recurrent state
    would flow from one response into the next, so each sample runs with its own prompt (one notice). A family whose
    masks come from token types (Gemma 3's bidirectional image blocks, and its sliding windows) would lose them to
    the shared-prompt mask, so it runs padding-free instead (one notice).
    """
    global _FLASH_NOTICE_GIVEN, _LINEAR_NOTICE_GIVEN, _TOKEN_TYPES_NOTICE_GIVEN
    if not requested:
        return False
    config = getattr(model, "config", None)
    if config is not None and family_of(config).token_types is not None:
        if not _TOKEN_TYPES_NOTICE_GIVEN:
            logger.warning(
                "worker.actor.share_prompt=true is off for this model (%s): it builds its attention masks itself "
                "(image blocks attending bidirectionally, sliding windows), which a shared-prompt mask would "
                "replace, so each sample's prompt runs again (padding-free packing)",
                getattr(config, "model_type", "unknown model type"),
            )
            _TOKEN_TYPES_NOTICE_GIVEN = True
        return False
    if has_linear_attention(config):
        if not _LINEAR_NOTICE_GIVEN:
            logger.warning(
                "worker.actor.share_prompt=true is off for this model (%s): its linear-attention layers carry a "
                "state that a shared-prompt mask cannot split, so each sample's prompt runs again",
                getattr(config, "model_type", "unknown model type"),
            )
            _LINEAR_NOTICE_GIVEN = True
        return False
    implementation = str(getattr(config, "_attn_implementation", None) or "sdpa")
    if "flash" not in implementation:
        return True
    if not _FLASH_NOTICE_GIVEN:
        logger.warning(
            "worker.actor.share_prompt=true needs sdpa or eager attention (a custom 4D mask); with %s each sample's "
            "prompt runs again (padding-free packing)",
            implementation,
        )
        _FLASH_NOTICE_GIVEN = True
    return False


_FLASH_NOTICE_GIVEN = False
_LINEAR_NOTICE_GIVEN = False
_TOKEN_TYPES_NOTICE_GIVEN = False


def response_log_probs(
    model: nn.Module,
    micro_batch: Batch,
    temperature: float,
    with_entropy: bool = False,
    banned_token_ids: list[int] | None = None,
    padding_free: bool = False,
    compiled: bool = False,
    share_prompt: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of the response tokens under ``model``.

    Shapes: ``input_ids`` / ``attention_mask`` (B, P + R), ``position_ids`` (B, 4, P + R) or (B, P + R),
    ``responses`` (B, R); returns (B, R) tensors in float32. ``padding_free`` packs the micro-batch into one row
    (same values, no compute spent on padding; see :mod:`easyr1.workers.packing`). ``share_prompt`` packs it with
    the prompt of rows that share one laid out once (implies the padding-free layout; falls back to it under flash
    attention, see :func:`shares_prompts`). ``compiled`` runs the log-prob and entropy chunks through
    ``torch.compile`` (:func:`~easyr1.algorithms.logits.compile_allowed`). ``entropy_grad=False`` computes the
    entropy without a graph (a metric only: nothing to back-propagate).
    """
    if sequence_parallel.of(model) is not None:
        return _split_log_probs(
            model, micro_batch, temperature, with_entropy, banned_token_ids, compiled, share_prompt, entropy_grad
        )
    responses = micro_batch["responses"]
    response_length = responses.shape[-1]
    inputs = forward_inputs(micro_batch)
    vision = {key: value for key, value in inputs.items() if key not in _TEXT_INPUTS}
    # before the forward: see models/vision_tower.py; on the inputs' device, which FSDP CPU offload does not share
    keepalive = vision_keepalive(model, model, vision, device=responses.device)
    ids, mask, positions = (micro_batch[key] for key in _TEXT_INPUTS)
    if shares_prompts(model, share_prompt):
        vision_rows = micro_batch["multi_modal_inputs"] if "multi_modal_inputs" in micro_batch else None
        logits = shared_response_logits(model, ids, mask, positions, response_length, vision_rows, merge_vision_inputs)
    elif padding_free or share_prompt:
        logits = packed_response_logits(model, ids, mask, positions, response_length, vision)
    else:
        # the logits that predict the response tokens (and one extra, dropped)
        token_types = forward_token_types(model, ids)
        logits = model(**inputs, **token_types, use_cache=False, logits_to_keep=response_length + 1).logits[:, :-1]
    logits = _scored_logits(logits, temperature, banned_token_ids or [], keepalive)
    log_probs = log_probs_from_logits(logits, responses, compiled=compiled)
    entropy = None
    if with_entropy:
        with nullcontext() if entropy_grad else torch.no_grad():
            entropy = entropy_from_logits(logits, compiled=compiled)
    return log_probs, entropy


def _split_log_probs(
    model: nn.Module,
    micro_batch: Batch,
    temperature: float,
    with_entropy: bool,
    banned_token_ids: list[int] | None,
    compiled: bool,
    share_prompt: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_log_probs` under sequence parallelism (``distributed/sequence_parallel.py``): the micro-batch
    packed (padding-free, or with shared prompts), this rank's slice through the model, the log-probs and entropies
    of its response positions, summed across the group into the whole (B, R)."""
    group = sequence_parallel.of(model)
    responses = micro_batch["responses"]
    shape = tuple(responses.shape)
    ids, mask, positions = (micro_batch[key] for key in _TEXT_INPUTS)
    vision_rows = micro_batch["multi_modal_inputs"] if "multi_modal_inputs" in micro_batch else None
    groups = None
    if shares_prompts(model, share_prompt):
        groups = prompt_groups(ids, mask, shape[-1], vision_rows)
        vision_rows = [vision_rows[rows[0]] for rows in groups] if vision_rows is not None else None
    vision = merge_vision_inputs(vision_rows) if vision_rows is not None else {}
    keepalive = vision_keepalive(model, model, vision, device=responses.device)
    logits, owned = split_response_logits(model, ids, mask, positions, shape[-1], vision, groups)
    logits = _scored_logits(logits, temperature, banned_token_ids or [], keepalive)
    labels = responses.reshape(-1)[owned]
    if labels.numel() == 0:  # the spare logit row split_inputs keeps: any label, discarded
        labels = torch.zeros(1, dtype=responses.dtype, device=responses.device)
    log_probs = sequence_parallel.combine_owned(
        log_probs_from_logits(logits, labels, compiled=compiled), owned, shape, group
    )
    entropy = None
    if with_entropy:
        with nullcontext() if entropy_grad else torch.no_grad():
            local = entropy_from_logits(logits, compiled=compiled)
            entropy = sequence_parallel.combine_owned(local, owned, shape, group)
    return log_probs, entropy


def _scored_logits(
    logits: torch.Tensor, temperature: float, banned_token_ids: list[int], keepalive: torch.Tensor | None
) -> torch.Tensor:
    """``(logits + bias + keepalive) / temperature`` with at most one full-size copy of the (B, R, V) logits.

    The bias and the keepalive zero are folded into one (V,) vector first; the division then runs in place on the
    copy the addition made (neither backward needs the tensor it overwrites).
    """
    shift = banned_token_bias(logits.shape[-1], banned_token_ids, logits.dtype)
    if shift is not None:
        shift = shift.to(logits.device)
    if keepalive is not None:
        keepalive = keepalive.to(logits.device, logits.dtype)
        shift = keepalive if shift is None else shift + keepalive
    if shift is not None:
        logits = logits + shift
        return logits.div_(temperature) if temperature != 1.0 else logits
    return logits / temperature if temperature != 1.0 else logits


def computed_tokens(micro_batch: Batch, share_prompt: bool) -> int:
    """Tokens a forward of ``micro_batch`` runs through the model: the valid tokens, each shared prompt once."""
    mask = micro_batch["attention_mask"]
    if not share_prompt:
        return int(mask.sum())
    response_length = micro_batch["responses"].shape[-1]
    vision_rows = micro_batch["multi_modal_inputs"] if "multi_modal_inputs" in micro_batch else None
    groups = prompt_groups(micro_batch["input_ids"], mask, response_length, vision_rows)
    return shared_token_count(mask, response_length, groups)


_TEXT_INPUTS = ("input_ids", "attention_mask", "position_ids")


def micro_batches(
    batch: Batch, micro_batch_size: int, dynamic: bool, share_prompt: bool = False
) -> list[tuple[list[int], Batch]]:
    """The micro-batches of ``batch`` with the row indices each holds.

    Fixed: consecutive slices of ``micro_batch_size`` rows. Dynamic: groups of near-equal token count, as many
    as ``micro_batch_size`` full-length rows would need (``ceil(tokens / (micro_batch_size * L))``), agreed across
    ranks (the maximum) so every rank runs the same number of forward passes. With ``share_prompt`` the dynamic
    groups keep a prompt's samples together (split only when there are fewer prompts than micro-batches) and are
    weighed by the tokens the shared forward computes.
    """
    size = max(micro_batch_size, 1)
    if not dynamic:
        starts = range(0, len(batch), size)
        return [(list(range(s, min(s + size, len(batch)))), batch.index(slice(s, s + size))) for s in starts]
    token_counts = batch["attention_mask"].sum(dim=-1).tolist()
    budget = size * batch["attention_mask"].shape[-1]
    count = torch.tensor([min(-(-sum(token_counts) // budget), len(batch))])
    if dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    if not share_prompt:
        groups = token_budget_groups(token_counts, int(count.item()))
        return [(group, batch.index(group)) for group in groups]
    mask, response_length = batch["attention_mask"], batch["responses"].shape[-1]
    vision_rows = batch["multi_modal_inputs"] if "multi_modal_inputs" in batch else None
    prompts = prompt_groups(batch["input_ids"], mask, response_length, vision_rows)
    units = prompt_group_units(prompts, token_counts, int(count.item()))
    unit_tokens = [shared_token_count(mask, response_length, [unit]) for unit in units]
    groups = [
        sorted(row for unit in unit_group for row in units[unit])
        for unit_group in token_budget_groups(unit_tokens, int(count.item()))
    ]
    return [(group, batch.index(group)) for group in groups]


def in_original_order(parts: list[tuple[list[int], torch.Tensor]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs on the host and put the rows back in the batch's order."""
    indices = torch.tensor([index for group, _ in parts for index in group])
    values = torch.cat([to_host(value) for _, value in parts])
    return values[torch.argsort(indices)]


class Actor:
    """A sharded causal LM plus (for the policy) its optimizer and LR schedule."""

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        banned_token_ids: list[int] | None = None,
        adapters_disabled: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        # the worker's device: each micro-batch is moved here before its forward; results go back to the host
        self.device = torch.device(device)
        self.compiled = compile_allowed(config.use_torch_compile, self.device)
        # the LoRA reference policy: the actor's own model with its adapters switched off
        self.adapters_disabled = adapters_disabled
        self.banned_token_ids = list(banned_token_ids or [])
        self.config = config
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        # tokens the forwards ran through the model (shared prompts once); the worker reads it for the MFU
        self.computed_tokens = 0

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, temperature: float, micro_batch_size: int) -> torch.Tensor:
        """(B, R) log-probs of ``batch['responses']``, computed in micro-batches without gradients."""
        self.model.eval()
        # sequence parallelism: the group's members score their pooled shares together, each keeps its own rows
        batch, own_rows = self._pooled(batch)
        with self.model.disable_adapter() if self.adapters_disabled else nullcontext():
            parts = [
                (rows, self._log_probs(batch_to(micro, self.device), temperature)[0])
                for rows, micro in self._micro_batches(batch, micro_batch_size)
            ]
        return in_original_order(parts)[own_rows]

    def _pooled(self, batch: Batch) -> tuple[Batch, list[int]]:
        """The sequence-parallel group's pooled rows and this rank's among them (the batch itself without a group)."""
        group = sequence_parallel.of(self.model)
        return group.gather_rows(batch) if group is not None else (batch, list(range(len(batch))))

    @property
    def sequence_parallel_size(self) -> int:
        """How many ranks split each sequence (1 without sequence parallelism)."""
        group = sequence_parallel.of(self.model)
        return group.size if group is not None else 1

    def _log_probs(
        self, micro_batch: Batch, temperature: float, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        share_prompt = shares_prompts(self.model, getattr(self.config, "share_prompt", False))
        # each member of a sequence-parallel group runs its slice of the tokens (the MFU's numerator)
        self.computed_tokens += computed_tokens(micro_batch, share_prompt) // self.sequence_parallel_size
        return response_log_probs(
            self.model,
            micro_batch,
            temperature,
            with_entropy=with_entropy,
            banned_token_ids=self.banned_token_ids,
            padding_free=self.config.padding_free,
            compiled=self.compiled,
            share_prompt=share_prompt,
            # without an entropy bonus the entropy is only a metric: no graph for it
            entropy_grad=bool(getattr(self.config, "entropy_coeff", 0.0)),
        )

    def _micro_batches(self, batch: Batch, micro_batch_size: int) -> list[tuple[list[int], Batch]]:
        """:func:`micro_batches` with this actor's dynamic-batching and prompt-sharing settings."""
        # the token budget counts shared prompts once only where the forward will share them
        share_prompt = shares_prompts(self.model, getattr(self.config, "share_prompt", False))
        return micro_batches(batch, micro_batch_size, self.config.dynamic_batching, share_prompt)

    def update_policy(
        self,
        batch: Batch,
        temperature: float,
        mini_batch_size: int,
        correction: CorrectionSettings | None = None,
    ) -> dict[str, float]:
        """PPO epochs over mini-batches of ``mini_batch_size`` samples (this worker's share); returns mean metrics.

        Needs ``old_log_probs``, ``advantages``, ``response_mask`` (and ``ref_log_probs`` with a KL loss). The
        driver's rollout correction arrives as ``rollout_is_weights`` (multiplying the per-token policy loss) and
        ``rollout_rs_mask`` (the loss mask after rejection). A ``correction`` in bypass mode is computed here
        instead, per micro-batch, from the current policy against ``old_log_probs`` (the engine's): its rejection
        acts on the loss, its weights only on the ``rollout_corr/`` metrics.
        """
        micro_loss = self._micro_loss(
            temperature, correction if correction is not None and correction.bypass else None
        )
        batch, _ = self._pooled(batch)  # a sequence-parallel group's mini-batches hold every member's share
        mini_batch_size *= self.sequence_parallel_size
        metrics = self._update_loop().run(batch, mini_batch_size, self.config.ppo_epochs, micro_loss)
        return self._finish_update(metrics)

    def update_on_policy(
        self,
        batch: Batch,
        temperature: float,
        correction: CorrectionSettings | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step on the whole batch, whose responses the current policy sampled (see
        :mod:`easyr1.on_policy`): the old log-probs are this forward's own, detached.

        Needs ``advantages``, ``response_mask`` (``ref_log_probs`` with a KL loss; ``rollout_log_probs`` with an
        active ``correction``, whose weights and rejection mask are then computed here per micro-batch from the
        detached log-probs, as the driver computes them from a separate pass: every method depends on one token or
        one response, and the loss normaliser counts the tokens before rejection). Returns the metrics and the
        detached (B, R) log-probs, in the batch's row order, on the host.
        """
        if "old_log_probs" in batch:
            raise ValueError("update_on_policy computes the old log-probs itself; the batch must not carry them")
        parts: list[tuple[list[int], torch.Tensor]] = []
        active = correction if correction is not None and correction.active else None
        micro_loss = self._micro_loss(temperature, active, parts)
        batch, own_rows = self._pooled(batch)
        metrics = self._update_loop().run(batch, len(batch), 1, micro_loss)
        return self._finish_update(metrics), in_original_order(parts)[own_rows]

    def _update_loop(self) -> PPOUpdate:
        assert self.optimizer is not None, "the reference model has no optimizer"
        size = self.config.micro_batch_size_per_device_for_update
        return PPOUpdate(
            self.model,
            self.optimizer,
            self.config.max_grad_norm,
            self.device,
            lambda mini_batch: self._micro_batches(mini_batch, size),
            "actor/grad_norm",
            sequence_parallel_size=self.sequence_parallel_size,
        )

    def _finish_update(self, metrics: dict[str, float]) -> dict[str, float]:
        """Step the LR schedule (once per update call) and report the rate the update used."""
        if self.lr_scheduler is not None:
            metrics["actor/lr"] = self.lr_scheduler.get_last_lr()[0]
            self.lr_scheduler.step()
        return metrics

    def _load_balancing_loss(self, router_logits: list[torch.Tensor], micro: Batch) -> torch.Tensor:
        """The router's load-balancing loss of a micro-batch's forward; under sequence parallelism over the whole
        row, each rank's slice without the split's padding."""
        group = sequence_parallel.of(self.model)
        if group is None:
            return load_balancing_loss(router_logits, *moe_settings(self.model), micro["attention_mask"])
        share_prompt = shares_prompts(self.model, getattr(self.config, "share_prompt", False))
        tokens = computed_tokens(micro, share_prompt)
        mask = sequence_parallel.local_token_mask(group, tokens, router_logits[0].device)
        return load_balancing_loss(
            router_logits, *moe_settings(self.model), mask, lambda value: sequence_parallel.group_sum(value, group)
        )

    def _micro_loss(
        self,
        temperature: float,
        correction: CorrectionSettings | None = None,
        log_prob_parts: list[tuple[list[int], torch.Tensor]] | None = None,
    ) -> MicroLoss:
        """A micro-batch's policy loss (plus the KL loss and the entropy bonus where configured) and its metrics.

        Given ``log_prob_parts`` the update is on-policy (only :meth:`update_on_policy` asks for it): each
        micro-batch's detached log-probs are its old ones and are appended to ``log_prob_parts`` with their row
        indices. Otherwise the micro-batch carries ``old_log_probs``. Given ``correction`` (on-policy, or bypass
        mode) the rollout correction is computed per micro-batch from this forward's detached log-probs against the
        engine's; otherwise the driver's ``rollout_is_weights`` / ``rollout_rs_mask`` are read when present.

        Rejected tokens leave every loss term (policy, KL, entropy), while the normalisers stay the mini-batch's
        counts before rejection (:mod:`easyr1.algorithms.rollout_correction` says why).
        """
        config = self.config
        loss_params = PolicyLossParams(
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            clip_ratio_dual=config.clip_ratio_dual,
            tau_positive=config.tau_positive,
            tau_negative=config.tau_negative,
        )
        on_policy = log_prob_parts is not None
        model_config = getattr(config, "model", None)
        router_aux_loss_coef = float(getattr(model_config, "router_aux_loss_coef", 0.0) or 0.0)

        def micro_loss(rows: list[int], micro: Batch, norm: dict[str, float], sums: dict[str, float]) -> torch.Tensor:
            world_size = norm["world_size"]
            micro_mask = micro["response_mask"]
            with recorded_router_logits(self.model) if router_aux_loss_coef else nullcontext() as router_logits:
                log_probs, entropy = self._log_probs(micro, temperature, with_entropy=True)
            # on-policy: the policy has not changed since the rollout, so this forward's values are the old ones
            old_log_probs = log_probs.detach() if on_policy else micro["old_log_probs"]
            if on_policy:
                log_prob_parts.append((rows, old_log_probs))
            share = micro_mask.sum().item() / max(norm["num_global_tokens"] / world_size, 1.0)
            weights = micro["rollout_is_weights"] if "rollout_is_weights" in micro else None
            loss_mask = micro["rollout_rs_mask"] if "rollout_rs_mask" in micro else micro_mask
            if correction is not None:
                # bypass: the old log-probs are the engine's, compared with the current policy; on-policy: the
                # current policy is the old one, compared with the engine's
                behaviour = old_log_probs if correction.bypass else micro["rollout_log_probs"]
                weights, loss_mask, corr_metrics = rollout_correction(
                    log_probs.detach(), behaviour, micro_mask, correction
                )
                if correction.bypass:  # PPO's ratio already is pi_theta / pi_rollout: weights only as metrics
                    weights = None
                    for key in TOKEN_MEAN_METRICS.intersection(corr_metrics):
                        sums[key] += corr_metrics[key] * share
            policy_loss = get_policy_loss(config.loss_type)(
                old_log_probs, log_probs, micro["advantages"], loss_mask, loss_params
            )
            loss_mat = policy_loss.loss_mat
            if weights is not None:  # importance weights towards the rollout policy
                loss_mat = loss_mat * weights
            pg_loss = aggregate_loss(loss_mat, loss_mask, config.loss_agg_mode, **norm)
            loss = pg_loss
            if config.use_kl_loss and not config.disable_kl:
                kl = kl_penalty(log_probs, micro["ref_log_probs"], config.kl_penalty)
                kl_loss = aggregate_loss(kl, loss_mask, config.loss_agg_mode, **norm)
                loss = loss + config.kl_coef * kl_loss
                sums["actor/kl_loss"] += kl_loss.item()
            if config.entropy_coeff:
                entropy_loss = aggregate_loss(entropy, loss_mask, config.loss_agg_mode, **norm)
                loss = loss - config.entropy_coeff * entropy_loss
            if router_aux_loss_coef:
                # the micro-batch's load-balancing loss, weighted by its share of the mini-batch's response tokens
                # as the metrics are: the update's term is the token-weighted mean over the micro-batches
                aux_loss = self._load_balancing_loss(router_logits, micro)
                loss = loss + router_aux_loss_coef * share * aux_loss
                sums["actor/router_aux_loss"] += aux_loss.item() * share
            # Every metric is this worker's share of a global mean, scaled by the world size (like the losses), so
            # the driver's mean over workers is the exact mean over the whole mini-batch.
            sums["actor/pg_loss"] += pg_loss.item()
            sums["actor/entropy"] += masked_mean(entropy.detach(), micro_mask).item() * share
            for key, value in policy_loss.metrics.items():
                sums[f"actor/{key}"] += float(value) * share
            return loss

        return micro_loss
