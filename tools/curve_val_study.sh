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
def rec(name):
    p = os.path.join(out, f"vc_{name}.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
print("seed run   train|d| (signed)   val|d| (signed)  val pts  final val")
for s in seeds:
    cpu = rec(f"cpu-{s}")
    tl = {r["step"]: r["loss"] for r in cpu}; vl = {r["step"]: r["val_loss"] for r in cpu if "val_loss" in r}
    for kind in ("bf16", "fp32"):
        a = rec(f"{kind}-{s}")
        at = {r["step"]: r["loss"] for r in a}; av = {r["step"]: r["val_loss"] for r in a if "val_loss" in r}
        ts = [at[k] - tl[k] for k in range(201, 301) if k in at and k in tl]
        vs = [av[k] - vl[k] for k in sorted(av) if k > 200 and k in vl]
        if not ts or not vs: print(s, kind, "missing"); continue
        print(f"{s:>4} {kind}  {sum(map(abs,ts))/len(ts):.4f} ({sum(ts)/len(ts):+.4f})   {sum(map(abs,vs))/len(vs):.4f} ({sum(vs)/len(vs):+.4f})  {len(vs):>3}   {av[300]:.4f}/{vl[300]:.4f}")
PY
