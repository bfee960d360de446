#!/usr/bin/env bash
# On the accelerator machine: build, run the attention tests (cuDNN and tensor-core paths vs CPU,
# dispatch, determinism; the packed-row model equivalence, whose fixture's D = 16 takes the
# CUDA-core kernels), the attention perf tables (every path;
# packed rows) and, with --bench, training steps on whole rows against packed rows (ingot bench
# --packed-doc-len). Logs go to $OUT; short tables last.
#   usage: bash tools/attn_check.sh [--bench]
set -uo pipefail
out=${OUT:-/tmp/ingot-out}
mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
grep -E "cuDNN|CUDA backend" "$out/cmake.log"
cmake --build build -j16 >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
./build/tests/ingot_cuda_tests --gtest_filter='*Attention*:CudaPackingEquivalence.*:CudaOps.BackwardIsDeterministic' >"$out/tests.log" 2>&1
echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED) |ingot: cuDNN|Failure|error" "$out/tests.log" | head -40
# worst relative error per checked quantity
grep "rel err" "$out/tests.log" | sed -E 's/ +rel err / /' | awk '{e=$NF; $NF=""; if (!(($0) in w) || e+0 > w[$0]+0) w[$0]=e} END {for (k in w) printf "  worst %-50s %s\n", k, w[k]}' | sort
INGOT_CUDA_PERF=1 timeout 300 ./build/tests/ingot_cuda_tests --gtest_filter='CudaAttention.Perf:CudaAttention.PerfPackedRows' >"$out/perf.log" 2>&1
echo "perf rc=$?"
grep -E "ingot: cuDNN|error|Failure|bitwise" "$out/perf.log" | head -20
if [ "${1:-}" = "--bench" ]; then
  for model in llama-3.2-1b qwen3-0.6b qwen2.5-0.5b; do
    for doc in 0 512 2048; do
      echo "$model packed-doc-len $doc: $(./build/ingot bench --model $model --seq 4096 --micro-batch 4 --steps 10 --warmup 3 --packed-doc-len $doc --json 2>&1 | tail -1)"
    done
  done >"$out/bench.log" 2>&1
  ./build/ingot bench --model llama-3.2-1b --seq 4096 --micro-batch 4 --steps 4 --warmup 2 --packed-doc-len 512 --profile >"$out/profile_packed.log" 2>&1
fi
echo "total: $(( $(date +%s) - t0 )) s"
sed -n '/attention perf on/,$p' "$out/perf.log"
sed -n '/packed attention on/,$p' "$out/perf.log" | grep -E "^\||packed"
[ -f "$out/bench.log" ] && sed -E 's/"(device|libraries)":.*//' "$out/bench.log" && grep -E "attention|step breakdown" "$out/profile_packed.log"
exit 0
