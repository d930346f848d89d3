"""The GPU suite: skipped as a whole where CUDA is not available, unless ``EASYR1_GPU_TESTS_ON_CPU=1`` asks to run
what can run on CPU (CUDA-only checks skip themselves). See README.md here.

With ``EASYR1_GPU_TESTS_ON_CPU=1`` Ray and vLLM are made unimportable for the session, as they are absent on the GPU
test machines: ``make test`` runs this directory so, in a pytest process of its own, and a dependency of the GPU
check on either fails here first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch


GPU_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(GPU_DIR.parent))  # tests/helpers.py
ON_CPU = os.environ.get("EASYR1_GPU_TESTS_ON_CPU") == "1"
# what the GPU test machines do not have
ABSENT_THERE = ("ray", "vllm")

if ON_CPU:
    for _name in ABSENT_THERE:
        sys.modules[_name] = None  # `import ray` now raises ImportError, as it does there


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test of this directory without CUDA (and without the CPU opt-in)."""
    if torch.cuda.is_available() or ON_CPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device (EASYR1_GPU_TESTS_ON_CPU=1 runs the CPU-runnable part)")
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
