#!/usr/bin/env bash
# On the accelerator machine: build with CUDA, run the CUDA and CPU tests, then train the demo
# model on both backends and compare loss curves. Logs go to $OUT (or /tmp/ingot-out).
#   usage: tools/device_check.sh [STEPS]
set -uo pipefail
out=${OUT:-/tmp/ingot-out}
steps=${1:-300}
mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build -j16 >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
(cd build && ctest -L cuda --output-on-failure >"$out/ctest_cuda.log" 2>&1); echo "ctest -L cuda: $(tail -n 3 "$out/ctest_cuda.log" | head -1)"
grep -E "Failed|\*\*\*" "$out/ctest_cuda.log" | head -20
(cd build && ctest -LE cuda -j16 >"$out/ctest_cpu.log" 2>&1); echo "ctest cpu: $(grep 'tests passed' "$out/ctest_cpu.log")"
if [ -d runs/demo-data ]; then
  for dev in cuda cpu; do
    timeout 400 build/ingot train examples/demo.yaml --overwrite --set device=$dev --set max_steps=$steps \
      --set output_dir=runs/check-$dev --set logging_steps=1 --set eval_steps=0 --set save_steps=0 >"$out/train_$dev.log" 2>&1
    echo "train $dev: $(grep -c '^step' "$out/train_$dev.log") steps logged; $(tail -n 6 "$out/train_$dev.log" | grep -E '^step|error' | tail -1)"
    cp runs/check-$dev/metrics.jsonl "$out/metrics_$dev.jsonl" 2>/dev/null
  done
  python3 - "$out/metrics_cuda.jsonl" "$out/metrics_cpu.jsonl" <<'PY'
import json, sys
a=[json.loads(l)["loss"] for l in open(sys.argv[1])]; b=[json.loads(l)["loss"] for l in open(sys.argv[2])]
n=min(len(a),len(b)); k=min(100,n)
print(f"loss curves: {n} common steps; mean |cuda-cpu| over last {k}: {sum(abs(a[i]-b[i]) for i in range(n-k,n))/k:.4f}; first {a[0]:.4f}/{b[0]:.4f}; last {a[n-1]:.4f}/{b[n-1]:.4f}")
PY
fi
echo "total: $(( $(date +%s) - t0 )) s"
