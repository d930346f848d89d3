"""On a GPU: the plan's device memory for the actor's update against CUDA's measured peak, for a small real config.

A ~100 M-parameter Qwen2.5-VL (random weights, built here) trains one GRPO step of the product's loop in this process
(``loop.py``) with the GPU defaults (fp32 master weights, bf16 compute), no reference, no offload and fixed
micro-batches, every response generated to the full ``data.max_response_length`` so that the micro-batches are as
long as the plan assumes. CUDA's peak allocated bytes during ``update_actor`` (reset just before it) are compared
with the plan's ``actor update`` phase for the same config on this GPU (``easyr1.plan.check.plan_run``, the code
``python -m easyr1.tools.plan`` runs). The bar is the one the CPU plan meets for host memory: within 25%. CUDA only:
there is no CUDA allocator to read on CPU, and the step itself (256-token responses of a 100 M model) takes minutes
there; ``test_gpu_loop.py`` runs the loop on CPU.
"""

from __future__ import annotations

import math

import pytest
from loop import DEVICE, LoopRun, recipe_config


GIB = 2**30
pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA only: the comparison reads CUDA's allocator")


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


def test_the_plan_of_the_actor_update_matches_the_measured_peak(mid_size_model_dir, tiny_dataset_dir, tmp_path):
    from easyr1.plan.check import plan_run
    from easyr1.plan.hardware import gpu_device, local_cuda_device

    config = recipe_config(
        mid_size_model_dir,
        tiny_dataset_dir,
        tmp_path,
        "algorithm.disable_kl=true",
        "worker.actor.padding_free=false",
        "worker.actor.dynamic_batching=false",
        "worker.actor.offload.offload_params=false",
        "worker.actor.offload.offload_optimizer=false",
        "worker.rollout.dtype=null",  # the actor's compute dtype
        "data.max_response_length=256",
        "worker.rollout.max_model_len=320",
        "worker.rollout.ignore_eos=true",  # full-length responses: the lengths the plan assumes
    )
    device = local_cuda_device() or gpu_device("H100")
    plan, _ = plan_run(config, device)
    phase = next(phase for phase in plan.phases if phase.name == "actor update")
    run = LoopRun(config)
    try:
        record = run.step()
    finally:
        run.close()
    assert math.isfinite(record.metrics["actor/pg_loss"])  # the update ran
    for name, value in phase.items:
        print(f"plan, actor update: {name:<40} {value / GIB:8.3f} GiB")
    measured = record.update_peak_bytes
    ratio = phase.total / measured
    print(
        f"actor update on {device.name}: planned {phase.total / GIB:.3f} GiB, measured peak {measured / GIB:.3f} GiB, "
        f"planned / measured {ratio:.2f}"
    )
    assert 0.75 <= ratio <= 1.25
