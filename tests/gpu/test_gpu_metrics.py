"""CUDA-only parts of the metrics and of ``use_torch_compile``: compiled log-prob chunks equal the eager ones (values
and gradients), the device peak is reset by each report, the used memory is the driver's view, and the machine's GPU
has a peak in the MFU table."""

from __future__ import annotations

import pytest
import torch
from loop import DEVICE

from easyr1.algorithms.logits import compile_allowed, entropy_from_logits, log_probs_from_logits
from easyr1.logging.perf import memory_metrics, peak_flops


pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA only")
GIB = 1024**3


def test_compiled_chunks_equal_eager_values_and_gradients():
    assert compile_allowed(True, "cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    # bf16 logits as the actor produces them; 700 positions in chunks of 256 leave a short last chunk
    base = (torch.randn(2, 350, 4096, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 4096, (2, 350), device="cuda", generator=generator)
    results = {}
    for compiled in (False, True):
        logits = base.clone().requires_grad_(True)
        log_probs = log_probs_from_logits(logits, labels, chunk_tokens=256, compiled=compiled)
        entropy = entropy_from_logits(logits, chunk_tokens=256, compiled=compiled)
        (log_probs.sum() + 0.1 * entropy.sum()).backward()
        results[compiled] = (log_probs.detach(), entropy.detach(), logits.grad.float())
    for eager, compiled in zip(results[False], results[True]):
        # both compute in float32 from the same bf16 inputs; only the reduction order differs
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_compiled_and_eager_chunk_times_are_printed(capsys):
    """Not a pass/fail on speed: the numbers that decide ``use_torch_compile``'s default on GPU (issue 35), printed
    with the run's output. A 7B-vocabulary update micro-batch's log-probs and entropy, forward and backward."""
    import time

    generator = torch.Generator(device="cuda").manual_seed(0)
    base = (torch.randn(4096, 152064, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    labels = torch.randint(0, 152064, (4096,), device="cuda", generator=generator)
    seconds = {}
    for compiled in (False, True, False, True):  # interleaved; each setting's second turn is the one kept
        logits = base.clone().requires_grad_(True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        log_probs = log_probs_from_logits(logits, labels, compiled=compiled)
        entropy = entropy_from_logits(logits, compiled=compiled)
        (log_probs.sum() + 0.1 * entropy.sum()).backward()
        torch.cuda.synchronize()
        seconds[compiled] = time.perf_counter() - start
        assert torch.isfinite(logits.grad).all()
    with capsys.disabled():
        print(
            f"\nuse_torch_compile: eager {seconds[False] * 1e3:.1f} ms, compiled {seconds[True] * 1e3:.1f} ms, "
            f"eager / compiled {seconds[False] / seconds[True]:.2f}x (4096 positions x 152064, bf16)"
        )


def test_device_peak_is_reset_by_each_report():
    torch.cuda.init()
    memory_metrics()
    block = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    del block
    with_block = memory_metrics()
    after = memory_metrics()
    assert with_block["perf/max_device_memory_gb"] >= 1.0
    assert with_block["perf/max_device_memory_gb"] - after["perf/max_device_memory_gb"] >= 0.99


def test_used_memory_is_what_the_driver_sees():
    torch.cuda.init()
    before = memory_metrics()["perf/device_memory_used_gb"]
    block = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    during = memory_metrics()
    del block
    torch.cuda.empty_cache()
    assert during["perf/device_memory_used_gb"] - before >= 1.9  # the allocator's 2 GiB, seen from outside
    assert during["perf/device_memory_used_gb"] <= during["perf/device_memory_total_gb"]


def test_this_gpu_has_a_listed_peak():
    name = torch.cuda.get_device_name()
    assert peak_flops(name) is not None, f"add {name!r} to easyr1/logging/perf.py: PEAK_BF16_FLOPS"
