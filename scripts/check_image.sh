#!/usr/bin/env bash
# Build the image's CPU twin from the project's Dockerfile and train in it, on a machine without a GPU or an image
# registry (not part of CI: a cold build downloads about 1.5 GB and takes minutes).
#   sudo bash scripts/check_image.sh          # or: make check-image
# 1. dockerd: the running one, or one started here (and stopped at the end).
# 2. The base: a Debian root made with debootstrap and imported as $BASE, when the daemon does not have it.
# 3. The twin: `docker build --build-arg BASE_IMAGE=$BASE --build-arg STACK=cpu` of the Dockerfile. torch 2.13.0+cpu
#    is not on PyPI (its torch is the CUDA build): the build gets it from $WHEELS, a local wheel directory served to
#    the build over HTTP on loopback (nothing is copied into a layer), or from $CPU_INDEX, a CPU wheel index.
# 4. In the image, as its non-root user, with a read-only root filesystem, /tmp and the home on tmpfs, a 2 GB /dev/shm
#    (Ray's object store, vLLM) and a work directory from the host mounted for what runs write (checkpoints/) and
#    cache (.cache/: the demo's model and data, bytecode): a test module, the CPU demo (`make demo`'s settings and
#    bar), then a second container that resumes the demo's run from its checkpoint in the mounted directory and trains
#    two more steps; last, two training steps as a uid the image does not know (--user, as Apptainer runs images).
# Ends with: image: reward_first=<x> reward_last=<y> seconds=<demo, in the container> size_gb=<g> build_seconds=<s>
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-easyr1:cpu}
BASE=${BASE:-easyr1-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORK=${WORK:-/var/tmp/easyr1-image}
WHEELS=${WHEELS:-${PIP_FIND_LINKS:-}}
WHEELS_PORT=${WHEELS_PORT:-8765}
CPU_INDEX=${CPU_INDEX:-}
TESTS=${TESTS:-tests/test_config.py}
mkdir -p "$WORK"
log="$WORK/check_image.log"
: >"$log"
summary=()
dockerd_pid=""
server_pid=""
base_root=""

STEP_NAME_WIDTH=44
# shellcheck source=scripts/check_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/check_steps.sh"

cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  if [ -n "$base_root" ]; then  # an interrupted debootstrap: what it mounted in the root, then the root
    for dir in dev/pts dev proc sys; do
      if mountpoint -q "$base_root/$dir"; then umount -l "$base_root/$dir" || true; fi
    done
    rm -rf "$base_root"
  fi
  if [ -n "$dockerd_pid" ]; then
    kill "$dockerd_pid" 2>/dev/null || true
    wait "$dockerd_pid" 2>/dev/null || true
    echo "stopped the dockerd started here"
  fi
}
trap cleanup EXIT

start_dockerd() {
  if docker info >/dev/null 2>&1; then
    echo "using the running dockerd"
  else
    command -v dockerd >/dev/null || { apt-get update -q && apt-get install -y -q docker.io; }
    dockerd >"$WORK/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  local driver
  driver=$(docker info --format '{{.Driver}}')
  echo "storage driver: $driver"
  # vfs copies every layer in full: the twin's layers would need several times the image's size on disk.
  [ "$driver" != vfs ] || { echo "dockerd uses vfs; start it with --storage-driver=overlay2" && return 1; }
}

make_base() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "$BASE is there"
    return 0
  fi
  command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
  local root
  root=$(mktemp -d /var/tmp/easyr1-base.XXXXXX)
  base_root=$root
  debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR"
  # The host's own certificate authorities (a proxy that re-signs TLS): the ca-certificates package, which
  # image_setup.sh installs, adds them to the system bundle, and pip is pointed at that bundle.
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar --numeric-owner -C "$root" -c . |
    docker import --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["bash"]' - "$BASE"
  rm -rf "$root"
  base_root=""
}

serve_wheels() {  # serve $WHEELS on loopback for the build (which runs on the host's network)
  [ -d "$WHEELS" ] || { echo "WHEELS=$WHEELS is not a directory"; return 1; }
  python3 -m http.server "$WHEELS_PORT" --bind 127.0.0.1 --directory "$WHEELS" >>"$WORK/wheels_server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 30); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$WHEELS_PORT/')" 2>/dev/null && break
    sleep 0.5
  done
  ls "$WHEELS"
}

build_seconds=0
build() {
  local start old args
  old=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  args=(--network=host --build-arg "BASE_IMAGE=$BASE" --build-arg STACK=cpu -t "$IMAGE")
  if [ -n "$WHEELS" ]; then args+=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$WHEELS_PORT/"); fi
  if [ -n "$CPU_INDEX" ]; then args+=(--build-arg "PIP_EXTRA_INDEX_URL=$CPU_INDEX"); fi
  start=$(date +%s)
  docker build "${args[@]}" . | tee "$WORK/build.log"
  build_seconds=$(($(date +%s) - start))
  # the image this build replaced, when nothing else uses it (its shared layers stay)
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    docker rmi "$old" 2>/dev/null || true
  fi
}

# The cluster-style run: read-only root; /tmp and the home on tmpfs, with exec (torch's inductor, which vLLM's CPU
# backend uses, loads the kernels it compiles from /tmp) and the home owned by the image's user (a tmpfs over an
# existing directory is root's 755 otherwise); shared memory; the work directory mounted.
owner=""
in_image() {
  docker run --rm --read-only --tmpfs /tmp:exec --tmpfs "/home/easyr1:exec,uid=${owner%:*},gid=${owner#*:}" \
    --shm-size=2g -e OMP_NUM_THREADS=1 \
    -v "$WORK/checkpoints:/opt/easyr1/checkpoints" -v "$WORK/cache:/opt/easyr1/.cache" "$IMAGE" "$@"
}

prepare_work() {  # a fresh checkpoints/ (the demo trains from scratch), the cache kept; owned by the image's user
  owner="$(docker run --rm "$IMAGE" id -u):$(docker run --rm "$IMAGE" id -g)"
  rm -rf "$WORK/checkpoints"
  mkdir -p "$WORK/checkpoints" "$WORK/cache"
  chown "$owner" "$WORK/checkpoints" "$WORK/cache"
  echo "work directory $WORK owned by the image's user ($owner)"
}

demo() {
  in_image python -m easyr1.tools.demo | tee "$WORK/demo.log"
  grep -q "^demo: " "$WORK/demo.log"
}

resume() {  # a second container: the demo's run, continued from its step-400 checkpoint for two more steps
  in_image python -m easyr1.tools.demo trainer.find_last_checkpoint=true trainer.max_steps=402 |
    tee "$WORK/resume.log"
  grep -q "easyr1: resumed from .*global_step_400" "$WORK/resume.log"
  ls -d "$WORK"/checkpoints/*/*/global_step_402
}

# As a user the image does not know (`docker run --user "$(id -u):$(id -g)"` on a cluster, and how Apptainer runs any
# image: the caller's uid, a read-only root, the caller's home): the command of scripts/easyr1.def's %runscript, two
# steps, in directories of that user's. It makes its own demo model and data: the demo's model file is written
# readable by its owner only, so the first user's cache is of no use to it.
as_other_user() {
  local other=4242:4242 dir="$WORK/other-user"
  rm -rf "$dir"
  mkdir -p "$dir/home" "$dir/checkpoints" "$dir/cache"
  chown -R "$other" "$dir"
  docker run --rm --read-only --user "$other" -e HOME=/home/other --tmpfs /tmp:exec --shm-size=2g \
    -e OMP_NUM_THREADS=1 -v "$dir/home:/home/other" -v "$dir/checkpoints:/opt/easyr1/checkpoints" \
    -v "$dir/cache:/opt/easyr1/.cache" "$IMAGE" bash -c "
      python -c 'from easyr1.tools.demo_assets import ensure_demo_assets; ensure_demo_assets()' &&
      python -m easyr1.main config=examples/config_cpu.yaml trainer.max_steps=2 trainer.find_last_checkpoint=false"
  ls -d "$dir"/checkpoints/*/*/global_step_2
}

[ "$(id -u)" = 0 ] || { echo "scripts/check_image.sh: run as root (dockerd, debootstrap)" >&2; exit 2; }
step "dockerd" start_dockerd
step "base image $BASE (debootstrap $SUITE)" make_base
if [ -n "$WHEELS" ]; then step "serve $WHEELS to the build" serve_wheels; fi
step "docker build (STACK=cpu) -> $IMAGE" build
if grep -A1 "RUN bash scripts/image_setup.sh" "$WORK/build.log" | grep -qi "cache"; then
  layer="dependency layer reused from the build cache"
else
  layer="dependency layer built"
fi
step "work directory" prepare_work
step "pytest $TESTS (read-only root)" in_image python -m pytest "$TESTS" -q -p no:cacheprovider
step "demo (read-only root, mounted work dir)" demo
step "resume in a second container" resume
step "another uid (--user; Apptainer's way)" as_other_user

demo_line='^demo: reward_first=([0-9.]+) reward_last=([0-9.]+) .*seconds=([0-9]+).*'
read -r first last seconds < <(sed -nE "s/$demo_line/\\1 \\2 \\3/p" "$WORK/demo.log" | tail -n 1)
size_gb=$(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.2f", $1 / 1e9}')
echo
echo "the CPU twin of the image ($IMAGE from $BASE; $layer):"
printf '%s\n' "${summary[@]}"
grep -E "passed|failed" "$log" | grep -E " in [0-9.]+s" | tail -n 1 || true
grep -h "easyr1: resumed from" "$WORK/resume.log" || true
grep -h "^demo: " "$WORK/resume.log" | sed 's/^/after resuming: /' || true
echo "log: $log"
# make demo's bar: the reward ends at 0.6 or more and rises by 0.3 or more
awk -v first="$first" -v last="$last" 'BEGIN { exit !(last >= 0.6 && last - first >= 0.3) }' ||
  { echo "the demo missed make demo's bar (reward_last >= 0.6, rise >= 0.3)"; status=1; }
echo "image: reward_first=$first reward_last=$last seconds=$seconds size_gb=$size_gb build_seconds=$build_seconds"
exit "${status:-0}"
