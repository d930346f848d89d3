"""On a GPU: the plan's device memory for the actor's update against CUDA's measured peak, for a small real config.

A ~100 M-parameter Qwen2.5-VL (random weights, built here) trains one GRPO step in the in-process harness with the
GPU defaults (fp32 master weights, bf16 compute), every response generated to the full ``data.max_response_length``
so that the micro-batches are as long as the plan assumes. CUDA's peak allocated bytes during ``update_actor``
(reset just before it) are compared with the plan's ``actor update`` phase for the same config on this GPU
(``easyr1.plan.check.plan_run``, the code ``python -m easyr1.tools.plan`` runs). The bar is the one the CPU plan
meets for host memory: within 25%. With ``EASYR1_GPU_TESTS_ON_CPU=1`` the step and the plan run and the comparison
is skipped (there is no CUDA allocator to read).
"""

from __future__ import annotations

import math

import pytest
from inprocess import DEVICE, InProcessRun, build_config


GIB = 2**30


@pytest.fixture(scope="module")
def mid_size_model_dir(tmp_path_factory):
    from easyr1.tools.tiny_model import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("plan") / "qwen2_5_vl_100m",
        family="qwen2_5_vl",
        seed=0,
        hidden_size=1024,
        num_layers=8,
        intermediate_size=2816,
    )


def test_the_plan_of_the_actor_update_matches_the_measured_peak(mid_size_model_dir, tiny_dataset_dir):
    from easyr1.plan.check import plan_run
    from easyr1.plan.hardware import gpu_device, local_cuda_device

    config = build_config(
        mid_size_model_dir,
        tiny_dataset_dir,
        "worker.actor.fsdp.torch_dtype=null",  # the GPU default: bf16 compute, fp32 master weights
        "data.max_response_length=256",
        "worker.rollout.max_model_len=320",
        "worker.rollout.ignore_eos=true",  # full-length responses: the lengths the plan assumes
        "worker.actor.micro_batch_size_per_device_for_update=8",
    )
    device = local_cuda_device() or gpu_device("H100")
    plan, _ = plan_run(config, device)
    phase = next(phase for phase in plan.phases if phase.name == "actor update")
    run = InProcessRun(config)
    try:
        record = run.step(1)
    finally:
        run.close()
    assert math.isfinite(record.metrics["actor/pg_loss"])  # the update ran
    for name, value in phase.items:
        print(f"plan, actor update: {name:<40} {value / GIB:8.3f} GiB")
    if DEVICE != "cuda":
        pytest.skip("no CUDA allocator to measure (EASYR1_GPU_TESTS_ON_CPU=1 ran the step and the plan only)")
    measured = record.update_peak_bytes
    ratio = phase.total / measured
    print(
        f"actor update on {device.name}: planned {phase.total / GIB:.3f} GiB, measured peak {measured / GIB:.3f} GiB, "
        f"planned / measured {ratio:.2f}"
    )
    assert 0.75 <= ratio <= 1.25
