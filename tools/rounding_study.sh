#!/usr/bin/env bash
# What rounding the optimizer's bf16 stores to nearest costs, and what stochastic rounding gives
# back (config key stochastic_rounding): the demo model trained on CUDA from the demo's seed with
# the default recipe (f32 master weights and moments), without master weights (the bf16 weights
# updated directly), and with the peers' recipe (also bf16 gradients and moments), each rounded to
# nearest and stochastically. Twice: at the demo's hyperparameters, and at a fine-tuning-sized
# learning rate (constant, no warm-up) with adam_beta2 0.999, where most updates are below half a
# bf16 step of their weight. Prints, per run, the mean training loss over the last 50 steps and the
# validation loss at the end.
#   usage: tools/rounding_study.sh [BUILD_DIR] [STEPS] [LOW_LR]   (logs and metrics under $OUT or /tmp/ingot-out)
set -uo pipefail
build=${1:-build}; steps=${2:-300}; low_lr=${3:-3e-5}
out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
[ -d runs/demo-data ] || "$build/ingot" prepare /usr/share/games/fortunes --doc-separator % -o runs/demo-data --overwrite >/dev/null
peers="--set master_weights=false --set grad_dtype=bf16 --set optimizer_state_dtype=bf16"
low="--set learning_rate=$low_lr --set lr_scheduler_type=constant --set warmup_steps=0 --set adam_beta2=0.999"
train() {  # name [extra --set options]
  local name=$1; shift
  "$build/ingot" train examples/demo.yaml --overwrite --set device=cuda --set precision=bf16 --set output_dir=runs/rounding-$name \
    --set max_steps=$steps --set logging_steps=1 --set eval_steps=0 --set save_steps=0 "$@" >"$out/train_$name.log" 2>&1 \
    || { echo "train $name failed:"; tail -5 "$out/train_$name.log"; }
  cp runs/rounding-$name/metrics.jsonl "$out/metrics_$name.jsonl" 2>/dev/null
}
t0=$(date +%s)
for setting in demo low; do
  extra=""; [ $setting = low ] && extra=$low
  train $setting-master $extra
  train $setting-no-master $extra --set master_weights=false
  train $setting-no-master-sr $extra --set master_weights=false --set stochastic_rounding=true
  train $setting-peers $extra $peers
  train $setting-peers-sr $extra $peers --set stochastic_rounding=true
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print("| setting | recipe | rounding | train loss, last 50 steps | val loss at the end |")
print("|---|---|---|---|---|")
for setting in ("demo", "low"):
    for recipe, label in (("master", "f32 master weights"), ("no-master", "no master weights"), ("peers", "peers' (bf16 weights, grads, moments)")):
        for suffix, rounding in (("", "nearest"), ("-sr", "stochastic")):
            if recipe == "master" and suffix:
                continue
            path = os.path.join(out, f"metrics_{setting}-{recipe}{suffix}.jsonl")
            if not os.path.exists(path):
                print(f"| {setting} | {label} | {rounding} | no run | |"); continue
            rows = [json.loads(l) for l in open(path)]
            train = [r["loss"] for r in rows if "loss" in r]
            val = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
            tail = train[-50:]
            if not tail:
                print(f"| {setting} | {label} | {rounding} | no losses logged | |"); continue
            print(f"| {setting} | {label} | {rounding} | {sum(tail) / len(tail):.4f} | {val[-1]:.4f} |" if val else
                  f"| {setting} | {label} | {rounding} | {sum(tail) / len(tail):.4f} | — |")
PY
echo "rounding study: $(( $(date +%s) - t0 )) s"
