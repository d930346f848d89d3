"""The rollout-correction menu (token / sequence TIS, IcePop; Seq-MIS, Geo-RS, K3-RS, token k1 rejection), each
against a written-out reference in plain python loops over rows and tokens; its config keys and their refusals; and
in the actor's update (tiny model, one gloo rank in this process): rejection changes the loss with the count before
rejection as normaliser, and bypass mode rejects in the update while its weights stay metrics."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import REPO, demo_config, training_batch

from easyr1.algorithms import masked_mean
from easyr1.algorithms.rollout_correction import (
    ROLLOUT_IS,
    ROLLOUT_RS,
    Bounds,
    CorrectionSettings,
    rollout_correction,
)
from easyr1.config import load_config
from easyr1.distributed.fsdp import data_parallel_mesh, shard_model
from easyr1.errors import ConfigError
from easyr1.models.loading import load_model
from easyr1.on_policy import reuses_update_log_probs
from easyr1.protocol import Batch
from easyr1.workers.actor import Actor


B, T = 6, 7
LIMIT = 20.0


def clamp(value: float) -> float:
    return max(-LIMIT, min(LIMIT, value))


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded responses of lengths 7, 5, 3, 1, 0 and 6; trainer log-probs off the engine's by up to 0.6
    per token, one token 30 nats off (beyond the exp clamp) and one row drifting to a sequence ratio above 2."""
    generator = torch.Generator().manual_seed(7)
    lengths = [7, 5, 3, 1, 0, 6]
    mask = torch.tensor([[1 if t < n else 0 for t in range(T)] for n in lengths], dtype=torch.long)
    rollout = -torch.rand(B, T, generator=generator, dtype=torch.float64) * 3
    ref = rollout + (torch.rand(B, T, generator=generator, dtype=torch.float64) - 0.5) * 1.2
    ref[0, 2] = rollout[0, 2] + 30.0
    ref[5, :6] = rollout[5, :6] + 0.2
    return ref, rollout, mask


def rows(ref, rollout, mask):
    """Per row: the list of (ref, rollout) log-probs of its valid tokens, as python floats."""
    return [[(ref[i, t].item(), rollout[i, t].item()) for t in range(T) if mask[i, t]] for i in range(ref.shape[0])]


def reference_weights(method: str, ref, rollout, mask, lower: float | None, upper: float) -> list[list[float]]:
    """The IS weight of every position, written out (0 at padding)."""
    weights = []
    for i in range(ref.shape[0]):
        deltas = [ref[i, t].item() - rollout[i, t].item() for t in range(T)]
        sequence = math.exp(clamp(sum(d for d, m in zip(deltas, mask[i].tolist()) if m)))
        row = []
        for t in range(T):
            if not mask[i, t]:
                row.append(0.0)
            elif method == "token":
                row.append(min(math.exp(clamp(deltas[t])), upper))
            elif method == "sequence":
                row.append(min(sequence, upper))
            else:  # icepop
                ratio = math.exp(clamp(deltas[t]))
                row.append(ratio if lower <= ratio <= upper else 0.0)
        weights.append(row)
    return weights


def reference_keep(option: str, ref, rollout, mask, bounds: Bounds) -> list[list[bool]]:
    """Whether each valid token survives one rejection option, written out; k1 = -log ratio (verl's sign)."""
    keep = []
    for tokens in rows(ref, rollout, mask):
        k1 = [-clamp(r - b) for r, b in tokens]
        k3 = [math.exp(clamp(r - b)) - 1 - clamp(r - b) for r, b in tokens]
        n = max(len(tokens), 1)
        if option == "token_k1":
            row = [math.log(bounds.lower) <= k <= math.log(bounds.upper) for k in k1]
        elif option in ("seq_sum_k1", "seq_mean_k1"):
            statistic = sum(k1) if option == "seq_sum_k1" else sum(k1) / n
            row = [math.log(bounds.lower) <= statistic <= math.log(bounds.upper)] * len(tokens)
        else:  # seq_mean_k3
            row = [sum(k3) / n <= bounds.upper] * len(tokens)
        keep.append(row)
    return keep


def valid_values(tensor: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [[tensor[i, t].item() for t in range(T) if mask[i, t]] for i in range(tensor.shape[0])]


@pytest.mark.parametrize(
    "method, lower, upper",
    [("token", None, 1.3), ("sequence", None, 2.0), ("icepop", 0.8, 1.25)],
)
def test_importance_weights_match_the_written_out_reference(inputs, method, lower, upper):
    ref, rollout, mask = inputs
    settings = CorrectionSettings(rollout_is=method, is_bounds=Bounds(lower, upper))
    weights, new_mask, metrics = rollout_correction(ref, rollout, mask, settings)
    expected = reference_weights(method, ref, rollout, mask, lower, upper)
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert torch.equal(new_mask, mask)  # IS alone leaves the loss mask alone, IcePop included
    flat = [w for row, m in zip(expected, mask.tolist()) for w, v in zip(row, m) if v]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(sum(flat) / len(flat))
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(max(flat))
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(min(flat))
    mean = sum(flat) / len(flat)
    ess = 1 / (sum((w / mean) ** 2 for w in flat) / len(flat))
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(ess)
    # the bounds really act on these inputs: something is capped or zeroed, something is not
    touched = [w for w in flat if w in (upper, 0.0)]
    assert 0 < len(touched) < len(flat), method


@pytest.mark.parametrize(
    "options, bounds",
    [
        (["token_k1"], [Bounds(0.7, 1.4)]),
        (["seq_sum_k1"], [Bounds(0.5, 2.0)]),
        (["seq_sum_k1"], [Bounds(0.6, 4.0)]),  # asymmetric: keeps ratio products in [1/4, 1/0.6]
        (["seq_mean_k1"], [Bounds(0.9, 1.1)]),
        (["seq_mean_k3"], [Bounds(None, 0.05)]),
        (["token_k1", "seq_mean_k3"], [Bounds(0.5, 2.0), Bounds(None, 0.05)]),
    ],
)
def test_rejection_matches_the_written_out_reference_and_ands_options(inputs, options, bounds):
    ref, rollout, mask = inputs
    settings = CorrectionSettings(rollout_rs=tuple(options), rs_bounds=tuple(bounds))
    weights, new_mask, metrics = rollout_correction(ref, rollout, mask, settings)
    assert weights is None
    per_option = [reference_keep(option, ref, rollout, mask, b) for option, b in zip(options, bounds)]
    expected = [[all(keeps[i][t] for keeps in per_option) for t in range(len(per_option[0][i]))] for i in range(B)]
    assert valid_values(new_mask, mask) == [[1 if keep else 0 for keep in row] for row in expected]
    assert torch.all(new_mask[mask == 0] == 0) and new_mask.dtype == mask.dtype
    flat = [keep for row in expected for keep in row]
    assert 0 < sum(flat) < len(flat)  # the bounds really act: some tokens rejected, some kept
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 - sum(flat) / len(flat))
    rejected_rows = sum(1 for row in expected if row and not all(row))
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(rejected_rows / 5)
    for option, keeps in zip(options, per_option):
        kept = [keep for row in keeps for keep in row]
        assert metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"] == pytest.approx(1 - sum(kept) / len(kept))


def test_k1_bounds_are_on_the_inverse_ratio_as_in_verl():
    """A response whose ratio product is 3 (trainer more confident than the engine) has k1 sum -log 3: bounds
    0.5_4.0 reject it (1/3 < 0.5), while a product of 1/3 (1/ratio = 3) is kept."""
    rollout = torch.zeros(2, 1, dtype=torch.float64)
    ref = torch.tensor([[math.log(3.0)], [-math.log(3.0)]], dtype=torch.float64)
    settings = CorrectionSettings(rollout_rs=("seq_sum_k1",), rs_bounds=(Bounds(0.5, 4.0),))
    _, new_mask, _ = rollout_correction(ref, rollout, torch.ones(2, 1), settings)
    assert new_mask.flatten().tolist() == [0.0, 1.0]


def test_offpolicy_metrics_match_the_written_out_reference(inputs):
    ref, rollout, mask = inputs
    _, _, metrics = rollout_correction(ref, rollout, mask, CorrectionSettings())
    tokens = [pair for row in rows(ref, rollout, mask) for pair in row]
    responses = [row for row in rows(ref, rollout, mask) if row]
    deltas = [clamp(r - b) for r, b in tokens]
    assert metrics["rollout_corr/kl"] == pytest.approx(sum(b - r for r, b in tokens) / len(tokens))
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in deltas) / len(tokens))
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(sum(math.exp(2 * d) for d in deltas) / len(tokens) - 1)
    sequence_sums = [clamp(sum(r - b for r, b in row)) for row in responses]
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx(
        sum(math.exp(2 * s) for s in sequence_sums) / len(responses) - 1
    )
    for key, side in (("training_ppl", 0), ("rollout_ppl", 1)):
        ppl = [math.exp(-sum(pair[side] for pair in row) / len(row)) for row in responses]
        assert metrics[f"rollout_corr/{key}"] == pytest.approx(sum(ppl) / len(ppl)), key


def test_metrics_split_by_staleness(inputs):
    ref, rollout, mask = inputs
    ages = torch.tensor([0, 1, 1, 2, 2, 0])  # row 4 has no valid token: age 2 holds row 3 only
    settings = CorrectionSettings(rollout_rs=("token_k1",), rs_bounds=(Bounds(0.7, 1.4),))
    _, new_mask, metrics = rollout_correction(ref, rollout, mask, settings, staleness=ages)
    for age in (0, 1, 2):
        picked = [i for i in range(B) if ages[i] == age]
        tokens = [(i, t) for i in picked for t in range(T) if mask[i, t]]
        deltas = [clamp(ref[i, t].item() - rollout[i, t].item()) for i, t in tokens]
        prefix = f"rollout_corr/by_staleness/{age}/"
        assert metrics[prefix + "k3_kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in deltas) / len(tokens))
        gaps = [abs(ref[i, t].item() - rollout[i, t].item()) for i, t in tokens]
        assert metrics[prefix + "log_prob_gap"] == pytest.approx(sum(gaps) / len(tokens))
        rejected = sum(1 for i, t in tokens if new_mask[i, t] == 0)
        assert metrics[prefix + "masked_fraction"] == pytest.approx(rejected / len(tokens))
    assert not any(key.startswith("rollout_corr/by_staleness/3") for key in metrics)


def test_weights_are_detached_float_and_clamped():
    ref = torch.tensor([[0.0, 100.0, -100.0]], requires_grad=True)
    rollout = torch.zeros(1, 3)
    settings = CorrectionSettings(rollout_is="icepop", is_bounds=Bounds(1e-12, 1e12))
    weights, _, metrics = rollout_correction(ref, rollout, torch.ones(1, 3), settings)
    assert not weights.requires_grad and weights.dtype == torch.float32
    assert weights[0].tolist() == pytest.approx([1.0, math.exp(20), math.exp(-20)], rel=1e-6)
    assert all(math.isfinite(value) for value in metrics.values())


def test_registries_name_verl_equivalents():
    assert ROLLOUT_IS.names() == ["token", "sequence", "icepop"]
    assert ROLLOUT_RS.names() == ["token_k1", "seq_sum_k1", "seq_mean_k1", "seq_mean_k3"]
    for registry in (ROLLOUT_IS, ROLLOUT_RS):
        for name in registry.names():
            assert "rollout_" in registry.traits(name).verl and registry.get(name).__doc__, name


# ------------------------------------------------------------------------------------------- config
def config_of(*overrides: str):
    return load_config([f"config={REPO / 'examples' / 'config_cpu.yaml'}", *overrides])


def test_keys_resolve_to_settings_and_the_older_shorthand_still_works():
    settings = config_of(
        "algorithm.rollout_is=icepop",
        "algorithm.rollout_is_threshold=5.0",
        "algorithm.rollout_is_threshold_lower=0.5",
        "algorithm.rollout_rs=[seq_sum_k1,seq_mean_k3]",
        "algorithm.rollout_rs_threshold=0.5_2.0,0.02",
    ).algorithm.rollout_correction_settings()
    assert settings == CorrectionSettings(
        "icepop", Bounds(0.5, 5.0), ("seq_sum_k1", "seq_mean_k3"), (Bounds(0.5, 2.0), Bounds(None, 0.02))
    )
    comma = config_of("algorithm.rollout_rs=token_k1,seq_mean_k1").algorithm.rollout_correction_settings()
    assert comma.rs_bounds == (Bounds(0.2, 5.0), Bounds(0.999, 1.001))  # each option's preset
    shorthand = config_of("algorithm.rollout_correction=seq_tis", "algorithm.rollout_correction_threshold=3")
    assert shorthand.algorithm.rollout_correction_settings() == CorrectionSettings("sequence", Bounds(None, 3.0))
    single = config_of("algorithm.rollout_rs=token_k1", "algorithm.rollout_rs_threshold=4")
    assert single.algorithm.rollout_correction_settings().rs_bounds == (Bounds(0.25, 4.0),)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.rollout_is=tis"], "algorithm.rollout_is='tis' is not supported"),
        (["algorithm.rollout_rs=geo_rs"], "algorithm.rollout_rs='geo_rs' is not supported"),
        (["algorithm.rollout_correction_mode=async"], "rollout_correction_mode='async' is not supported"),
        (["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=0"], "rollout_is_threshold=0.0 must be"),
        (
            [
                "algorithm.rollout_is=icepop",
                "algorithm.rollout_is_threshold=2",
                "algorithm.rollout_is_threshold_lower=3",
            ],
            "needs 0 < low < high",
        ),
        (["algorithm.rollout_is=token", "algorithm.rollout_is_threshold_lower=0.5"], "read only by"),
        (["algorithm.rollout_rs=seq_mean_k1", "algorithm.rollout_rs_threshold=2.0_1.0"], "needs low < high"),
        (["algorithm.rollout_rs=seq_mean_k1", "algorithm.rollout_rs_threshold=0.5_2"], "write 0.5_2.0"),
        (["algorithm.rollout_rs=seq_mean_k3", "algorithm.rollout_rs_threshold=0.5_2.0"], "one upper bound"),
        (["algorithm.rollout_rs=seq_mean_k3", "algorithm.rollout_rs_threshold=-1"], "must be positive"),
        (["algorithm.rollout_rs=[token_k1,seq_mean_k3]", "algorithm.rollout_rs_threshold='1,2,3'"], "3 thresholds"),
        (["algorithm.rollout_rs_threshold=0.01"], "read only with algorithm.rollout_rs"),
        (["algorithm.rollout_correction=token_tis", "algorithm.rollout_is=sequence"], "set only algorithm.rollout_is"),
        (
            ["algorithm.rollout_correction_threshold=3", "algorithm.rollout_is_threshold=4"],
            "set only algorithm.rollout_is_threshold",
        ),
        (["algorithm.rollout_correction_mode=bypass", "algorithm.rollout_is=icepop"], "rollout_rs=token_k1"),
        (["algorithm.rollout_correction_mode=bypass", "algorithm.rollout_correction=token_tis"], "needs the old"),
    ],
)
def test_bad_settings_are_refused_when_the_config_loads(overrides, message):
    with pytest.raises(ConfigError, match="algorithm") as error:
        config_of(*overrides)
    assert message in str(error.value)


def test_bypass_turns_the_on_policy_shortcut_off():
    decoupled = config_of("algorithm.rollout_rs=seq_mean_k3")
    bypass = config_of("algorithm.rollout_rs=seq_mean_k3", "algorithm.rollout_correction_mode=bypass")
    samples = decoupled.data.rollout_batch_size * decoupled.worker.rollout.n
    assert reuses_update_log_probs(decoupled, samples, 1, step=1)  # the menu works per micro-batch
    assert not reuses_update_log_probs(bypass, samples, 1, step=1)


# ------------------------------------------------------------------------------------------- in the update
@pytest.fixture(scope="module")
def update_setup(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """8 image rows with random responses and advantages, their old log-probs from the actor's own pass (one
    micro-batch, so the update's first forward gives the same values: PPO's ratio is 1), and engine log-probs
    off those by up to 0.5 per token."""
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir).worker.actor
    config.micro_batch_size_per_device_for_update = config.micro_batch_size_per_device_for_experience = 8
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 8, seed=5)
    torch.manual_seed(0)
    old = Actor(load_model(str(tiny_qwen2_5_vl_dir), torch.float32), config).compute_log_probs(batch, 1.0, 8)
    noise = 0.5 * torch.sin(torch.arange(old.numel(), dtype=torch.float32)).view_as(old)
    batch["old_log_probs"] = old
    batch["rollout_log_probs"] = (old + noise) * batch["response_mask"]
    return tiny_qwen2_5_vl_dir, config, batch


def one_update(setup, extra: dict[str, torch.Tensor], correction: CorrectionSettings | None = None):
    """One optimizer step of a freshly loaded actor on the batch (with ``extra`` fields); returns its metrics."""
    model_dir, config, batch = setup
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    actor = Actor(model, config, torch.optim.SGD(model.parameters(), lr=1e-2))
    view = batch.select(
        "input_ids", "attention_mask", "position_ids", "responses", "response_mask", "old_log_probs", "advantages"
    )
    view = view.union(Batch(non_tensors={"multi_modal_inputs": batch["multi_modal_inputs"]}))
    for key, value in extra.items():
        view[key] = value
    return actor.update_policy(view, 1.0, len(view), correction)


def test_rejection_changes_the_update_and_keeps_the_pre_rejection_normaliser(update_setup, process_group):
    _, _, batch = update_setup
    mask = batch["response_mask"]
    settings = CorrectionSettings(rollout_rs=("token_k1",), rs_bounds=(Bounds(0.7, 1.4),))
    _, kept, metrics = rollout_correction(batch["old_log_probs"], batch["rollout_log_probs"], mask, settings)
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1

    full = one_update(update_setup, {})
    rejected = one_update(update_setup, {"rollout_rs_mask": kept})
    assert rejected["actor/pg_loss"] != pytest.approx(full["actor/pg_loss"], rel=1e-3)
    # token-mean at ratio 1: the loss is -sum(A) over the kept tokens divided by all valid tokens (AReaL's count)
    advantages = batch["advantages"]
    kept_sum = sum(-advantages[i, t].item() for i in range(len(batch)) for t in range(mask.shape[1]) if kept[i, t])
    assert rejected["actor/pg_loss"] == pytest.approx(kept_sum / mask.sum().item(), rel=1e-5)
    # verl's count (the mask itself rewritten) differs by exactly N_kept / N_valid
    rewritten = one_update(update_setup, {"response_mask": kept})
    ratio = kept.sum().item() / mask.sum().item()
    assert rejected["actor/pg_loss"] == pytest.approx(rewritten["actor/pg_loss"] * ratio, rel=1e-5)
    nothing = one_update(update_setup, {"rollout_rs_mask": torch.zeros_like(mask)})
    assert nothing["actor/pg_loss"] == 0.0 and nothing["actor/grad_norm"] == 0.0


def test_bypass_rejects_in_the_update_and_keeps_weights_as_metrics(update_setup, process_group):
    _, _, batch = update_setup
    engine = {"old_log_probs": batch["rollout_log_probs"]}  # bypass: the engine's log-probs are the old policy
    plain = one_update(update_setup, engine)
    weighted = one_update(update_setup, engine, CorrectionSettings("token", Bounds(None, 1.2), mode="bypass"))
    # PPO's ratio already is pi_theta / pi_rollout: the weights change no loss, only report the mismatch
    assert weighted["actor/pg_loss"] == pytest.approx(plain["actor/pg_loss"], rel=1e-12)
    current, mask = batch["old_log_probs"], batch["response_mask"]
    expected_kl = masked_mean(batch["rollout_log_probs"].double() - current.double(), mask).item()
    assert weighted["rollout_corr/kl"] == pytest.approx(expected_kl, rel=1e-4)
    assert weighted["rollout_corr/rollout_is_mean"] < 1.2
    rejecting = CorrectionSettings(rollout_rs=("token_k1",), rs_bounds=(Bounds(0.7, 1.4),), mode="bypass")
    rejected = one_update(update_setup, engine, rejecting)
    assert rejected["actor/pg_loss"] != pytest.approx(plain["actor/pg_loss"], rel=1e-3)
    assert 0 < rejected["rollout_corr/rollout_rs_masked_fraction"] < 1
