#!/usr/bin/env bash
# Download the wheels that tests/gpu needs and the GPU test machines lack, into .whl/ (git-ignored).
#
# Those machines (Python 3.12, torch, transformers, peft, pillow, pyyaml, pytest; no network) have neither Ray nor
# vLLM, and tests/gpu needs neither. What easyr1's imports on that path still need is pure Python and small:
#   omegaconf  (easyr1.config; its only dependency, PyYAML, is there)
# Videos (qwen-vl-utils, av) and the math rewards (mathruler) are not used by tests/gpu.
# Usage: bash scripts/gpu_test_wheels.sh   (then see tests/gpu/README.md for the command that runs the suite)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEST=${DEST:-.whl}
WHEELS=(omegaconf==2.4.0)

rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$DEST" "${WHEELS[@]}"
ls -l "$DEST"
