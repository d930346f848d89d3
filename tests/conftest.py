"""Shared fixtures: tiny models and the shape dataset, built once per test session into a temporary folder.

- ``tiny_model_dir(family)``: factory returning the directory of a tiny ``qwen2_vl`` / ``qwen2_5_vl`` /
  ``qwen3_vl`` model (seed 0), built on first request and reused afterwards.
- ``tiny_qwen2_5_vl_dir``: the Qwen2.5-VL one.
- ``tiny_dataset_dir``: the shape dataset with 64 training and 16 validation rows of 56x56 images.
- ``process_group``: a one-rank gloo process group for the duration of a test.
- ``validated_run``: one finished 3-step run with validation and kept rollouts (the CLI in this process, Ray, vLLM).
- ``rank_environment``: puts back what a worker run in this process sets (rank environment, torch threads).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


# Tests run on a 2-core machine; more threads than cores only makes timings noisy.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# `make test-fast` sets this: the tier that starts neither Ray nor a vLLM engine nor a training subprocess. Doing one
# of those in it fails the test with what marker it lacks (ray, vllm or e2e), so the markers stay true.
FAST_TIER = os.environ.get("EASYR1_TEST_TIER") == "fast"


def refuse(what: str, marker: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"{what} in the fast tier: mark the test `{marker}` (pyproject.toml's markers)")

    return refused


class _RefuseVllmEngines(importlib.abc.MetaPathFinder):
    """Once vLLM is imported, building an engine (``vllm.LLM``) fails the test (fast tier only)."""

    def find_spec(self, name, path, target=None):
        if name != "vllm" or "vllm" in sys.modules:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("vllm")
        loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                module.LLM.__init__ = refuse("a vLLM engine was built", "vllm")

        spec.loader = Loader()
        return spec


if FAST_TIER:
    import ray

    ray.init = refuse("Ray was started", "ray")
    sys.meta_path.insert(0, _RefuseVllmEngines())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``tiny_model_dir("qwen3_vl")`` -> path of a tiny model of that family (cached per session)."""
    from easyr1.tools.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[str, Path] = {}

    def get(family: str = "qwen2_5_vl") -> Path:
        if family not in built:
            built[family] = build_tiny_model(root / family, family=family, seed=0)
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(tiny_model_dir: Callable[[str], Path]) -> Path:
    """Directory of the tiny Qwen2.5-VL model (seed 0)."""
    return tiny_model_dir("qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with ``train.jsonl`` (64 rows), ``val.jsonl`` (16 rows) and ``images/`` of the shape task."""
    from easyr1.tools.tiny_dataset import build_shape_dataset

    return build_shape_dataset(tmp_path_factory.mktemp("shapes"), num_train=64, num_val=16, seed=0)


# What a worker sets in its process (distributed/worker.py: Worker.init_distributed).
RANK_ENVIRONMENT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "GLOO_SOCKET_IFNAME",  # one node: the group's sockets on loopback (worker.bind_to_loopback)
    "NCCL_SOCKET_IFNAME",
)


@pytest.fixture
def rank_environment(monkeypatch):
    """For a test that runs a worker in this process (``trainer.single_process``, ``LocalWorkerGroup``): the rank
    environment the worker sets (RANK, MASTER_PORT, OMP_NUM_THREADS, ...) and torch's thread count are put back
    afterwards."""
    import torch

    threads = torch.get_num_threads()
    for key in RANK_ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def process_group():
    """A one-rank gloo process group for tests of sharded models in this process (destroyed afterwards)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    if dist.is_initialized():  # a test may have handed the rank to vLLM, whose teardown removed the group
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def validated_run(tiny_qwen2_5_vl_dir: Path, tiny_dataset_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One finished 3-step CLI run on 2 Ray workers with validation (before training, every 2 steps, after the last)
    and two prompts' rollouts kept: ``(run_dir, Run)``, shared by the validation, report and balancing tests."""
    from helpers import train, validated_run_args

    run_dir = tmp_path_factory.mktemp("validated_run") / "run"
    result = train(validated_run_args(tiny_qwen2_5_vl_dir, tiny_dataset_dir, run_dir))
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir, result
