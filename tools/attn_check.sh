#!/usr/bin/env bash
# On the accelerator machine: build the CUDA tests, run the attention tests (cuDNN path vs CPU,
# dispatch, determinism) and the attention perf table (both paths). Logs go to $OUT.
#   usage: bash tools/attn_check.sh
set -uo pipefail
out=${OUT:-/tmp/ingot-out}
mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
grep -E "cuDNN|CUDA backend" "$out/cmake.log"
ls /usr/include/x86_64-linux-gnu/ | grep -i cudnn | head -3
cmake --build build -j16 --target ingot_cuda_tests >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG="$out/cudnn_err.log"
./build/tests/ingot_cuda_tests --gtest_filter='*Attention*' >"$out/tests.log" 2>&1
echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED|  OK|SKIPPED) |bitwise|ingot: cuDNN|Failure|error" "$out/tests.log" | head -40
# worst relative error per checked quantity
grep "rel err" "$out/tests.log" | sed -E 's/ +rel err / /' | awk '{e=$NF; $NF=""; if (!(($0) in w) || e+0 > w[$0]+0) w[$0]=e} END {for (k in w) printf "  worst %-50s %s\n", k, w[k]}' | sort
head -c 1500 "$out/cudnn_err.log" 2>/dev/null
INGOT_CUDA_PERF=1 timeout 200 ./build/tests/ingot_cuda_tests --gtest_filter='CudaAttention.Perf' >"$out/perf.log" 2>&1
echo "perf rc=$?"
grep -E "ingot: cuDNN|error|Failure|bitwise" "$out/perf.log" | head -20
echo "total: $(( $(date +%s) - t0 )) s"
sed -n '/attention perf on/,$p' "$out/perf.log"
