#!/usr/bin/env bash
# The install steps of the container image, run from the repository root as root on a fresh Debian or Ubuntu:
#   bash scripts/image_setup.sh gpu   # the Dockerfile's default (CUDA base image, Ubuntu 24.04, Python 3.12)
#   bash scripts/image_setup.sh cpu   # the CPU twin (STACK=cpu: scripts/check_image.sh, check_image_chroot.sh)
# System packages first, then the Python stack into $VENV (default /opt/easyr1/.venv) through the same install
# script a user runs by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/image_setup.sh gpu|cpu}
case "$kind" in
  gpu | cpu) ;;
  *) echo "scripts/image_setup.sh: unknown stack '$kind' (use gpu or cpu)" >&2 && exit 2 ;;
esac
export VENV=${VENV:-/opt/easyr1/.venv}
# The Dockerfile runs this before it copies the code, so that a code change keeps the dependency layer; the editable
# install only needs the package's directory to exist (it records the path), and `COPY . .` then fills it.
if [ ! -e easyr1/__init__.py ]; then
  mkdir -p easyr1
  : >easyr1/__init__.py
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# python3-dev and build-essential: Triton and flashinfer compile small launchers and kernels at run time;
# git: pip and the hub client use it; libnuma1: vLLM's CPU backend loads it.
apt-get install -y -q --no-install-recommends \
  python3 python3-venv python3-dev build-essential git ca-certificates libnuma1
rm -rf /var/lib/apt/lists/*

bash "scripts/install_$kind.sh"
# pip's download cache is of no use inside an image.
rm -rf /root/.cache/pip
