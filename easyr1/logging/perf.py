"""Hardware numbers for the metrics: memory peaks of a worker since its last report, the device memory in use, and
model FLOPs utilisation against the device's peak throughput (a GPU's data-sheet figure, a CPU's measured one, or the
configured ``trainer.peak_flops_per_device``)."""

from __future__ import annotations

import functools
import re
import resource
import time
from pathlib import Path

import torch


# Dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s per GPU, keyed by the model name in
# torch.cuda.get_device_name(). Sources: each vendor's data sheet; NVIDIA quotes the sparse figure with an asterisk,
# halved here.
#   H100 SXM / H800 SXM / GH200 989.4 T; H100 NVL 835 T; H100 PCIe / H800 PCIe 756 T (H100 data sheet)
#   H200 SXM 989 T, H200 NVL 835 T (H200 data sheet: 1,979 / 1,671 T sparse); H20 148 T (H20 product brief)
#   B200 (HGX, 1000 W) 2.25 P; GB200 (NVL72, 1200 W) 2.5 P (HGX B200 and GB200 NVL72 data sheets: 4.5 / 5 P sparse)
#   A100 / A800 312 T; A30 165 T; A40 149.7 T; A10 125 T (Ampere data sheets)
#   L40S 362 T; L40 181 T; L20 119.5 T; L4 121 T (Ada data center data sheets)
#   RTX 4090 165.2 T with fp32 accumulation (Ada GPU architecture white paper)
#   AMD Instinct MI300X / MI325X 1307.4 T, MI250X 383 T (AMD data sheets)
PEAK_BF16_FLOPS = {
    "H100": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H800": 989e12,
    "H800 PCIe": 756e12,
    "GH200": 989e12,
    "H200": 989e12,
    "H200 NVL": 835e12,
    "H20": 148e12,
    "B200": 2250e12,
    "GB200": 2500e12,
    "A100": 312e12,
    "A800": 312e12,
    "A30": 165e12,
    "A40": 149.7e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L20": 119.5e12,
    "L4": 121e12,
    "4090": 165.2e12,
    "MI300X": 1307.4e12,
    "MI325X": 1307.4e12,
    "MI250X": 383e12,
}


def _names(key: str) -> re.Pattern[str]:
    # a whole model name: "A10" names "NVIDIA A10" but not "A100" or "A10G", "H20" not "H200"
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", re.IGNORECASE)


_PATTERNS = sorted(((key, _names(key)) for key in PEAK_BF16_FLOPS), key=lambda item: -len(item[0]))


def peak_flops(device_name: str) -> float | None:
    """The device's dense peak bf16 FLOP/s, or ``None`` when unknown (CPUs, unlisted GPUs).

    The most specific listed name wins: "NVIDIA H100 PCIe" is the PCIe card, "NVIDIA H100 80GB HBM3" the SXM one.
    """
    for key, pattern in _PATTERNS:
        if pattern.search(device_name):
            return PEAK_BF16_FLOPS[key]
    return None


@functools.cache
def measured_matmul_flops(dtype: torch.dtype = torch.float32, threads: int | None = None, size: int = 512) -> float:
    """Best FLOP/s of ``size``-square ``dtype`` matmuls on the CPU with this process's threads, measured once per
    process (about 0.2 s): the peak the CPU reaches on the dense products a training step is made of.

    ``threads`` is only part of the cache key (callers pass ``torch.get_num_threads()``), so a change of thread count
    measures again.
    """
    del threads  # the measurement runs with the current setting
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(size, size, generator=generator).to(dtype)
    second = torch.randn(size, size, generator=generator).to(dtype)
    torch.matmul(first, second)  # warm-up: first-call allocation and kernel selection
    best = float("inf")
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.matmul(first, second)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / max(best, 1e-9)


def device_peak_flops(device: str, dtype: torch.dtype, configured: float | None = None) -> float | None:
    """Peak FLOP/s for the MFU: ``configured`` when given; on CUDA the data-sheet dense bf16 figure
    (:func:`peak_flops`, ``None`` for unlisted GPUs); on CPU :func:`measured_matmul_flops` at ``dtype``."""
    if configured is not None:
        return float(configured)
    if device == "cuda":
        return peak_flops(torch.cuda.get_device_name())
    return measured_matmul_flops(dtype, torch.get_num_threads())


def model_flops_utilization(num_parameters: int, tokens: int, passes: float, seconds: float, peak: float) -> float:
    """Achieved / peak FLOP/s, counting ``2 * parameters`` FLOPs per token per forward and twice that per backward:
    ``passes`` = 3 for a training pass (forward + backward), 1 for a forward only."""
    return 2.0 * num_parameters * tokens * passes / max(seconds, 1e-9) / peak


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _resident_peak_kib() -> int | None:
    """``VmHWM`` of this process (KiB), or ``None`` where ``/proc`` does not report it."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_resident_peak() -> bool:
    """Set ``VmHWM`` back to the current resident size (Linux: write 5 to ``clear_refs``); whether it worked."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def host_peak_memory_gb(reset: bool = True) -> float:
    """Peak resident memory of this process in GB: since the last reset where Linux allows resetting it (``VmHWM``,
    reset afterwards when ``reset``), else since the process started (``ru_maxrss``)."""
    peak = _resident_peak_kib()
    if peak is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    if reset:
        _reset_resident_peak()
    return peak / 1024**2


def device_memory_used_gb() -> float | None:
    """Device memory in use now as the driver sees it (every allocator and process), in GiB; ``None`` where this
    process has not used CUDA (no CUDA API is called then)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 1024**3


def memory_metrics(reset: bool = True) -> dict[str, float]:
    """Memory since the last call (``reset``) or since the start.

    - ``perf/max_host_memory_gb``: peak resident host memory of this process.
    - ``perf/max_device_memory_gb``: peak device memory torch allocated in this process (training, log-probs).
    - ``perf/max_device_memory_reserved_gb``: the same for memory torch's caching allocator held.
    - ``perf/device_memory_used_gb``: device memory in use now as the driver sees it, so including what other
      processes hold; ``perf/device_memory_total_gb`` its total. Taken after the update, while the rollout engine
      sleeps: what the engine holds awake (its weights and KV cache) is ``perf/generation_device_memory_used_gb``
      (:func:`device_memory_used_gb`, read by the worker right after it generates).

    Device entries appear only once this process has used CUDA; no CUDA API is called otherwise.
    """
    metrics = {"perf/max_host_memory_gb": host_peak_memory_gb(reset)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["perf/max_device_memory_gb"] = torch.cuda.max_memory_allocated() / 1024**3
        metrics["perf/max_device_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 1024**3
        free, total = torch.cuda.mem_get_info()
        metrics["perf/device_memory_used_gb"] = (total - free) / 1024**3
        metrics["perf/device_memory_total_gb"] = total / 1024**3
        if reset:
            torch.cuda.reset_peak_memory_stats()
    return metrics
