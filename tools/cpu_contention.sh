#!/usr/bin/env bash
# CPU training when the cores are shared: the demo model for STEPS steps, alone (three runs) and
# two runs at once, under OpenMP's default wait policy, OMP_WAIT_POLICY=passive and
# GOMP_SPINCOUNT=1000. Wall seconds; needs the demo data (`make demo` prepares runs/demo-data).
#   usage: tools/cpu_contention.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-100}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
[ -d runs/demo-data ] || { echo "cpu_contention: runs/demo-data is missing (run make demo first)" >&2; exit 1; }

# run NAME [VAR=VALUE]: wall seconds of one training run.
run() {
  local name=$1; shift
  local start end
  start=$(date +%s.%N)
  env "$@" "$build/ingot" train examples/demo.yaml --set max_steps="$steps" --set eval_steps=100000 \
    --set save_steps=100000 --set output_dir="$scratch/$name" >"$scratch/$name.log" 2>&1
  end=$(date +%s.%N)
  echo "$start $end" | awk '{printf "%.1f", $2 - $1}'
}

echo "demo model, $steps steps, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
printf "%-26s %-22s %s\n" "wait policy" "alone (3 runs), s" "two at once, s (both done)"
for setting in "DEFAULT=1" "OMP_WAIT_POLICY=passive" "GOMP_SPINCOUNT=1000"; do
  tag=${setting//[=_]/}
  alone="$(run "${tag}1" "$setting") $(run "${tag}2" "$setting") $(run "${tag}3" "$setting")"
  start=$(date +%s.%N)
  run "${tag}a" "$setting" >/dev/null &
  run "${tag}b" "$setting" >/dev/null
  wait
  both=$(echo "$start $(date +%s.%N)" | awk '{printf "%.1f", $2 - $1}')
  label=$setting; [ "$setting" = "DEFAULT=1" ] && label="default (unset)"
  printf "%-26s %-22s %s\n" "$label" "$alone" "$both"
done
