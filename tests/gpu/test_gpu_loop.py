"""The product's training step on one device: ``Trainer.train_step`` through the in-process worker group.

Runs, each a trainer built by ``build_trainer`` from ``examples/config.yaml`` (see ``loop.py``):

- the recipe as it is (bf16 compute and a bf16 engine on CUDA, KL loss, reference with FSDP CPU offload, rank-0 init,
  actor parameter and optimizer offload, ``use_torch_compile``), 3 steps;
- float32 throughout, 3 steps: the engine's and the actor's log-probs of the sampled tokens agree to 1e-3 at every
  step (after each update the engine is re-synced, so a stale or partial weight sync shows at steps 2 and 3);
- the actor under FSDP's own CPU offload (``fsdp.enable_cpu_offload``) instead of easyr1's, 2 steps;
- PPO with a critic (``algorithm.adv_estimator=gae``), 2 steps;
- LoRA adapters (``lora.rank=8``), 2 steps;
- a checkpoint saved after step 1 and loaded by a new trainer, whose step 2 equals the first trainer's step 2.

On CPU (``EASYR1_GPU_TESTS_ON_CPU=1``) every run runs; the CUDA-only checks (device memory, MFU, where offloaded state
lives) skip themselves.
"""

from __future__ import annotations

import math

import pytest
import torch
from loop import DEVICE, LoopRun, finite, recipe_config, run_steps

from easyr1.distributed.fsdp import full_tensor


needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA only")
FP32 = (
    "worker.actor.fsdp.torch_dtype=float32",
    "worker.actor.fsdp.mp_param_dtype=fp32",
    "worker.rollout.dtype=float32",
)
# measurements, not results: they differ between two runs of the same step
MEASURED = ("timing/", "perf/", "throughput/")


@pytest.fixture(scope="module")
def recipe_run(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory):
    config = recipe_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory.mktemp("recipe"))
    run = LoopRun(config)
    try:
        records = []
        for _ in range(3):
            records.append(run.step())
            # where the offloaded models live between steps (easyr1's offload for the actor, FSDP's for the reference)
            records[-1].metrics["test/actor_params_on_device"] = float(run.worker.actor_residency.params_on_device)
            ref_devices = {param.device.type for param in run.worker.ref.model.parameters()}
            records[-1].metrics["test/ref_params_on_host"] = float(ref_devices == {"cpu"})
        return records
    finally:
        run.close()


@pytest.fixture(scope="module")
def fp32_run(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory):
    return run_steps(recipe_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path_factory.mktemp("fp32"), *FP32), 3)


@pytest.mark.parametrize("run_name", ["recipe_run", "fp32_run"])
def test_steps_train_with_finite_losses_and_move_the_weights(run_name, request):
    for record in request.getfixturevalue(run_name):
        metrics = record.metrics
        assert finite(metrics, "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"), metrics
        assert metrics["actor/grad_norm"] > 0
        assert (record.probe_after - record.probe_before).abs().max().item() > 0, "the update did not move the weights"
        assert record.result_devices == {"cpu"}, "results must come back to the driver as host tensors"


def test_engine_and_actor_agree_in_fp32_at_every_step(fp32_run):
    gaps = [record.metrics["rollout/rollout_log_prob_abs_diff"] for record in fp32_run]
    assert max(gaps) < 1e-3, gaps


def test_engine_and_actor_agree_with_the_recipes_dtypes(recipe_run):
    # bf16 keeps 8 mantissa bits (relative rounding 2^-9 per operation); the tiny model's logits are O(1), and the
    # engine (KV-cached generate) and the actor (one forward, other kernels) round differently, so per-token
    # log-prob differences of ~1e-2 are expected. 0.05 is above that; a policy that was not synced at all after
    # an update at lr 1e-4 is caught by the fp32 run, where the bound is 1e-3.
    gaps = [record.metrics["rollout/rollout_log_prob_abs_diff"] for record in recipe_run]
    assert max(gaps) < 0.05, gaps


def test_memory_metrics_are_reported_every_step(recipe_run):
    for record in recipe_run:
        metrics = record.metrics
        assert metrics["perf/max_host_memory_gb"] > 0
        if DEVICE == "cuda":
            assert 0 < metrics["perf/max_device_memory_gb"] <= metrics["perf/max_device_memory_reserved_gb"]
            assert 0 < metrics["perf/device_memory_used_gb"] <= metrics["perf/device_memory_total_gb"]
            # read right after generation, the engine awake (its model in use), not after the update
            assert 0 < metrics["perf/generation_device_memory_used_gb"] <= metrics["perf/device_memory_total_gb"]
        else:
            assert "perf/generation_device_memory_used_gb" not in metrics  # no CUDA API is called on CPU


@needs_cuda
def test_mfu_is_reported_on_a_known_gpu(recipe_run):
    for record in recipe_run:
        assert 0 < record.metrics["perf/mfu"] < 1, record.metrics.get("perf/mfu")


@needs_cuda
def test_offloaded_models_stay_on_the_host_between_steps(recipe_run):
    for record in recipe_run:
        assert record.metrics["test/actor_params_on_device"] == 0.0  # worker.actor.offload.offload_params
        assert record.metrics["test/ref_params_on_host"] == 1.0  # worker.ref.fsdp.enable_cpu_offload


def test_the_actor_trains_under_fsdp_cpu_offload(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    config = recipe_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        tmp_path,
        "worker.actor.fsdp.enable_cpu_offload=true",
        "worker.actor.offload.offload_params=false",
        "worker.actor.offload.offload_optimizer=false",
    )
    run = LoopRun(config)
    try:
        for _ in range(2):
            record = run.step()
            assert finite(record.metrics, "actor/pg_loss", "actor/grad_norm"), record.metrics
            assert (record.probe_after - record.probe_before).abs().max().item() > 0
            assert record.metrics["rollout/rollout_log_prob_abs_diff"] < 0.05
            # FSDP's CPU offload keeps the shards in host memory between uses
            assert {param.device.type for param in run.worker.actor.model.parameters()} == {"cpu"}
    finally:
        run.close()


# rewards that are never all zero (the untrained model's shape answers usually are), so the critic has targets
LENGTH_REWARD = """
def compute_score(inputs):
    return [{"overall": x["response_length"] / 8} for x in inputs]
"""


def test_ppo_trains_the_critic(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    (tmp_path / "length_reward.py").write_text(LENGTH_REWARD, encoding="utf-8")
    config = recipe_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        tmp_path,
        "algorithm.adv_estimator=gae",
        "worker.critic.optim.lr=1e-3",
        f"worker.reward.reward_function={tmp_path / 'length_reward.py'}:compute_score",
    )
    run = LoopRun(config)
    try:
        value_head = run.worker.critic.model.value_head.weight
        for _ in range(2):
            before = full_tensor(value_head.detach()).float().cpu().clone()
            record = run.step()
            assert finite(record.metrics, "critic/vf_loss", "critic/grad_norm", "actor/pg_loss"), record.metrics
            assert not torch.equal(full_tensor(value_head.detach()).float().cpu(), before), "the critic did not train"
    finally:
        run.close()


def test_lora_trains_the_adapters_only(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    config = recipe_config(
        tiny_qwen2_5_vl_dir,
        tiny_dataset_dir,
        tmp_path,
        "worker.actor.model.lora.rank=8",
        "worker.actor.model.lora.alpha=16",
        "worker.actor.optim.lr=1e-3",
    )
    run = LoopRun(config)
    try:
        names = [name for name, _ in run.worker.actor.model.named_parameters() if "layers.0.self_attn.q_proj" in name]
        base = next(name for name in names if name.endswith("base_layer.weight"))
        adapter = next(name for name in names if "lora_B" in name)
        before = {name: run.probe(name) for name in (base, adapter)}
        for _ in range(2):
            record = run.step()
            assert finite(record.metrics, "actor/pg_loss", "actor/grad_norm"), record.metrics
            assert record.metrics["rollout/rollout_log_prob_abs_diff"] < 0.05  # the engine gets the folded weights
        assert torch.equal(run.probe(base), before[base]), "LoRA must leave the base weights as they were"
        assert not torch.equal(run.probe(adapter), before[adapter]), "the adapters did not train"
    finally:
        run.close()


def test_a_saved_and_loaded_checkpoint_gives_the_same_next_step(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path):
    first = LoopRun(recipe_config(tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path / "first"))
    try:
        first.step()
        saved = first.trainer.save_checkpoint()
        expected = first.step()
    finally:
        first.close()
    resumed_config = recipe_config(
        tiny_qwen2_5_vl_dir, tiny_dataset_dir, tmp_path / "second", f"trainer.load_checkpoint_path={saved}"
    )
    second = LoopRun(resumed_config)
    try:
        assert second.trainer.global_step == 1
        assert torch.equal(second.probe(), expected.probe_before), "the loaded weights are not the saved ones"
        got = second.step()
    finally:
        second.close()
    keys = sorted(key for key in expected.metrics if not key.startswith(MEASURED))
    assert keys == sorted(key for key in got.metrics if not key.startswith(MEASURED))
    assert "actor/pg_loss" in keys and "reward/overall" in keys
    # sampled tokens and rewards exactly; on CUDA, gradients may differ in the last bits (atomic adds in backward)
    assert got.metrics["reward/overall"] == expected.metrics["reward/overall"]
    assert got.metrics["response_length/mean"] == expected.metrics["response_length/mean"]
    tolerance = 0.0 if DEVICE == "cpu" else 1e-3
    for key in keys:
        assert math.isclose(got.metrics[key], expected.metrics[key], rel_tol=tolerance, abs_tol=tolerance * 1e-3), key
    assert torch.allclose(got.probe_after, expected.probe_after, rtol=tolerance, atol=tolerance * 1e-3)
