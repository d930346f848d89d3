#!/usr/bin/env bash
# Prove the container image's install steps where no container can start: build a fresh Debian root with
# debootstrap, copy the project in as the Dockerfile does (/opt/easyr1), run the image's install script
# (scripts/image_setup.sh, with the CPU stack since there is no GPU), then a fast slice of the tests and a 2-step
# training run inside the root. Needs root and network access to Debian's mirror and PyPI; takes several minutes
# and downloads about 3 GB. Not part of CI.
#   sudo bash scripts/check_image_chroot.sh            # ROOT=/var/tmp/easyr1-chroot/root (rebuilt from scratch)
# Every step's output goes to $ROOT.log; a summary with each step's duration is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-/var/tmp/easyr1-chroot/root}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# A directory of local wheels pip should also look in (pip's find-links), bound into the root at the same path:
# where torch's CPU build comes from on machines that keep it locally (PyPI has only CUDA builds of torch).
WHEELS=${WHEELS:-${PIP_FIND_LINKS:-}}
log="$ROOT.log"

[ "$(id -u)" = 0 ] || { echo "scripts/check_image_chroot.sh: run as root (debootstrap, mount, chroot)" >&2; exit 2; }
mkdir -p "$(dirname "$ROOT")"
: >"$log"
summary=()

STEP_NAME_WIDTH=34
# shellcheck source=scripts/check_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/check_steps.sh"

unmount_all() {
  for dir in dev sys proc "${WHEELS#/}"; do
    if mountpoint -q "$ROOT/$dir"; then umount -R "$ROOT/$dir" || umount -lR "$ROOT/$dir" || true; fi
  done
}
trap unmount_all EXIT

fresh_root() {
  unmount_all
  rm -rf "$ROOT"
  command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
  debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR"
}

copy_project() {  # the files a `docker build` context holds: tracked and untracked-but-not-ignored files
  mkdir -p "$ROOT/opt/easyr1"
  git ls-files -z --cached --others --exclude-standard |
    tar --null -T - --ignore-failed-read -cf - | tar -xf - -C "$ROOT/opt/easyr1"
}

enter_root() {
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # The host's certificate authorities, for sandboxes whose proxy re-signs TLS (pip reads PIP_CERT below).
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/host-ca-certificates.crt"
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mountpoint -q "$ROOT/sys" || mount -t sysfs sys "$ROOT/sys"
  mountpoint -q "$ROOT/dev" || mount --rbind /dev "$ROOT/dev"
  if [ -d "$WHEELS" ]; then
    mkdir -p "$ROOT$WHEELS"
    mountpoint -q "$ROOT$WHEELS" || mount --bind -o ro "$WHEELS" "$ROOT$WHEELS"
  fi
}

in_root() {  # in_root 'COMMAND': run a shell command in /opt/easyr1 inside the root with a clean environment
  chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PIP_CERT=/etc/host-ca-certificates.crt SSL_CERT_FILE=/etc/host-ca-certificates.crt \
    PIP_FIND_LINKS="$WHEELS" OMP_NUM_THREADS=1 /bin/bash -c "cd /opt/easyr1 && $1"
}

step "debootstrap $SUITE (minbase)" fresh_root
step "copy the project to /opt/easyr1" copy_project
step "mount proc, sys, dev" enter_root
step "scripts/image_setup.sh cpu" in_root "bash scripts/image_setup.sh cpu"
step "install again (stamp: no work)" in_root "bash scripts/install_cpu.sh"
step "pytest config + algorithms" in_root \
  ".venv/bin/python -m pytest tests/test_config.py tests/test_algorithms.py -q -p no:cacheprovider"
step "train 2 steps (CPU demo config)" in_root \
  ".venv/bin/python -m easyr1.main config=examples/config_cpu.yaml trainer.max_steps=2 \
   trainer.find_last_checkpoint=false trainer.save_checkpoint_path=/tmp/easyr1-check"

echo
echo "image install steps inside a fresh $SUITE root ($ROOT):"
printf '%s\n' "${summary[@]}"
grep -E "^[0-9]+ passed|passed|failed" "$log" | grep -E " in [0-9.]+s" | tail -n 1 || true
echo "root size: $(du -sh "$ROOT" --exclude=proc --exclude=sys --exclude=dev 2>/dev/null | cut -f1); log: $log"
