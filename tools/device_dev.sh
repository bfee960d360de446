#!/usr/bin/env bash
# A development pass on the accelerator machine: CUDA build, `ctest -L cuda`, the demo loss-curve
# check, and quick `ingot bench` rows (graph replay on and off; the cuDNN the build found against
# the one PyTorch ships, when there is one). Short table last.
#   usage: tools/device_dev.sh
set -uo pipefail
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >"$out/cmake.log" 2>&1 &&
  cmake --build build -j16 >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s; $(grep 'cuDNN:' "$out/cmake.log")"
(cd build && ctest -L cuda --output-on-failure >"$out/ctest_cuda.log" 2>&1)
echo "ctest -L cuda: $(grep 'tests passed' "$out/ctest_cuda.log")"; grep -E "\*\*\*Failed|Failure|Expected" "$out/ctest_cuda.log" | head -20
bash tools/curve_check.sh build 300 2>&1 | tee "$out/curve.txt"
bench() { build/ingot bench --steps 8 --warmup 3 --json "$@" 2>&1 | tail -1; }
{
  echo "llama-3.2-1b graph:    $(bench --model llama-3.2-1b)"
  echo "llama-3.2-1b no graph: $(bench --model llama-3.2-1b --no-cuda-graph)"
  echo "llama-3.2-1b recompute block: $(bench --model llama-3.2-1b --recompute block)"
  echo "qwen2.5-0.5b graph:    $(bench --model qwen2.5-0.5b)"
  torch_cudnn=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
  echo "system cuDNN: $(ls /usr/lib/x86_64-linux-gnu/libcudnn.so.* 2>/dev/null | tr '\n' ' ')"
  echo "torch cuDNN: $torch_cudnn $(ls $torch_cudnn 2>/dev/null | grep -m1 'libcudnn.so') $(python3 -c 'import torch; print(torch.backends.cudnn.version())' 2>/dev/null)"
  if [ -n "$torch_cudnn" ]; then
    echo "llama-3.2-1b torch cuDNN: $(LD_LIBRARY_PATH=$torch_cudnn bench --model llama-3.2-1b)"
    echo "qwen2.5-0.5b torch cuDNN: $(LD_LIBRARY_PATH=$torch_cudnn bench --model qwen2.5-0.5b)"
  fi
} 2>&1 | tee "$out/bench_dev.txt"
echo "total: $(( $(date +%s) - t0 )) s"
