"""Hardware metrics: model FLOPs utilisation arithmetic, known device peaks, and peak memory."""

import pytest

from easyr1.logging.perf import memory_metrics, model_flops_utilization, peak_flops


def test_mfu_counts_two_flops_per_parameter_per_token_per_pass():
    # 1e9 parameters, 1000 tokens, forward + backward (3 passes): 6e12 FLOPs in 1 s on a 12e12 FLOP/s device
    assert model_flops_utilization(10**9, 1000, 3, 1.0, 12e12) == pytest.approx(0.5)
    assert model_flops_utilization(10**9, 1000, 1, 2.0, 1e12) == pytest.approx(1.0)


def test_peak_flops_known_only_for_listed_devices():
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("cpu") is None


def test_memory_metrics_report_this_process_peak():
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    current = int(open("/proc/self/statm").read().split()[1]) * page / 1024**3  # resident now, GB
    before = memory_metrics()["perf/max_host_memory_gb"]
    size = int((before - current + 0.3) * 1024**3)  # enough to push the peak 0.3 GB above its old value
    block = bytearray(size)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so it is resident
    after = memory_metrics()["perf/max_host_memory_gb"]
    del block
    assert after - before == pytest.approx(0.3, abs=0.1)
