#!/usr/bin/env bash
# What cuDNN's deterministic attention backward really asks for, beside what the memory plan charges
# it: for Llama-3.2-1B's and Qwen3-0.6B's heads at a few lengths and INGOT_ATTENTION_WORKSPACE_MIB
# caps, one bench step each with INGOT_ATTENTION_REPORT=1, keeping the plan's workspace lines, the
# memory plan's note and the bench's "memory ... (planned ...)" line. Needs a CUDA build and a GPU.
# Usage: tools/cudnn_workspace_probe.sh BUILD_DIR
set -u
build=${1:?usage: tools/cudnn_workspace_probe.sh BUILD_DIR}
probe() {  # model seq micro_batch cap_mib ("" for none)
  echo "== $1 seq $2 x micro-batch $3, INGOT_ATTENTION_WORKSPACE_MIB=${4:-unset}"
  env ${4:+INGOT_ATTENTION_WORKSPACE_MIB=$4} INGOT_ATTENTION_REPORT=1 \
    "$build/ingot" bench --model "$1" --seq "$2" --micro-batch "$3" --steps 1 --warmup 1 2>&1 |
    grep -E '^\[cudnn\] .*: workspace|^note:|memory |error' | sed 's/^/  /'
}
probe llama-3.2-1b 4096 4 ""
probe llama-3.2-1b 4096 4 1024
probe llama-3.2-1b 4096 4 256
probe llama-3.2-1b 32768 2 ""
probe llama-3.2-1b 32768 2 8192
probe qwen3-0.6b 4096 4 ""
probe qwen3-0.6b 4096 4 256
