"""Rollout correction: importance weights and rejection masks between the rollout engine's policy and the trainer's.

Responses are sampled by the rollout engine's policy ``pi_beh`` (vLLM's kernels and sampler, and under an
asynchronous schedule weights one or more updates old), while the policy gradient assumes the trainer's policy. The
correction compares, on the sampled tokens, ``log pi_ref`` (the trainer's log-probs: the recomputed old policy
``pi_old`` in ``decoupled`` mode, the current policy ``pi_theta`` in ``bypass`` mode) with the engine's
``log pi_beh``. With ``delta_t = log pi_ref(y_t) - log pi_beh(y_t)`` and the ratio ``rho_t = exp(delta_t)``:

* **importance sampling** (``algorithm.rollout_is``, :data:`ROLLOUT_IS`) gives a weight per token that multiplies
  the per-token policy loss: token TIS, sequence TIS, IcePop;
* **rejection** (``algorithm.rollout_rs``, :data:`ROLLOUT_RS`) drops tokens or whole sequences whose divergence is
  out of bounds from the loss mask: sequence MIS, Geo-RS, K3-RS, token k1 bounds. Several options are AND-ed.

The two are independent (either, both or neither), as in verl's ``algorithm.rollout_correction`` (its
``rollout_corr_helper.py``; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training"; IcePop from Ling Team 2025). Every ``exp`` clamps its argument to ``[-20, 20]`` (verl's bound), the
arithmetic runs in float64, and nothing returned carries a gradient: both log-probs are data.

Sign convention: verl's divergence statistics use ``k1 = -delta`` (``log pi_beh - log pi_ref``), so a k1 bound
``lo_hi`` keeps ``lo <= exp(k1) = 1 / rho <= hi``, i.e. ``rho`` in ``[1 / hi, 1 / lo]``. The bounds here are read
the same way (verl's configs then mean the same thing here); symmetric presets such as ``0.5_2.0`` hide the flip.

The loss normaliser counts the tokens *before* rejection (AReaL's choice; verl rewrites ``response_mask``, so its
normalisers count after): a rejected token then lowers the loss instead of raising its neighbours' weight, and the
count is known before any forward, which lets the update compute the mask per micro-batch (the on-policy shortcut,
``bypass`` mode) with the same result as the driver computing it once per batch. The actor reads the rejected mask
from the batch's ``rollout_rs_mask`` (``response_mask`` stays the sample's valid tokens: the step's length and
reward metrics are unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from easyr1.algorithms.aggregation import masked_mean
from easyr1.algorithms.registry import Registry
from easyr1.errors import ConfigError


# exp() of a larger log-ratio overflows float32 products; verl clamps every exponent to the same bound.
SAFETY_BOUND = 20.0

# algorithm.rollout_correction_mode
CORRECTION_MODES = ("decoupled", "bypass")

# The older key ``algorithm.rollout_correction`` -> the ``algorithm.rollout_is`` it stands for.
ROLLOUT_CORRECTIONS: dict[str, str] = {"token_tis": "token", "seq_tis": "sequence"}

# Metric prefix, verl's.
PREFIX = "rollout_corr/"

# The default of algorithm.rollout_is_threshold and of its older name: a value other than it counts as set.
DEFAULT_IS_THRESHOLD = 2.0


@dataclass(frozen=True)
class Bounds:
    """Bounds of a ratio (``lower`` may be ``None``: no lower bound) or of a divergence (``upper`` only)."""

    lower: float | None
    upper: float


@dataclass(frozen=True)
class ISMethod:
    """What ``algorithm.rollout_is`` registers beside each weight function.

    Attributes:
        level: ``token`` (a weight per token) or ``sequence`` (one weight per response).
        zeroes_outside: the weight is 0 outside ``[lower, upper]`` instead of being capped at ``upper`` (IcePop).
        verl: the verl setting it equals.
    """

    level: str
    zeroes_outside: bool
    verl: str


@dataclass(frozen=True)
class RSMethod:
    """What ``algorithm.rollout_rs`` registers beside each keep-mask function.

    Attributes:
        level: ``token`` (tokens are rejected one by one) or ``sequence`` (a response is kept or rejected whole).
        ratio_bounds: the threshold is a pair of ratio bounds ``lo_hi`` (k1 statistics; one number ``u`` means
            ``1/u_u``), else a single upper bound on a divergence (k3).
        default: the threshold used when ``algorithm.rollout_rs_threshold`` is null (verl's preset).
        verl: the verl setting it equals.
    """

    level: str
    ratio_bounds: bool
    default: str
    verl: str


# (log_ratio (B, T) float64, 0 outside the mask; valid (B, T) bool; bounds) -> (raw ratios, weights), both (B, T).
ISFunction = Callable[[torch.Tensor, torch.Tensor, Bounds], tuple[torch.Tensor, torch.Tensor]]
# (log_ratio (B, T) float64, 0 outside the mask; valid (B, T) bool; bounds) -> (keep (B, T) bool, statistic (B, T)).
RSFunction = Callable[[torch.Tensor, torch.Tensor, Bounds], tuple[torch.Tensor, torch.Tensor]]

ROLLOUT_IS: Registry[ISFunction] = Registry("rollout importance sampling method", "algorithm.rollout_is")
ROLLOUT_RS: Registry[RSFunction] = Registry("rollout rejection method", "algorithm.rollout_rs")


def _exp(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()


def _row_sum(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, values, torch.zeros_like(values)).sum(dim=-1)


def _row_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return _row_sum(values, valid) / valid.sum(dim=-1).clamp(min=1).to(values.dtype)


def _per_row(keep_rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return keep_rows.unsqueeze(-1).expand_as(like)


# ------------------------------------------------------------------------------------------- importance sampling
@ROLLOUT_IS.register("token", ISMethod("token", False, "rollout_is=token, rollout_is_threshold=C"))
def token_tis(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Token TIS: ``w_t = min(rho_t, C)`` (verl ``rollout_is=token`` with a single ``rollout_is_threshold``)."""
    raw = _exp(log_ratio)
    return raw, raw.clamp(max=bounds.upper)


@ROLLOUT_IS.register("sequence", ISMethod("sequence", False, "rollout_is=sequence, rollout_is_threshold=C"))
def sequence_tis(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence TIS: ``w = min(exp(sum_t delta_t), C)`` for every token of the response (verl
    ``rollout_is=sequence``; the sum runs over the valid tokens before the clamp)."""
    raw = _per_row(_exp(_row_sum(log_ratio, valid)), log_ratio)
    return raw, raw.clamp(max=bounds.upper)


@ROLLOUT_IS.register("icepop", ISMethod("token", True, 'rollout_is=token, rollout_is_threshold="lo_hi"'))
def icepop(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """IcePop token masking: ``w_t = rho_t`` if ``lo <= rho_t <= hi`` else 0, no cap inside the bounds (verl
    ``rollout_is=token`` with ``rollout_is_threshold="lo_hi"``); the loss mask is left as it is."""
    raw = _exp(log_ratio)
    inside = (raw >= bounds.lower) & (raw <= bounds.upper)
    return raw, torch.where(inside, raw, torch.zeros_like(raw))


# ------------------------------------------------------------------------------------------- rejection
def _within_log(statistic: torch.Tensor, bounds: Bounds) -> torch.Tensor:
    """``log lo <= statistic <= log hi`` (a k1 statistic against ratio bounds, compared in log space as verl)."""
    return (statistic >= math.log(bounds.lower)) & (statistic <= math.log(bounds.upper))


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return -log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    delta = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return delta.exp() - 1.0 - delta


@ROLLOUT_RS.register("token_k1", RSMethod("token", True, "0.2_5.0", "rollout_rs=token_k1"))
def token_k1(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Token k1 bounds: keep a token if ``lo <= 1 / rho_t <= hi`` (verl ``rollout_rs=token_k1``)."""
    statistic = _k1(log_ratio)
    return _within_log(statistic, bounds), statistic


@ROLLOUT_RS.register("seq_sum_k1", RSMethod("sequence", True, "0.5_2.0", "rollout_rs=seq_sum_k1 (Seq-MIS)"))
def seq_sum_k1(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence MIS: keep a response if ``lo <= prod_t 1 / rho_t <= hi`` (verl ``rollout_rs=seq_sum_k1``, the
    rejection half of its ``decoupled_seq_is_rs`` preset; pair it with ``rollout_is=sequence`` for the whole)."""
    statistic = _row_sum(_k1(log_ratio), valid)
    return _per_row(_within_log(statistic, bounds), log_ratio), _per_row(statistic, log_ratio)


@ROLLOUT_RS.register("seq_mean_k1", RSMethod("sequence", True, "0.999_1.001", "rollout_rs=seq_mean_k1 (Geo-RS)"))
def seq_mean_k1(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Geo-RS: keep a response if the geometric mean of ``1 / rho_t`` is within ``[lo, hi]`` (verl
    ``rollout_rs=seq_mean_k1``; its preset ``0.999_1.001`` was tuned for same-version mismatch)."""
    statistic = _row_mean(_k1(log_ratio), valid)
    return _per_row(_within_log(statistic, bounds), log_ratio), _per_row(statistic, log_ratio)


@ROLLOUT_RS.register("seq_mean_k3", RSMethod("sequence", False, "0.01", "rollout_rs=seq_mean_k3 (K3-RS)"))
def seq_mean_k3(log_ratio: torch.Tensor, valid: torch.Tensor, bounds: Bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """K3-RS: keep a response if ``mean_t (rho_t - 1 - log rho_t) <= hi`` (verl ``rollout_rs=seq_mean_k3``)."""
    statistic = _row_mean(_k3(log_ratio), valid)
    return _per_row(statistic <= bounds.upper, log_ratio), _per_row(statistic, log_ratio)


# ------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class CorrectionSettings:
    """The run's rollout correction, resolved from the ``algorithm`` section (:func:`correction_settings`).

    Attributes:
        rollout_is: a :data:`ROLLOUT_IS` name, or ``None`` (no weights).
        is_bounds: the cap ``C`` (``upper``) of TIS; IcePop's ``[lower, upper]``.
        rollout_rs: the :data:`ROLLOUT_RS` names, AND-ed (empty: no rejection).
        rs_bounds: one :class:`Bounds` per ``rollout_rs`` name.
        mode: ``decoupled`` (the trainer recomputes the old policy; weights ``pi_old / pi_beh`` act on the loss) or
            ``bypass`` (the engine's log-probs are the old policy; weights ``pi_theta / pi_beh`` are metrics only).
    """

    rollout_is: str | None = None
    is_bounds: Bounds = Bounds(None, 2.0)
    rollout_rs: tuple[str, ...] = ()
    rs_bounds: tuple[Bounds, ...] = ()
    mode: str = "decoupled"

    @property
    def active(self) -> bool:
        """Whether any weight or rejection is configured."""
        return self.rollout_is is not None or bool(self.rollout_rs)

    @property
    def bypass(self) -> bool:
        """Whether the engine's log-probs are the PPO old policy (no old-log-prob pass)."""
        return self.mode == "bypass"


def parse_rs_thresholds(options: Sequence[str], spec: Any, key: str = "algorithm.rollout_rs_threshold") -> tuple:
    """The :class:`Bounds` of each rejection option from verl's threshold spec.

    ``spec``: ``None`` (each option's preset), one entry for all options, or one per option separated by commas. A
    ratio-bound option (``*_k1``) takes ``lo_hi`` or a single ``u`` (``1/u_u``); a divergence option (``*_k3``) takes
    a single upper bound. Raises :class:`ConfigError` naming ``key``.
    """
    if spec is None:
        entries = [ROLLOUT_RS.traits(option).default for option in options]
    else:
        entries = [part.strip() for part in str(spec).split(",") if part.strip()]
        if len(entries) == 1:
            entries = entries * len(options)
        if len(entries) != len(options):
            raise ConfigError(
                f"{key}={spec!r} gives {len(entries)} thresholds for {len(options)} rejection options "
                f"({', '.join(options)}); give one for all or one per option, separated by commas"
            )
    bounds = []
    for option, entry in zip(options, entries):
        ratio_bounds = ROLLOUT_RS.traits(option).ratio_bounds
        lower_text, _, upper_text = entry.rpartition("_") if "_" in entry else ("", "", entry)
        try:
            upper = float(upper_text)
            lower = float(lower_text) if lower_text else None
        except ValueError:
            raise ConfigError(f"{key}: {entry!r} for {option} is not a number or a 'low_high' pair") from None
        if not ratio_bounds and lower is not None:
            raise ConfigError(
                f"{key}: {option} takes one upper bound on its divergence, got the pair {entry!r}; write e.g. 0.01"
            )
        if ratio_bounds and lower is None:
            lower = 1.0 / upper if upper > 0 else 0.0
        if not upper > 0 or (lower is not None and not lower > 0):
            raise ConfigError(f"{key}: the bounds of {option} must be positive, got {entry!r}")
        if lower is not None and not lower < upper:
            raise ConfigError(
                f"{key}: {option} keeps ratios in [low, high] and needs low < high, got {entry!r} (low={lower:g}, "
                f"high={upper:g}); a pair such as 0.5_2 written without a second decimal point is read by YAML as "
                "the number 0.52: write 0.5_2.0"
            )
        bounds.append(Bounds(lower, upper))
    return tuple(bounds)


def correction_settings(algorithm: Any) -> CorrectionSettings:
    """The :class:`CorrectionSettings` of an ``algorithm`` config section (the shorthand resolved); raises
    :class:`ConfigError` listing every problem (:func:`settings_problems`)."""
    problems: list[str] = []
    settings = _resolve(algorithm, problems)
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def settings_problems(algorithm: Any) -> list[str]:
    """Every problem of the ``algorithm`` section's rollout-correction keys, each naming its key and what to do."""
    problems: list[str] = []
    _resolve(algorithm, problems)
    return problems


def _resolve(algorithm: Any, problems: list[str]) -> CorrectionSettings:
    mode = algorithm.rollout_correction_mode
    if mode not in CORRECTION_MODES:
        problems.append(
            f"algorithm.rollout_correction_mode={mode!r} is not supported; valid values: {', '.join(CORRECTION_MODES)}"
        )
    rollout_is, threshold = algorithm.rollout_is, algorithm.rollout_is_threshold
    legacy = algorithm.rollout_correction
    if legacy is not None:
        if legacy not in ROLLOUT_CORRECTIONS:
            problems.append(
                f"algorithm.rollout_correction={legacy!r} is not supported; valid values: "
                f"{', '.join(ROLLOUT_CORRECTIONS)} (shorthands of algorithm.rollout_is=token|sequence)"
            )
        elif rollout_is is not None and rollout_is != ROLLOUT_CORRECTIONS[legacy]:
            problems.append(
                f"algorithm.rollout_correction={legacy} means algorithm.rollout_is={ROLLOUT_CORRECTIONS[legacy]}, but "
                f"algorithm.rollout_is={rollout_is}; set only algorithm.rollout_is"
            )
        else:
            rollout_is = ROLLOUT_CORRECTIONS[legacy]
        if mode == "bypass":
            problems.append(
                f"algorithm.rollout_correction={legacy} weighs the loss by pi_old / pi_rollout, which needs the "
                "old-log-prob pass that algorithm.rollout_correction_mode=bypass skips; use mode=decoupled, or "
                "algorithm.rollout_is for metrics of pi_theta / pi_rollout in bypass mode"
            )
    legacy_threshold = algorithm.rollout_correction_threshold
    if legacy_threshold != threshold and DEFAULT_IS_THRESHOLD not in (legacy_threshold, threshold):
        problems.append(
            f"algorithm.rollout_correction_threshold={legacy_threshold} and algorithm.rollout_is_threshold="
            f"{threshold} disagree (the first is the older name of the second); set only "
            "algorithm.rollout_is_threshold"
        )
    elif threshold == DEFAULT_IS_THRESHOLD:
        threshold = legacy_threshold
    lower = algorithm.rollout_is_threshold_lower
    is_bounds = Bounds(None, threshold)
    if rollout_is is not None:
        if rollout_is not in ROLLOUT_IS:
            problems.append(_unknown("algorithm.rollout_is", rollout_is, ROLLOUT_IS.names()))
        elif not threshold > 0:  # the section's value rules report it
            pass
        elif ROLLOUT_IS.traits(rollout_is).zeroes_outside:
            lower = 1.0 / threshold if lower is None else lower
            if not 0 < lower < threshold:
                problems.append(
                    f"algorithm.rollout_is=icepop keeps ratios in [algorithm.rollout_is_threshold_lower, "
                    f"algorithm.rollout_is_threshold] and needs 0 < low < high; got [{lower}, {threshold}]"
                )
            is_bounds = Bounds(lower, threshold)
            if mode == "bypass":
                problems.append(
                    "algorithm.rollout_is=icepop acts by zeroing the weights of tokens out of bounds, but in "
                    "algorithm.rollout_correction_mode=bypass the PPO ratio is already pi_theta / pi_rollout and "
                    "weights are metrics only, so nothing would be masked; use algorithm.rollout_rs=token_k1 with "
                    f"algorithm.rollout_rs_threshold={float(1 / threshold)!r}_{float(1 / lower)!r} (k1 bounds are on "
                    "1 / ratio), "
                    "or mode=decoupled"
                )
    icepop_set = rollout_is in ROLLOUT_IS and ROLLOUT_IS.traits(rollout_is).zeroes_outside
    if algorithm.rollout_is_threshold_lower is not None and not icepop_set:
        problems.append(
            f"algorithm.rollout_is_threshold_lower={algorithm.rollout_is_threshold_lower} is read only by "
            "algorithm.rollout_is=icepop (TIS caps above only); leave it null"
        )
    rs = algorithm.rollout_rs
    options = tuple(part.strip() for part in rs.split(",") if part.strip()) if isinstance(rs, str) else tuple(rs or ())
    rs_bounds: tuple[Bounds, ...] = ()
    unknown = [option for option in options if option not in ROLLOUT_RS]
    problems.extend(_unknown("algorithm.rollout_rs", option, ROLLOUT_RS.names()) for option in unknown)
    if len(set(options)) != len(options):
        problems.append(f"algorithm.rollout_rs lists an option twice: {', '.join(options)}")
    if options and not unknown:
        try:
            rs_bounds = parse_rs_thresholds(options, algorithm.rollout_rs_threshold)
        except ConfigError as error:
            problems.append(str(error))
    elif not options and algorithm.rollout_rs_threshold is not None:
        problems.append(
            f"algorithm.rollout_rs_threshold={algorithm.rollout_rs_threshold!r} is read only with "
            "algorithm.rollout_rs; set the rejection option too, or leave the threshold null"
        )
    return CorrectionSettings(rollout_is, is_bounds, options, rs_bounds, mode)


def _unknown(key: str, value: Any, names: list[str]) -> str:
    return f"{key}={value!r} is not supported; valid values: {', '.join(names)}"


# ------------------------------------------------------------------------------------------- the correction
def rollout_correction(
    log_prob_ref: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    settings: CorrectionSettings,
    staleness: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights, the rejection-rewritten mask and the ``rollout_corr/`` metrics of one batch.

    Args:
        log_prob_ref: (B, T) the trainer's log-probs of the sampled tokens (``pi_old`` decoupled, ``pi_theta``
            bypass).
        rollout_log_probs: (B, T) the engine's log-probs of the same tokens.
        response_mask: (B, T) valid response tokens.
        settings: the methods and their bounds.
        staleness: optional (B,) integers, each sample's age in weight versions; adds
            ``rollout_corr/by_staleness/<s>/{k3_kl,masked_fraction,log_prob_gap}``.

    Returns:
        ``(weights, mask, metrics)``: weights (B, T) without gradient, 0 outside the mask, float32 (float64 for
        float64 inputs), ``None`` without ``settings.rollout_is``; ``response_mask`` with the rejected tokens set to
        0 (same dtype; equal to it without ``settings.rollout_rs``); metrics as python floats under
        ``rollout_corr/``, with verl's names.
    """
    if not (log_prob_ref.shape == rollout_log_probs.shape == response_mask.shape) or response_mask.dim() != 2:
        raise ValueError(
            "rollout correction inputs must share one (B, T) shape, got log_prob_ref "
            f"{tuple(log_prob_ref.shape)}, rollout_log_probs {tuple(rollout_log_probs.shape)}, response_mask "
            f"{tuple(response_mask.shape)}"
        )
    valid = response_mask.bool()
    with torch.no_grad():
        ref = log_prob_ref.detach().double()
        behaviour = rollout_log_probs.detach().double()
        log_ratio = torch.where(valid, ref - behaviour, torch.zeros_like(ref))
        metrics = _offpolicy_metrics(ref, behaviour, log_ratio, valid)
        weights = None
        if settings.rollout_is is not None:
            raw, applied = ROLLOUT_IS.get(settings.rollout_is)(log_ratio, valid, settings.is_bounds)
            weights = torch.where(valid, applied, torch.zeros_like(applied))
            metrics.update(_is_metrics(raw, weights, valid, settings))
        keep = valid.clone()
        for option, bounds in zip(settings.rollout_rs, settings.rs_bounds):
            option_keep, _ = ROLLOUT_RS.get(option)(log_ratio, valid, bounds)
            keep &= option_keep
            metrics.update(_rejected_fractions(f"rollout_rs_{option}_", option_keep & valid, valid))
        if settings.rollout_rs:
            metrics.update(_rejected_fractions("rollout_rs_", keep, valid))
        if staleness is not None:
            metrics.update(_by_staleness(log_ratio, keep, valid, staleness))
    dtype = torch.float64 if log_prob_ref.dtype == torch.float64 else torch.float32
    new_mask = torch.where(keep, response_mask, torch.zeros_like(response_mask))
    metrics = {f"{PREFIX}{key}": value for key, value in metrics.items()}
    return (None if weights is None else weights.to(dtype)), new_mask, metrics


def _offpolicy_metrics(
    ref: torch.Tensor, behaviour: torch.Tensor, log_ratio: torch.Tensor, valid: torch.Tensor
) -> dict[str, float]:
    """verl's off-policy diagnostics: ``kl`` (k1 of KL(pi_beh || pi_ref): mean of ``log pi_beh - log pi_ref``),
    ``k3_kl``, ``training_ppl`` / ``rollout_ppl`` (per-response perplexities averaged over responses), ``chi2_token``
    (``E[rho^2] - 1``) and ``chi2_seq`` (``E[(prod rho)^2] - 1`` over responses)."""
    rows = valid.any(dim=-1)
    row_count = max(int(rows.sum().item()), 1)

    def rows_mean(values: torch.Tensor) -> float:
        return (torch.where(rows, values, torch.zeros_like(values)).sum() / row_count).item()

    return {
        "kl": masked_mean(-log_ratio, valid).item(),
        "k3_kl": masked_mean(_k3(log_ratio), valid).item(),
        "training_ppl": rows_mean(_exp(-_row_mean(ref, valid))),
        "rollout_ppl": rows_mean(_exp(-_row_mean(behaviour, valid))),
        "chi2_token": masked_mean(_exp(log_ratio).square(), valid).item() - 1.0 if valid.any() else 0.0,
        "chi2_seq": rows_mean(_exp(_row_sum(log_ratio, valid)).square()) - 1.0 if valid.any() else 0.0,
    }


def _is_metrics(
    raw: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor, settings: CorrectionSettings
) -> dict[str, float]:
    """verl's weight metrics: mean / max / min / std of the applied weights, the effective sample size of the
    weights normalised to mean 1 (``1 / E[w_n^2]``, between 0 and 1), the fractions of raw ratios above the upper
    and below the lower bound (``1 / C`` for TIS; of responses for sequence TIS), and IcePop's out-of-bounds ratio."""
    if not valid.any():
        return {"rollout_is_mean": 0.0, "rollout_is_max": 0.0, "rollout_is_min": 0.0}
    bounds, method = settings.is_bounds, ROLLOUT_IS.traits(settings.rollout_is)
    lower = bounds.lower if bounds.lower is not None else 1.0 / bounds.upper
    selected = weights[valid]
    mean = selected.mean()
    metrics = {
        "rollout_is_mean": mean.item(),
        "rollout_is_max": selected.max().item(),
        "rollout_is_min": selected.min().item(),
        "rollout_is_std": selected.std(unbiased=False).item(),
        "rollout_is_eff_sample_size": 1.0 / (selected / mean.clamp(min=1e-8)).square().mean().item()
        if mean > 0
        else 0.0,
    }
    if method.level == "sequence":
        rows = valid.any(dim=-1)
        per_row = raw[:, 0][rows] if raw.shape[-1] else raw.new_zeros(0)
        metrics["rollout_is_ratio_fraction_high"] = (per_row > bounds.upper).double().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (per_row < lower).double().mean().item()
    else:
        metrics["rollout_is_ratio_fraction_high"] = (raw[valid] > bounds.upper).double().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (raw[valid] < lower).double().mean().item()
    if method.zeroes_outside:
        metrics["rollout_is_oob_ratio"] = (
            metrics["rollout_is_ratio_fraction_high"] + metrics["rollout_is_ratio_fraction_low"]
        )
    return metrics


def _rejected_fractions(prefix: str, keep: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """The fraction of valid tokens rejected (``masked_fraction``) and of responses with a rejected token
    (``seq_masked_fraction``)."""
    rejected = valid & ~keep
    rows = valid.any(dim=-1)
    return {
        f"{prefix}masked_fraction": masked_mean(rejected.double(), valid).item(),
        f"{prefix}seq_masked_fraction": (rejected.any(dim=-1) & rows).sum().item() / max(rows.sum().item(), 1),
    }


def _by_staleness(
    log_ratio: torch.Tensor, keep: torch.Tensor, valid: torch.Tensor, staleness: torch.Tensor
) -> dict[str, float]:
    """The train-vs-engine mismatch of the responses of each age: k3 KL, rejected fraction and mean |log-prob gap|
    over their valid tokens."""
    if staleness.shape != valid.shape[:1]:
        raise ValueError(f"staleness must be (B,) = {tuple(valid.shape[:1])}, got {tuple(staleness.shape)}")
    metrics: dict[str, float] = {}
    ages = staleness.to(valid.device)
    for age in sorted({int(a) for a in ages[valid.any(dim=-1)].tolist()}):
        tokens = valid & (ages == age).unsqueeze(-1)
        prefix = f"by_staleness/{age}/"
        metrics[prefix + "k3_kl"] = masked_mean(_k3(log_ratio), tokens).item()
        metrics[prefix + "masked_fraction"] = masked_mean((~keep).double(), tokens).item()
        metrics[prefix + "log_prob_gap"] = masked_mean(log_ratio.abs(), tokens).item()
    return metrics


# Metrics that are means over valid tokens: inside the update (bypass mode) a micro-batch's value weighted by its
# share of the mini-batch's tokens adds up to the mini-batch's exact value; the others do not add up and are left out.
TOKEN_MEAN_METRICS = frozenset(
    f"{PREFIX}{name}"
    for name in (
        "kl",
        "k3_kl",
        "chi2_token",
        "rollout_is_mean",
        "rollout_is_ratio_fraction_high",
        "rollout_rs_masked_fraction",
    )
)


def rollout_mismatch_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the trainer's, on the sampled tokens (every run's
    ``rollout/`` metrics, correction or not).

    With ``d = log pi_old - log pi_rollout``: ``rollout_kl_k1`` = mean of ``-d`` (k1 estimate of
    KL(pi_rollout || pi_old); can be negative), ``rollout_kl_k3`` = mean of ``exp(d) - d - 1`` (k3 estimate, never
    negative), ``rollout_log_prob_abs_diff`` = mean of ``|d|``; means over valid tokens.
    """
    if not (old_log_probs.shape == rollout_log_probs.shape == response_mask.shape) or response_mask.dim() != 2:
        raise ValueError(
            "rollout mismatch inputs must share one (B, T) shape, got "
            f"{tuple(old_log_probs.shape)}, {tuple(rollout_log_probs.shape)}, {tuple(response_mask.shape)}"
        )
    with torch.no_grad():
        diff = (old_log_probs.detach().double() - rollout_log_probs.detach().double()).clamp(
            -SAFETY_BOUND, SAFETY_BOUND
        )
        return {
            "rollout_kl_k1": masked_mean(-diff, response_mask).item(),
            "rollout_kl_k3": masked_mean(diff.exp() - diff - 1.0, response_mask).item(),
            "rollout_log_prob_abs_diff": masked_mean(diff.abs(), response_mask).item(),
        }
