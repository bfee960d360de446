#!/usr/bin/env bash
# CPU training when the cores are shared: the demo model for STEPS steps, alone (three runs) and
# two runs at once, under OpenMP's default wait policy, OMP_WAIT_POLICY=passive and
# GOMP_SPINCOUNT=1000. Wall seconds; needs the demo data (`make demo` prepares runs/demo-data).
#   usage: tools/cpu_contention.sh [BUILD_DIR] [STEPS]     (from anywhere; paths are the repo's)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
steps=${2:-100}
[ -x "$build/ingot" ] || { echo "cpu_contention: no $build/ingot (build first)" >&2; exit 1; }
[ -d runs/demo-data ] || { echo "cpu_contention: runs/demo-data is missing (run make demo first)" >&2; exit 1; }
scratch=$(mktemp -d)
background=""
# A background job of a script ignores SIGINT, and ingot keeps it ignored: stop it here.
trap '[ -n "$background" ] && kill "$background" 2>/dev/null; wait 2>/dev/null; rm -rf "$scratch"' EXIT

# since START: seconds from START (date +%s.%N) to now, to a tenth.
since() { echo "$1 $(date +%s.%N)" | awk '{printf "%.1f", $2 - $1}'; }

# run NAME [VAR=VALUE]: one training run; prints its wall seconds, or its log's end and fails.
# The wait-policy variables of the caller's environment are dropped, so each row is what it says.
run() {
  local name=$1; shift
  local start
  start=$(date +%s.%N)
  if ! env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS "$@" "$build/ingot" train examples/demo.yaml \
      --set max_steps="$steps" --set eval_steps=100000 --set save_steps=100000 --set output_dir="$scratch/$name" \
      >"$scratch/$name.log" 2>&1; then
    echo "cpu_contention: run $name ($*) failed:" >&2
    tail -5 "$scratch/$name.log" >&2
    return 1
  fi
  since "$start"
}

echo "demo model, $steps steps, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
printf "%-26s %-22s %s\n" "wait policy" "alone (3 runs), s" "two at once, s (both done)"
for setting in "DEFAULT=1" "OMP_WAIT_POLICY=passive" "GOMP_SPINCOUNT=1000"; do
  tag=${setting//[=_]/}
  alone=""
  for i in 1 2 3; do
    seconds=$(run "$tag$i" "$setting")
    alone+="$seconds "
  done
  start=$(date +%s.%N)
  run "${tag}a" "$setting" >/dev/null &
  background=$!
  run "${tag}b" "$setting" >/dev/null
  wait "$background"
  background=""
  both=$(since "$start")
  label=$setting; [ "$setting" = "DEFAULT=1" ] && label="default (unset)"
  printf "%-26s %-22s %s\n" "$label" "$alone" "$both"
done
