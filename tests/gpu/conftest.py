"""The GPU suite: skipped as a whole where CUDA is not available, unless ``EASYR1_GPU_TESTS_ON_CPU=1`` asks to run
what can run on CPU (the harness and the numerics; CUDA-only checks skip themselves). See README.md here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch


GPU_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(GPU_DIR.parent))  # tests/helpers.py
ON_CPU = os.environ.get("EASYR1_GPU_TESTS_ON_CPU") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test of this directory without CUDA (and without the CPU opt-in)."""
    if torch.cuda.is_available() or ON_CPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device (EASYR1_GPU_TESTS_ON_CPU=1 runs the CPU-runnable part)")
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
