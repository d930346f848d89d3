# shellcheck shell=bash
# Shared by scripts/install_cpu.sh and scripts/install_gpu.sh (sourced, not run): the virtualenv, the quiet pip
# steps with a log, and the stamp that makes a second run only re-check the imports.
# The caller sets VENV and PYTHON (defaults below) and then calls begin_install / finish_install.

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

# begin_install NAME FILE...: create the venv if needed; return 0 when the stack must be (re)installed, that is
# when the hash of FILE... (the pins and the install steps) differs from the one stored after the last success.
begin_install() {
  local name=$1
  shift
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC2034  # used by the scripts that source this file
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  stamp="$VENV/.easyr1-installed"
  log="$VENV/install.log"
  want=$(cat "$@" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 1
  echo "installing the $name stack into $VENV (a few minutes the first time; log: $log)"
  : >"$log"
  return 0
}

# quietly CMD...: run an install step, keep its output in the log, show the log's end only if the step fails.
quietly() {
  "$@" >>"$log" 2>&1 || {
    tail -n 60 "$log"
    echo "install failed: $* (full log: $log)"
    exit 1
  }
}

# refuse_other_stack DIST OTHER_SCRIPT: stop when the venv already holds the other stack (its vLLM distribution
# DIST): pip would keep that stack's torch (2.13.0 and 2.13.0+cpu both satisfy torch==2.13.0) beside a second vLLM.
refuse_other_stack() {
  if "$VENV/bin/python" -m pip show -q "$1" >/dev/null 2>&1; then
    echo "$VENV holds the other stack ($1, from scripts/$2); install into another venv" \
      "(VENV=/path/to/venv bash $0) or delete $VENV first" >&2
    exit 2
  fi
}

# finish_install: record that the stack installed with the current pins (called after the import check passed).
finish_install() {
  echo "$want" >"$stamp"
}
