#!/usr/bin/env bash
# One call on the accelerator machine for the closing measurements: build with CUDA, the CUDA tests,
# the 300-step CPU-vs-CUDA loss-curve comparison, then bench/run.sh (Ingot vs transformers).
#   usage: tools/device_final.sh [BENCH_BUDGET_SECONDS]
set -uo pipefail
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
budget=${1:-380}
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >/tmp/build.log 2>&1 &&
  cmake --build build -j16 >>/tmp/build.log 2>&1 || { grep -E "error|FAILED" /tmp/build.log | head -30; exit 1; }
(cd build && ctest -L cuda --output-on-failure >"$out/ctest_cuda.log" 2>&1)
echo "ctest -L cuda: $(grep 'tests passed' "$out/ctest_cuda.log")"; grep -E "\*\*\*Failed" "$out/ctest_cuda.log"
if [ -d runs/demo-data ]; then
  for dev in cuda cpu; do
    build/ingot train examples/demo.yaml --overwrite --set device=$dev --set output_dir=runs/check-$dev --set max_steps=300 \
      --set logging_steps=1 --set eval_steps=0 --set save_steps=0 --set num_threads=16 >/tmp/train_$dev.log 2>&1
    cp runs/check-$dev/metrics.jsonl "$out/metrics_$dev.jsonl" 2>/dev/null
  done
  build/ingot train examples/demo.yaml --overwrite --set device=cuda --set output_dir=runs/check-cuda2 --set max_steps=300 \
    --set logging_steps=1 --set eval_steps=0 --set save_steps=0 >/dev/null 2>&1
  cmp -s runs/check-cuda/checkpoint-300/model.safetensors runs/check-cuda2/checkpoint-300/model.safetensors \
    && echo "cuda run twice: identical weights" || echo "cuda run twice: weights DIFFER"
  python3 - "$out/metrics_cuda.jsonl" "$out/metrics_cpu.jsonl" <<'PY'
import json, sys
a=[json.loads(l)["loss"] for l in open(sys.argv[1])]; b=[json.loads(l)["loss"] for l in open(sys.argv[2])]
n=min(len(a),len(b)); k=min(100,n)
print(f"demo loss curves cuda vs cpu: {n} steps; mean |diff| over last {k}: {sum(abs(a[i]-b[i]) for i in range(n-k,n))/k:.4f}; final {a[n-1]:.4f} / {b[n-1]:.4f}")
PY
fi
echo "before bench: $(( $(date +%s) - t0 )) s"
bash bench/run.sh build --budget "$budget" >"$out/bench_stdout.log" 2>&1
cat "${OUT:-/tmp/bench-out}/bench-table.md" 2>/dev/null || tail -30 "$out/bench_stdout.log"
echo "total: $(( $(date +%s) - t0 )) s"
