#!/usr/bin/env bash
# The demo model trained on the fortunes shards (runs/demo-data) on the CPU reference (fp32) and on
# CUDA (bf16 twice; bf16 with the CUDA-core attention kernels, which keep the softmax
# probabilities in f32 where cuDNN rounds them to bf16; fp32), then the loss curves compared:
# mean |cuda - cpu| over the last 100 steps, and whether the two bf16 runs ended with identical
# weights. Each extra SEED repeats the CPU, bf16 and bf16-f32-softmax runs with that seed instead of
# the demo's, to show the run-to-run spread of the measure.
#   usage: tools/curve_check.sh [BUILD_DIR] [STEPS] [SEED...]   (logs and metrics under $OUT or /tmp/ingot-out)
set -uo pipefail
build=${1:-build}; steps=${2:-300}; shift $(( $# < 2 ? $# : 2 )); seeds=("$@")
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
[ -d runs/demo-data ] || "$build/ingot" prepare /usr/share/games/fortunes --doc-separator % -o runs/demo-data --overwrite >/dev/null
train() {  # name device precision [extra --set options]
  local name=$1 device=$2 precision=$3; shift 3
  "$build/ingot" train examples/demo.yaml --overwrite --set device=$device --set precision=$precision --set output_dir=runs/curve-$name "$@" \
    --set max_steps=$steps --set logging_steps=1 --set eval_steps=0 --set save_steps=0 >"$out/train_$name.log" 2>&1 \
    || { echo "train $name failed:"; tail -5 "$out/train_$name.log"; }
  cp runs/curve-$name/metrics.jsonl "$out/metrics_$name.jsonl" 2>/dev/null
}
t0=$(date +%s)
train cpu cpu fp32; train cuda-bf16 cuda bf16; train cuda-bf16-again cuda bf16; train cuda-fp32 cuda fp32
INGOT_ATTENTION=kernels train cuda-bf16-f32-softmax cuda bf16
for seed in "${seeds[@]}"; do
  train cpu-seed$seed cpu fp32 --set seed=$seed; train cuda-bf16-seed$seed cuda bf16 --set seed=$seed
  INGOT_ATTENTION=kernels train cuda-bf16-f32-softmax-seed$seed cuda bf16 --set seed=$seed
done
cmp -s runs/curve-cuda-bf16/checkpoint-$steps/model.safetensors runs/curve-cuda-bf16-again/checkpoint-$steps/model.safetensors \
  && echo "cuda bf16 run twice: identical weights" || echo "cuda bf16 run twice: weights DIFFER"
python3 - "$out" "${seeds[@]}" <<'PY'
import json, sys, os
out, seeds = sys.argv[1], sys.argv[2:]
def losses(name):
    p = os.path.join(out, f"metrics_{name}.jsonl")
    return [json.loads(l)["loss"] for l in open(p)] if os.path.exists(p) else []
def compare(cpu_name, names, label):
    cpu = losses(cpu_name)
    for name in names:
        a = losses(name); n = min(len(a), len(cpu)); k = min(100, n)
        if k == 0: print(f"{name}: no curve"); continue
        tail = [a[i] - cpu[i] for i in range(n - k, n)]
        print(f"{name} vs cpu fp32{label}: {n} steps; mean |diff| over the last {k}: {sum(map(abs, tail)) / k:.4f} "
              f"(mean signed {sum(tail) / k:+.4f}); final loss {a[n-1]:.4f} / {cpu[n-1]:.4f}")
compare("cpu", ("cuda-bf16", "cuda-bf16-f32-softmax", "cuda-fp32"), "")
for seed in seeds:
    compare(f"cpu-seed{seed}", (f"cuda-bf16-seed{seed}", f"cuda-bf16-f32-softmax-seed{seed}"), f" (seed {seed})")
PY
echo "curve check: $(( $(date +%s) - t0 )) s"
