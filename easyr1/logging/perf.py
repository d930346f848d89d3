"""Hardware numbers for the metrics: peak memory of a process, and model FLOPs utilisation where the device's
peak throughput is known."""

from __future__ import annotations

import resource

import torch


# Dense bf16 peak FLOP/s of common training GPUs (by a substring of torch.cuda.get_device_name()).
PEAK_BF16_FLOPS = {
    "H100": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "4090": 165e12,
}


def peak_flops(device_name: str) -> float | None:
    """The device's peak bf16 FLOP/s, or ``None`` when unknown (CPUs, unlisted GPUs)."""
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return flops
    return None


def model_flops_utilization(num_parameters: int, tokens: int, passes: float, seconds: float, peak: float) -> float:
    """Achieved / peak FLOP/s, counting ``2 * parameters`` FLOPs per token per forward and twice that per backward:
    ``passes`` = 3 for a training pass (forward + backward), 1 for a forward only."""
    return 2.0 * num_parameters * tokens * passes / max(seconds, 1e-9) / peak


def memory_metrics() -> dict[str, float]:
    """Peak resident memory of this process (GB), and the peak allocated device memory on GPU."""
    metrics = {"perf/max_host_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["perf/max_device_memory_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    return metrics
