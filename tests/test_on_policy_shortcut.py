"""The on-policy shortcut: when a rollout batch feeds exactly one optimizer step, the update's own forward gives the
old log-probs. On the same batch its loss, gradients and metrics equal the separate pass + update's (FSDP2 on one
gloo rank, in this process), and the decision turns it off whenever the old policy differs or is needed earlier."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO, demo_config, training_batch

from easyr1.algorithms import rollout_correction, rollout_mismatch_metrics
from easyr1.algorithms.rollout_correction import Bounds, CorrectionSettings
from easyr1.config import load_config
from easyr1.distributed.fsdp import data_parallel_mesh, full_tensor, shard_model
from easyr1.models.loading import load_model
from easyr1.on_policy import reuses_update_log_probs
from easyr1.protocol import Batch
from easyr1.workers.actor import Actor


# Relative tolerance of the comparisons; absolute floor for values that are exactly 0 on one side (the ratio's
# log is 0 on-policy; the separate pass may differ from the update's forward by float rounding).
RTOL, ATOL = 1e-6, 1e-9


def build_actor(model_dir, actor_config) -> tuple[Actor, dict[str, torch.Tensor]]:
    """A sharded actor with an LR schedule, and a dict its gradients (full tensors) fill just before the optimizer
    steps."""
    torch.manual_seed(0)
    model = load_model(str(model_dir), torch.float32)
    shard_model(model, data_parallel_mesh("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    gradients: dict[str, torch.Tensor] = {}

    def keep_gradients(*_) -> None:
        for name, parameter in model.named_parameters():
            if parameter.grad is not None:
                gradients[name] = full_tensor(parameter.grad.detach()).clone()

    optimizer.register_step_pre_hook(keep_gradients)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)  # actor/lr is logged
    actor = Actor(model, actor_config, optimizer, scheduler, banned_token_ids=[model.config.image_token_id])
    return actor, gradients


# Weights truncated (the noise reaches exp(0.5) per token), and IcePop zeroing tokens while two rejection options
# drop tokens and whole responses: each acts on these inputs (the test checks it).
CORRECTIONS = {
    "off": None,
    "token_tis": CorrectionSettings("token", Bounds(None, 1.5)),
    "seq_tis": CorrectionSettings("sequence", Bounds(None, 1.5)),
    "icepop_token_k1_k3rs": CorrectionSettings(
        "icepop", Bounds(0.8, 1.3), ("token_k1", "seq_mean_k3"), (Bounds(0.7, 1.4), Bounds(None, 0.06))
    ),
}


def driver_metrics(old, rollout, mask, correction: CorrectionSettings | None) -> dict[str, float]:
    """What the trainer logs from the old log-probs (trainer._old_policy_metrics)."""
    metrics = rollout_mismatch_metrics(old, rollout, mask)
    if correction is not None:
        metrics.update(rollout_correction(old, rollout, mask, correction)[2])
    return metrics


@pytest.fixture(scope="module")
def setup(tiny_qwen2_5_vl_dir, tiny_dataset_dir):
    """8 image rows with random responses and advantages; rollout log-probs off the trainer's by up to 0.5."""
    config = demo_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir).worker.actor
    batch = training_batch(tiny_qwen2_5_vl_dir, tiny_dataset_dir, 8, seed=3)
    torch.manual_seed(0)
    log_probs = Actor(load_model(str(tiny_qwen2_5_vl_dir), torch.float32), config).compute_log_probs(batch, 1.0, 8)
    noise = 0.5 * torch.sin(torch.arange(log_probs.numel(), dtype=torch.float32)).view_as(log_probs)
    batch["rollout_log_probs"] = (log_probs + noise) * batch["response_mask"]
    return tiny_qwen2_5_vl_dir, config, batch


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding_free"])
@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_shortcut_equals_separate_pass_then_update(setup, process_group, padding_free, name):
    model_dir, config, batch = setup
    correction = CORRECTIONS[name]
    config.padding_free = padding_free
    # Uneven micro-batches (3 + 3 + 2), the same for the separate pass: it then runs the very same forwards, so any
    # difference is the shortcut's. (With another layout the separate pass's own float rounding shows: measured
    # 4.8e-7 at most in a log-prob, 8e-7 relative in a gradient, and ppo_kl 1.8e-8 where the shortcut's is 0.)
    config.micro_batch_size_per_device_for_update = 3
    config.micro_batch_size_per_device_for_experience = 3
    mask = batch["response_mask"]
    update_view = batch.select("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
    update_view = update_view.union(Batch(non_tensors={"multi_modal_inputs": batch["multi_modal_inputs"]}))
    update_view["advantages"] = batch["advantages"]

    # today's path: a separate no-grad pass, the weights on the driver, then the update
    actor, separate_gradients = build_actor(model_dir, config)
    old = actor.compute_log_probs(update_view, 1.0, config.micro_batch_size_per_device_for_experience)
    separate_batch = update_view.union(Batch(tensors={"old_log_probs": old}))
    if correction is not None:
        weights, kept, _ = rollout_correction(old, batch["rollout_log_probs"], mask, correction)
        separate_batch["rollout_is_weights"] = weights
        if correction.rollout_rs:
            separate_batch["rollout_rs_mask"] = kept
    separate = actor.update_policy(separate_batch, 1.0, len(batch))
    separate.update(driver_metrics(old, batch["rollout_log_probs"], mask, correction))

    # the shortcut: one update that returns its own log-probs; the driver's metrics come from them
    actor, shortcut_gradients = build_actor(model_dir, config)
    shortcut_batch = update_view.union(Batch(tensors={"rollout_log_probs": batch["rollout_log_probs"]}))
    shortcut, returned = actor.update_on_policy(shortcut_batch, 1.0, correction)
    shortcut.update(driver_metrics(returned, batch["rollout_log_probs"], mask, correction))

    valid = mask.bool()
    torch.testing.assert_close(returned[valid], old[valid], rtol=RTOL, atol=ATOL)
    assert set(shortcut) == set(separate)
    for key, value in separate.items():
        assert shortcut[key] == pytest.approx(value, rel=RTOL, abs=ATOL), key
    if correction is not None:  # the weights really act: some are truncated, so the loss differs from no correction
        assert separate["rollout_corr/rollout_is_ratio_fraction_high"] > 0
    if correction is not None and correction.rollout_rs:  # the rejection really acts, and not on everything
        assert 0 < separate["rollout_corr/rollout_rs_masked_fraction"] < 1
        assert 0 < separate["rollout_corr/rollout_rs_seq_masked_fraction"] < 1
    assert separate_gradients.keys() == shortcut_gradients.keys() and len(separate_gradients) > 0
    for name, gradient in separate_gradients.items():
        torch.testing.assert_close(shortcut_gradients[name], gradient, rtol=RTOL, atol=ATOL * 10, msg=name)
    assert max(gradient.abs().max().item() for gradient in separate_gradients.values()) > 1e-4  # not all zero


def test_shortcut_refuses_a_batch_that_carries_old_log_probs(setup, process_group):
    model_dir, config, batch = setup
    actor, _ = build_actor(model_dir, config)
    with pytest.raises(ValueError, match="must not carry them"):
        actor.update_on_policy(batch.union(Batch(tensors={"old_log_probs": batch["rollout_log_probs"]})), 1.0)


def config_of(path: str, *overrides: str):
    return load_config([f"config={REPO / 'examples' / path}", *overrides], validate=False)


def samples(config) -> int:
    return config.data.rollout_batch_size * config.worker.rollout.n


@pytest.mark.parametrize("workers", [1, 2])
def test_decision_is_on_for_the_demo_and_for_easyr1_grpo_with_one_update_per_step(workers):
    demo = config_of("config_cpu.yaml")  # GRPO, no KL, global_batch_size = rollout_batch_size
    assert reuses_update_log_probs(demo, samples(demo), workers, step=1)
    # EasyR1's recipe (KL as a loss) with one update per step: the KL loss does not need the old log-probs
    easyr1 = config_of("config.yaml", "worker.actor.global_batch_size=512")
    assert easyr1.algorithm.use_kl_loss and not easyr1.algorithm.disable_kl
    assert reuses_update_log_probs(easyr1, samples(easyr1), workers, step=1)


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["worker.actor.ppo_epochs=2"], "the second epoch sees a changed policy"),
        (["worker.actor.global_batch_size=8"], "two mini-batches: the second sees a changed policy"),
        (["algorithm.disable_kl=false", "algorithm.use_kl_loss=false"], "the in-reward KL needs them first"),
        (["worker.actor.reuse_update_log_probs=false"], "switched off"),
        (["trainer.critic_warmup=3", "algorithm.adv_estimator=gae"], "no actor update during the critic's warm-up"),
    ],
)
def test_decision_is_off_whenever_the_old_policy_differs_or_is_needed_first(overrides, why):
    config = config_of("config_cpu.yaml", *overrides)
    assert not reuses_update_log_probs(config, samples(config), 2, step=1), why


def test_decision_follows_the_step_and_easyr1_default_mini_batches():
    warmup = config_of("config_cpu.yaml", "trainer.critic_warmup=3", "algorithm.adv_estimator=gae")
    assert [reuses_update_log_probs(warmup, samples(warmup), 2, step) for step in (3, 4)] == [False, True]
    easyr1 = config_of("config.yaml")  # 512 prompts per step, 128 per update: four optimizer steps
    assert not reuses_update_log_probs(easyr1, samples(easyr1), 8, step=1)
