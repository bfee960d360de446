#!/usr/bin/env bash
# One call on the accelerator machine for the closing measurements: build with CUDA, the CUDA tests,
# the 300-step CPU-vs-CUDA loss-curve comparison (tools/curve_check.sh), then bench/run.sh (Ingot
# vs transformers) and Llama-3.2-1B with cuDNN's non-deterministic attention backward for reference.
#   usage: tools/device_final.sh [BENCH_BUDGET_SECONDS] [bench/run.sh options...]
set -uo pipefail
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
budget=${1:-380}; shift $(( $# > 0 ? 1 : 0 ))
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >/tmp/build.log 2>&1 &&
  cmake --build build -j16 >>/tmp/build.log 2>&1 || { grep -E "error|FAILED" /tmp/build.log | head -30; exit 1; }
(cd build && ctest -L cuda --output-on-failure >"$out/ctest_cuda.log" 2>&1)
echo "ctest -L cuda: $(grep 'tests passed' "$out/ctest_cuda.log")"; grep -E "\*\*\*Failed" "$out/ctest_cuda.log"
bash tools/curve_check.sh build 300 2>&1 | grep -v "^curve check" | tee "$out/curve.txt"
echo "before bench: $(( $(date +%s) - t0 )) s"
INGOT_ATTENTION=cudnn-fast build/ingot bench --model llama-3.2-1b --steps 10 --warmup 3 --json 2>&1 | tail -1 >"$out/llama_cudnn_fast.json"
bash bench/run.sh build --budget "$budget" "$@" >"$out/bench_stdout.log" 2>&1
cat "${OUT:-/tmp/bench-out}/bench-table.md" 2>/dev/null || tail -30 "$out/bench_stdout.log"
echo "llama-3.2-1b, INGOT_ATTENTION=cudnn-fast: $(cat "$out/llama_cudnn_fast.json")"
echo "total: $(( $(date +%s) - t0 )) s"
