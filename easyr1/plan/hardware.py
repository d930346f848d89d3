"""The device a plan is made for: its memory, its peak FLOP/s, and the host memory of the machine.

GPUs are known by name (:data:`GPU_MEMORY_GIB`, peak FLOP/s from :data:`easyr1.logging.perf.PEAK_BF16_FLOPS`), so a
plan can be made for any GPU on any machine. A CPU "device" is the host itself: its memory is the RAM Linux reports
available, its peak a stated figure (:data:`CPU_PEAK_FLOPS`) unless ``trainer.peak_flops_per_device`` says
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from easyr1.errors import ConfigError
from easyr1.logging.perf import PEAK_BF16_FLOPS


GIB = 2**30

# Memory torch reports as total_memory (GiB: what the data sheet's "80GB" leaves usable), per GPU name accepted by
# --gpu; the peak FLOP/s key in PEAK_BF16_FLOPS is the same name unless given.
GPU_MEMORY_GIB: dict[str, tuple[float, str]] = {
    "H100": (79.2, "H100"),
    "H100-NVL": (93.1, "H100 NVL"),
    "H100-PCIE": (79.2, "H100 PCIe"),
    "H800": (79.2, "H800"),
    "H200": (139.8, "H200"),
    "H20": (95.0, "H20"),
    "B200": (178.4, "B200"),
    "A100": (79.2, "A100"),
    "A100-40GB": (39.4, "A100"),
    "A800": (79.2, "A800"),
    "A40": (44.4, "A40"),
    "A10": (22.1, "A10"),
    "L40S": (44.4, "L40S"),
    "L40": (44.4, "L40"),
    "L20": (44.4, "L20"),
    "L4": (22.0, "L4"),
    "4090": (23.6, "4090"),
    "MI300X": (191.5, "MI300X"),
}

# One CPU worker process (one thread, as the CPU runs use) on an AVX-512 core: fp32 512-square matmuls measured at
# 60-110 GFLOP/s on the 2-core machines this project runs on (easyr1.logging.perf.measured_matmul_flops); a stated
# round figure keeps plans reproducible. trainer.peak_flops_per_device replaces it.
CPU_PEAK_FLOPS = 1.0e11

# Host RAM a GPU plan assumes per node when it cannot look (planning for another machine): a common 8-GPU node.
DEFAULT_GPU_NODE_HOST_GIB = 1024.0


@dataclass(frozen=True)
class Device:
    """Where the workers run: ``kind`` ``cuda`` or ``cpu``; ``memory_bytes`` per device (on CPU: the host's
    available RAM, shared by the node's workers); ``peak_flops`` per device; ``host_bytes`` per node."""

    name: str
    kind: str
    memory_bytes: int
    peak_flops: float
    host_bytes: int

    @property
    def on_gpu(self) -> bool:
        """Whether the device is a GPU (the rollout engine then sleeps during the update)."""
        return self.kind == "cuda"


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def host_available_bytes() -> int:
    """RAM available for new work on this machine (``MemAvailable``; 16 GiB where ``/proc`` does not say)."""
    return _meminfo("MemAvailable") or 16 * GIB


def gpu_device(name: str, peak_flops: float | None = None, host_bytes: int | None = None) -> Device:
    """The GPU called ``name`` (any case; see :data:`GPU_MEMORY_GIB`), or a ``ConfigError`` listing the known ones."""
    key = name.upper().replace(" ", "-")
    if key not in GPU_MEMORY_GIB:
        known = ", ".join(GPU_MEMORY_GIB)
        raise ConfigError(f"--gpu {name!r}: unknown GPU; use one of {known}, or set trainer.peak_flops_per_device")
    memory_gib, flops_key = GPU_MEMORY_GIB[key]
    return Device(
        name=key,
        kind="cuda",
        memory_bytes=int(memory_gib * GIB),
        peak_flops=peak_flops or PEAK_BF16_FLOPS[flops_key],
        host_bytes=host_bytes or int(DEFAULT_GPU_NODE_HOST_GIB * GIB),
    )


def cpu_device(peak_flops: float | None = None) -> Device:
    """This machine as a CPU device: memory is the RAM available now, shared by every worker and the driver."""
    available = host_available_bytes()
    return Device(
        name="cpu", kind="cpu", memory_bytes=available, peak_flops=peak_flops or CPU_PEAK_FLOPS, host_bytes=available
    )


def local_cuda_device(peak_flops: float | None = None) -> Device | None:
    """The first visible GPU of this process as a device (its real memory and name), or ``None`` without one."""
    import torch

    from easyr1.logging.perf import peak_flops as data_sheet_flops

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    flops = peak_flops or data_sheet_flops(properties.name) or PEAK_BF16_FLOPS["H100"]
    host = _meminfo("MemTotal") or int(DEFAULT_GPU_NODE_HOST_GIB * GIB)
    return Device(
        name=properties.name, kind="cuda", memory_bytes=properties.total_memory, peak_flops=flops, host_bytes=host
    )
