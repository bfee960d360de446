#!/usr/bin/env bash
# Is the validation loss a steadier measure than the per-step training loss of how closely a CUDA
# run follows the CPU reference? For each SEED, the demo model trains 300 steps on the fortunes
# shards on the CPU (fp32; the CPU runs in parallel, 3 threads each) and on CUDA (bf16, then fp32),
# evaluating every 10 steps on 40 validation batches (20k tokens); then, against the CPU run of the
# same seed: mean |diff| (and mean signed diff) of the training loss over steps 201-300 and of the
# validation loss at steps 210, 220, ..., 300.
#   usage: tools/curve_val_study.sh BUILD_DIR SEED...   (metrics under $OUT or /tmp/ingot-out, logs in runs/)
set -uo pipefail
build=$1; shift; seeds=("$@"); out=${OUT:-/tmp/ingot-out}; mkdir -p "$out"
[ -d runs/demo-data ] || "$build/ingot" prepare /usr/share/games/fortunes --doc-separator % -o runs/demo-data --overwrite >/dev/null
train() {  # name device precision seed
  rm -f "$out/vc_$1.jsonl"  # a failed run must not leave an earlier call's metrics in place
  "$build/ingot" train examples/demo.yaml --overwrite --set device=$2 --set precision=$3 --set seed=$4 \
    --set output_dir=runs/vc-$1 --set max_steps=300 --set logging_steps=1 --set eval_steps=10 --set eval_max_batches=40 \
    --set save_steps=0 --set num_threads=3 >runs/vc-$1.log 2>&1 || { echo "train $1 failed"; tail -3 runs/vc-$1.log; }
  cp runs/vc-$1/metrics.jsonl "$out/vc_$1.jsonl" 2>/dev/null
}
t0=$(date +%s)
for s in "${seeds[@]}"; do train cpu-$s cpu fp32 $s & done
for s in "${seeds[@]}"; do train bf16-$s cuda bf16 $s; train fp32-$s cuda fp32 $s; done
wait
echo "runs: $(( $(date +%s) - t0 )) s"
python3 - "$out" "${seeds[@]}" <<'PY'
import json, sys, os
out, seeds = sys.argv[1], sys.argv[2:]
def curves(name):
    # (training loss by step, validation loss by step); a run without every step is an error.
    p = os.path.join(out, f"vc_{name}.jsonl")
    if not os.path.exists(p): sys.exit(f"{name}: no metrics ({p}); see runs/vc-{name}.log")
    rows = [json.loads(l) for l in open(p)]
    train = {r["step"]: r["loss"] for r in rows}; val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    missing = [k for k in range(1, 301) if k not in train] + [k for k in range(210, 301, 10) if k not in val]
    if missing: sys.exit(f"{name}: incomplete run, missing steps {missing[:5]}...; see runs/vc-{name}.log")
    return train, val
def mean(xs): return sum(xs) / len(xs)
print("seed run   train|d| (signed)   val|d| (signed)  final val")
for s in seeds:
    tl, vl = curves(f"cpu-{s}")
    for kind in ("bf16", "fp32"):
        at, av = curves(f"{kind}-{s}")
        ts = [at[k] - tl[k] for k in range(201, 301)]
        vs = [av[k] - vl[k] for k in range(210, 301, 10)]
        print(f"{s:>4} {kind}  {mean(list(map(abs, ts))):.4f} ({mean(ts):+.4f})   {mean(list(map(abs, vs))):.4f} ({mean(vs):+.4f})   {av[300]:.4f}/{vl[300]:.4f}")
PY
