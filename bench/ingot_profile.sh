#!/usr/bin/env bash
# On the accelerator machine: build Ingot with CUDA, then `ingot bench --profile` at the issue's
# shapes (seq 4096 x micro-batch 4) for the three small presets. Logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
cmake -S . -B build -G Ninja -DINGOT_CUDA=ON -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr >"$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build -j16 --target ingot >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
for model in ${MODELS:-llama-3.2-1b qwen3-0.6b qwen2.5-0.5b}; do
  build/ingot bench --model "$model" --seq ${SEQ:-4096} --micro-batch ${MB:-4} --steps ${STEPS:-10} --warmup 2 --profile \
    >"$out/profile_$model.log" 2>&1
  tail -n 2 "$out/profile_$model.log" | head -1; grep -E "^median|error" "$out/profile_$model.log"
done
for model in ${MODELS:-llama-3.2-1b qwen3-0.6b qwen2.5-0.5b}; do echo "== $model"; grep -A12 "^op " "$out/profile_$model.log"; done
