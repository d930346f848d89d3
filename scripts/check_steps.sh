# Sourced by the image checks (check_image.sh, check_image_chroot.sh): `step NAME CMD...` runs CMD with its output
# appended to "$log", records its duration in "summary", and stops the script at the first failure with the log's
# tail and the summary so far. The caller sets log, summary=() and, for its names' width, STEP_NAME_WIDTH.

step() {
  local name=$1 start status
  shift
  start=$(date +%s)
  echo "== $name" | tee -a "$log"
  if "$@" >>"$log" 2>&1; then status=ok; else status=FAILED; fi
  summary+=("$(printf "%-${STEP_NAME_WIDTH:-34}s %5ss  %s" "$name" $(($(date +%s) - start)) "$status")")
  if [ "$status" = FAILED ]; then
    tail -n 40 "$log"
    printf '%s\n' "${summary[@]}"
    echo "failed: $name (full log: $log)"
    exit 1
  fi
}
