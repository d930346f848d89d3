"""Hardware metrics: model FLOPs utilisation arithmetic, known device peaks, and peak memory since the last report."""

import os
import resource

import pytest
import torch

from easyr1.logging import perf
from easyr1.logging.perf import PEAK_BF16_FLOPS, memory_metrics, model_flops_utilization, peak_flops


def test_mfu_counts_two_flops_per_parameter_per_token_per_pass():
    # 1e9 parameters, 1000 tokens, forward + backward (3 passes): 6e12 FLOPs in 1 s on a 12e12 FLOP/s device
    assert model_flops_utilization(10**9, 1000, 3, 1.0, 12e12) == pytest.approx(0.5)
    assert model_flops_utilization(10**9, 1000, 1, 2.0, 1e12) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "device_name, key",
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L20", "L20"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "4090"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_peak_flops_takes_the_most_specific_listed_name(device_name, key):
    assert peak_flops(device_name) == PEAK_BF16_FLOPS[key]


@pytest.mark.parametrize("device_name", ["cpu", "NVIDIA A10G", "NVIDIA H2000", "Tesla V100-SXM2-16GB"])
def test_peak_flops_unknown_for_unlisted_devices(device_name):
    # A10G and V100 are not listed: a loose substring match would give them A10's or nothing's numbers
    assert peak_flops(device_name) is None


def test_peak_flops_table_lists_dense_not_sparse_numbers():
    # dense bf16 of the H100 SXM is 989 TFLOP/s and nothing listed reaches the sparse 2x of a GB200
    assert PEAK_BF16_FLOPS["H200"] == PEAK_BF16_FLOPS["H100"] < PEAK_BF16_FLOPS["B200"] < PEAK_BF16_FLOPS["GB200"]
    assert max(PEAK_BF16_FLOPS.values()) < 3e15


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


def resident_gb() -> float:
    page = os.sysconf("SC_PAGE_SIZE")
    return int(open("/proc/self/statm").read().split()[1]) * page / 1024**3


def touch(size: int) -> bytearray:
    block = bytearray(size)
    block[::4096] = b"x" * len(block[::4096])
    return block


@pytest.mark.skipif(perf._resident_peak_kib() is None or not perf._reset_resident_peak(), reason="no resettable VmHWM")
def test_host_peak_is_reset_by_each_report():
    memory_metrics()
    block = touch(300 * 1024**2)
    del block
    with_block = memory_metrics()["perf/max_host_memory_gb"]
    after = memory_metrics()["perf/max_host_memory_gb"]  # the block was freed before the previous report
    assert with_block - after == pytest.approx(0.3, abs=0.1)
    assert after == pytest.approx(resident_gb(), abs=0.05)


def test_host_peak_without_reset_keeps_the_peak():
    memory_metrics()
    block = touch(300 * 1024**2)
    del block
    first = memory_metrics(reset=False)["perf/max_host_memory_gb"]
    second = memory_metrics(reset=False)["perf/max_host_memory_gb"]
    assert second == pytest.approx(first, abs=0.01) and first - resident_gb() > 0.2


def test_host_peak_falls_back_to_ru_maxrss_without_proc(monkeypatch, tmp_path):
    monkeypatch.setattr(perf, "_STATUS", tmp_path / "missing")
    expected = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    assert memory_metrics()["perf/max_host_memory_gb"] == pytest.approx(expected, abs=0.01)


def test_no_device_metrics_without_cuda_use():
    # nothing here initialised CUDA (there is none on CPU machines), so no CUDA API may be touched
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA already in use in this process")
    assert set(memory_metrics()) == {"perf/max_host_memory_gb"}


def test_device_peak_flops_prefers_the_configured_value_and_measures_a_cpu():
    from easyr1.logging.perf import device_peak_flops, measured_matmul_flops

    assert device_peak_flops("cpu", torch.float32, configured=5e10) == 5e10
    measured = device_peak_flops("cpu", torch.float32)
    # a real CPU does between 1 GFLOP/s and 100 TFLOP/s on a 512-square fp32 matmul
    assert 1e9 < measured < 1e14
    # measured once per process and thread count: the second call is the cached value
    assert measured_matmul_flops(torch.float32, torch.get_num_threads()) == measured
