#!/usr/bin/env bash
# Ingot vs Hugging Face transformers (eager and torch.compile), training-step speed on one GPU, in
# one command. See bench/README.md.
#
#   bash bench/run.sh BUILD_DIR [--quick] [--skip-compile] [--budget SECONDS]
#        [--models a,b,c] [--big NAME|none] [--seq N] [--micro-batch N] [--device cuda|cpu]
#        [--ingot-args "FLAGS"]   (extra `ingot bench` flags for every Ingot row, e.g. a recipe)
#        [--packed-doc-len N]     (both sides train rows packed with documents of mean length N,
#                                  the same documents; MFU counts the pairs that attend)
#
# Writes to ${OUT:-/tmp/bench-out}: bench.log (every run's output), bench-results.jsonl (one row per
# measurement, failures included) and bench-table.md (the table printed at the end).
# Runs are ordered by importance and each is cut to the time left of the budget (default 530 s,
# 300 s with --quick); whatever does not fit is reported as skipped.
set -uo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }  # 0 when asked for, 2 on a usage error
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; esac
BUILD=$1; shift
# INGOT_EXTRA is run.sh's own per-job variable, set from --ingot-args below: one from the
# environment would be dropped without a word, and the table would describe a run that did not happen.
if [ -n "${INGOT_EXTRA:-}" ]; then
  echo "run.sh: INGOT_EXTRA is set in the environment (\"$INGOT_EXTRA\"); give Ingot's flags with --ingot-args" >&2
  exit 2
fi
QUICK=0; SKIP_COMPILE=0; BUDGET=""; MODELS=""; BIG_ARG=""; SEQ=4096; MB=4; DEVICE=cuda; INGOT_ARGS=""; PACKED=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --skip-compile) SKIP_COMPILE=1 ;;
    --budget) BUDGET=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --big) BIG_ARG=$2; shift ;;
    --seq) SEQ=$2; shift ;;
    --micro-batch) MB=$2; shift ;;
    --device) DEVICE=$2; shift ;;
    --ingot-args) INGOT_ARGS=$2; shift ;;
    --packed-doc-len) PACKED=$2; shift ;;
    -h|--help) usage 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
INGOT="$BUILD/ingot"
OUTDIR=${OUT:-/tmp/bench-out}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/bench.log"; RESULTS="$OUTDIR/bench-results.jsonl"; TABLE="$OUTDIR/bench-table.md"
: >"$LOG"; : >"$RESULTS"
WORK=$(mktemp -d /tmp/bench-work.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

if [ $QUICK = 1 ]; then
  MODELS=${MODELS:-llama-3.2-1b}; BUDGET=${BUDGET:-300}
  INGOT_STEPS=8; PEER_STEPS=5; WARM_EAGER=2; WARM_COMPILE=3; BIG=""
else
  MODELS=${MODELS:-llama-3.2-1b,qwen3-0.6b,qwen2.5-0.5b}; BUDGET=${BUDGET:-530}
  INGOT_STEPS=20; PEER_STEPS=10; WARM_EAGER=3; WARM_COMPILE=5; BIG=llama-3-8b
fi
[ -n "$BIG_ARG" ] && BIG=$BIG_ARG
[ "$BIG" = none ] && BIG=""
IFS=, read -r -a MODEL_LIST <<<"$MODELS"
PACKED_ARG=""; [ "$PACKED" != 0 ] && PACKED_ARG="--packed-doc-len $PACKED"
INGOT_ARGS="${INGOT_ARGS}${INGOT_ARGS:+${PACKED_ARG:+ }}$PACKED_ARG"
INGOT_EXTRA=$INGOT_ARGS  # a job's own INGOT_EXTRA=... prefix replaces it for that job
ALT_MBS=($((MB * 2)) $((MB * 4)))  # Ingot's other micro-batches, to find its best (half the batch never was)

echo "== Ingot speed benchmark $(date -u '+%Y-%m-%d %H:%M UTC'); budget ${BUDGET}s; logs in $OUTDIR"
# The GPU the runs use, for nvidia-smi: the first one CUDA_VISIBLE_DEVICES names when that is an
# index or a full GPU UUID, else 0. (nvidia-smi counts in PCI order; CUDA indices agree on machines
# of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID. MIG instances are not sampled per instance.)
SMI_GPU=${CUDA_VISIBLE_DEVICES:-0}; SMI_GPU=${SMI_GPU%%,*}
[[ $SMI_GPU =~ ^[0-9]+$ || $SMI_GPU =~ ^GPU-[0-9a-fA-F-]{36}$ ]] || SMI_GPU=0
export SMI_GPU
if command -v nvidia-smi >/dev/null; then
  echo "GPU: $(nvidia-smi -i "$SMI_GPU" --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -1)"
fi
echo "models: ${MODEL_LIST[*]}; seq $SEQ x micro-batch $MB (Ingot also ${ALT_MBS[*]:-none})${BIG:+; $BIG at $SEQ x 1}"
[ -x "$INGOT" ] || echo "WARNING: $INGOT not found or not executable: the Ingot rows will be errors"

# Config files, identical for both sides.
for m in "${MODEL_LIST[@]}" $BIG; do
  "$PY" "$HERE/peers.py" --preset "$m" --write-config "$WORK/cfg/$m" >/dev/null || echo "cannot write config for $m"
done

# collect KIND MODEL MB RC SECONDS STDOUT STDERR: turn one run's output into rows of $RESULTS and print
# a summary line. Ingot: the last JSON object line of stdout. Peers: the rows they wrote to STDOUT.
collect() {
  "$PY" - "$@" "$RESULTS" "$SEQ" "${INGOT_EXTRA:-}" <<'PY'
import json, sys
kind, model, mb, rc, secs, out_path, err_path, smi_path, results, seq, extra = sys.argv[1:]
mb, rc, seq, secs = int(mb), int(rc), int(seq), float(secs)
def objects(path):
    rows = []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return rows
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and ("system" in obj or "tokens_per_s" in obj):
                rows.append(obj)
    return rows
def why():
    if rc in (124, 137):
        return f"timed out after {secs:.0f} s"
    tail = ""
    try:
        lines = [l.strip() for l in open(err_path, errors="replace").read().splitlines() if l.strip()]
        tail = lines[-1][:300] if lines else ""
    except OSError:
        pass
    return f"exit {rc}" + (f": {tail}" if tail else "")
def loaded_gpu():
    # Samples taken under load (power at least 80% of the limit): the median SM clock and power,
    # and the share of them that the driver flags as held back by the power cap.
    samples = []
    try:
        for line in open(smi_path, errors="replace"):
            parts = [p.strip() for p in line.split(",")]
            try:
                samples.append((float(parts[0]), float(parts[1]), float(parts[2]), parts[3] == "Active"))
            except (ValueError, IndexError):
                continue
    except OSError:
        return {}
    loaded = [x for x in samples if x[1] >= 0.8 * x[2]]
    if not loaded:
        return {}
    mid = lambda v: sorted(v)[len(v) // 2]
    return {"sm_mhz_loaded": mid([x[0] for x in loaded]), "power_w_loaded": mid([x[1] for x in loaded]),
            "power_limit_w": loaded[0][2], "power_capped_share": sum(x[3] for x in loaded) / len(loaded),
            "loaded_samples": len(loaded)}
gpu_load = loaded_gpu()
rows = objects(out_path)
if kind == "ingot":
    rows = rows[-1:]
    for r in rows:
        if r.get("model") != model:
            r["model_reported"] = r.get("model")
            r["model"] = model
        r.setdefault("system", "ingot")
        r.setdefault("seq", seq)
        r.setdefault("micro_batch", mb)
        if extra:
            r["options"] = extra
        if rc != 0 and not r.get("error"):
            r["error"] = why()
    expected = ["ingot"]
    if not rows:
        rows = [{"system": "ingot", "model": model, "seq": seq, "micro_batch": mb, "tokens_per_s": None,
                 "mfu": None, "step_ms": None, "peak_gib": None, "error": why()}]
        if extra:
            rows[0]["options"] = extra
else:
    expected = [f"transformers-{m}" for m in kind.split(",")]
have = {r.get("system") for r in rows}
def is_oom(text):  # a CUDA allocation failure, or Ingot's memory plan refusing the run up front
    return "out of memory" in text.lower() or "the run needs" in text
for r in rows:
    if is_oom(str(r.get("error", ""))):
        r["oom"] = True
for system in expected:
    if system not in have:
        rows.append({"system": system, "model": model, "seq": seq, "micro_batch": mb, "tokens_per_s": None,
                     "mfu": None, "step_ms": None, "peak_gib": None, "error": why()})
        if is_oom(rows[-1]["error"]):
            rows[-1]["oom"] = True
with open(results, "a") as f:
    for r in rows:
        r["run_s"] = round(secs, 1)
        if r.get("tokens_per_s") and len(rows) == 1:
            r.update(gpu_load)  # one system per job: its samples are its own
        f.write(json.dumps(r) + "\n")
for r in rows:
    shape = f"{r.get('seq')}x{r.get('micro_batch')}"
    if r.get("tokens_per_s"):
        mfu = f"{100 * r['mfu']:.2f}%" if isinstance(r.get("mfu"), (int, float)) else "?"
        peak = f"{r['peak_gib']:.1f} GiB" if isinstance(r.get("peak_gib"), (int, float)) else "? GiB"
        step = f"{r['step_ms']:.1f}" if isinstance(r.get("step_ms"), (int, float)) else "?"
        msg = f"{r['tokens_per_s'] / 1e3:.1f}k tok/s, MFU {mfu}, {step} ms/step, peak {peak}"
        if r.get("sm_mhz_loaded"):
            msg += f", {r['sm_mhz_loaded']:.0f} MHz at {r['power_w_loaded']:.0f} W under load"
        if r.get("error"):
            msg += f" [{r['error']}]"
    else:
        msg = ("OOM: " if r.get("oom") else "FAILED: ") + str(r.get("error"))
    opts = f" {r['options']}" if r.get("options") else ""
    print(f"  {r.get('system')} {r.get('model')} {shape}{opts}: {msg}  ({secs:.0f} s)", flush=True)
PY
}

skip_row() {  # skip_row SYSTEM MODEL MB REASON
  printf '{"system": "%s", "model": "%s", "seq": %s, "micro_batch": %s, "tokens_per_s": null, "mfu": null, "step_ms": null, "peak_gib": null, "skipped": "%s"}\n' \
    "$1" "$2" "$SEQ" "$3" "$4" >>"$RESULTS"
  echo "  $1 $2 ${SEQ}x$3: skipped ($4)"
}

# job KIND MODEL MB CAP MIN: KIND is "ingot" or peer modes ("eager", "compile", "eager,compile").
# Runs only if at least MIN seconds of the budget are left, for at most min(CAP, time left).
job() {
  local kind=$1 model=$2 mb=$3 cap=$4 min=$5
  local left=$((BUDGET - SECONDS)) systems
  if [ "$kind" = ingot ]; then systems=ingot; else systems="transformers-${kind//,/,transformers-}"; fi
  if [ $left -lt "$min" ]; then
    for s in ${systems//,/ }; do skip_row "$s" "$model" "$mb" "time budget: ${left}s left, needs ${min}s"; done
    return
  fi
  local limit=$(( cap < left ? cap : left ))
  local extra=""; [ "$kind" = ingot ] && extra=${INGOT_EXTRA:-}  # Ingot's flags; peers take only --packed-doc-len
  local tag="$kind-$model-$mb$extra" out err rc t0=$SECONDS
  tag=${tag// /}
  out="$WORK/$tag.out"; err="$WORK/$tag.err"
  echo "[$(printf '%4d' $SECONDS)s] $systems $model ${SEQ}x$mb ${extra:+$extra }(limit ${limit}s)"
  # SM clock and board power every 100 ms while the job runs (GPU $SMI_GPU): a step that draws the power
  # limit runs below the boost clock, which isolated kernel timings do not show.
  local smi="$WORK/$tag.smi" smi_pid=""
  if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi -i "$SMI_GPU" --query-gpu=clocks.sm,power.draw,power.limit,clocks_event_reasons.sw_power_cap \
      --format=csv,noheader,nounits -lms 100 >"$smi" 2>/dev/null &
    smi_pid=$!
  fi
  if [ "$kind" = ingot ]; then
    if [ -x "$INGOT" ]; then
      timeout -k 10 "$limit" "$INGOT" bench --model "$WORK/cfg/$model" --seq "$SEQ" --micro-batch "$mb" \
        --steps "$INGOT_STEPS" --device "$DEVICE" --json $extra >"$out" 2>"$err" </dev/null
      rc=$?
    else
      echo "$INGOT: not found or not executable" >"$err"; : >"$out"; rc=127
    fi
  else
    timeout -k 10 "$limit" "$PY" "$HERE/peers.py" --preset "$model" --modes "$kind" --seq "$SEQ" \
      --micro-batch "$mb" --steps "$PEER_STEPS" --warmup-eager "$WARM_EAGER" --warmup-compile "$WARM_COMPILE" \
      --device "$DEVICE" --packed-doc-len "$PACKED" >"$out" 2>"$err" </dev/null
    rc=$?
  fi
  [ -n "$smi_pid" ] && { kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; }
  { echo "===== $systems $model seq $SEQ micro-batch $mb $extra: exit $rc, $((SECONDS - t0)) s"
    echo "--- stdout"; cat "$out"; echo "--- stderr"; tail -n 200 "$err"; } >>"$LOG"
  collect "$kind" "$model" "$mb" "$rc" "$((SECONDS - t0))" "$out" "$err" "$smi"
}

# In order of importance, so that a tight budget drops the least important runs: Ingot at the main
# shape and the big model (cheap), the eager and torch.compile peers (compilation takes about a
# minute per model), Ingot's other micro-batches (twice, then four times the main one), and last the
# eager peer of the big model.
for m in "${MODEL_LIST[@]}"; do job ingot "$m" "$MB" 100 15; done
if [ -n "$BIG" ]; then
  job ingot "$BIG" 1 150 30
  # fp32 master weights + AdamW state of 8B parameters are 96 GiB: if that does not fit, run with the
  # memory of the eager peer's bf16 model (bf16 weights, gradients and AdamW moments, no master
  # copy), plus the elementwise recompute.
  if tail -n 1 "$RESULTS" | grep -q '"oom": true'; then
    INGOT_EXTRA="--no-master-weights --grad-dtype bf16 --optimizer-state-dtype bf16 --recompute elementwise${PACKED_ARG:+ $PACKED_ARG}" \
      job ingot "$BIG" 1 150 30
  fi
fi
for m in "${MODEL_LIST[@]}"; do job eager "$m" "$MB" 150 25; done
if [ $SKIP_COMPILE = 0 ]; then
  for m in "${MODEL_LIST[@]}"; do job compile "$m" "$MB" 270 75; done
fi
for b in "${ALT_MBS[@]}"; do for m in "${MODEL_LIST[@]}"; do job ingot "$m" "$b" 100 15; done; done
[ -n "$BIG" ] && job eager "$BIG" 1 200 60
echo "[$(printf '%4d' $SECONDS)s] done"

# The table, ready for docs/perf.md. MFU is recomputed from tokens/s with one formula for every row
# (bench/presets.py), except packed rows, whose MFU each side reports over the pairs that attend; "Ingot ÷ this" is Ingot's tokens/s at the same model and shape over the row's.
"$PY" - "$RESULTS" "$HERE" "$MB" <<'PY' | tee "$TABLE"
import datetime, json, os, subprocess, sys
sys.path.insert(0, sys.argv[2])
import presets
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def tps(r):
    v = r.get("tokens_per_s")
    return v if isinstance(v, (int, float)) and v > 0 and not r.get("error") else None
ingot = {(r["model"], r["seq"], r["micro_batch"]): tps(r) for r in rows if r["system"] == "ingot" and tps(r)}
best = {}
for (m, s, b), v in ingot.items():
    if v > best.get((m, s), (0, 0))[0]:
        best[(m, s)] = (v, b)
order = {"ingot": 0, "transformers-eager": 1, "transformers-compile": 2}
models = []
for r in rows:
    if r["model"] not in models:
        models.append(r["model"])
rows.sort(key=lambda r: (models.index(r["model"]), -r["seq"], r["micro_batch"] != int(sys.argv[3]), r["micro_batch"], order.get(r["system"], 9)))
print("| model | system | seq×mb | tokens/s | MFU | peak GiB | SM MHz / W under load | Ingot ÷ this | best Ingot ÷ this | note |")
print("|---|---|---|---|---|---|---|---|---|---|")
notes = []
for r in rows:
    m, s, b, v = r["model"], r["seq"], r["micro_batch"], tps(r)
    try:
        cfg = presets.get(m)
    except SystemExit:
        cfg = None
    # Packed rows: each side reports MFU over the pairs that attend (the same documents on both).
    mfu = r.get("mfu") if (v and r.get("packed_doc_len")) else presets.mfu(cfg, s, v) if (v and cfg) else r.get("mfu") if v else None
    # MFU is against the H100/H200 bf16 peak: meaningless for a CPU row (Ingot reports null there).
    if str(r.get("device", "")).startswith("cpu") or str(r.get("gpu") or "").startswith("none"):
        mfu = None
    note = ""
    if r.get("oom"):
        note = "OOM"
    elif r.get("skipped"):
        note = "skipped: " + r["skipped"]
    elif r.get("error"):
        note = "error: " + str(r["error"]).replace("|", "/")[:120]
    rep = r.get("mfu")
    if r["system"] == "ingot" and v and mfu and isinstance(rep, (int, float)) and abs(rep - mfu) > max(0.01 * mfu, 1e-4):
        note = (note + "; " if note else "") + f"reports MFU {100 * rep:.2f}%"
    same = ingot.get((m, s, b)) if r["system"] != "ingot" else None
    bst = best.get((m, s)) if r["system"] != "ingot" else None
    system = r["system"] + (f" ({r['options'].lstrip('-')})" if r.get("options") else "")
    cells = [m, system, f"{s}×{b}",
             f"{v / 1e3:.1f}k" if v else "—",
             f"{100 * mfu:.2f}%" if mfu else "—",
             f"{r['peak_gib']:.1f}" if isinstance(r.get("peak_gib"), (int, float)) and v else "—",
             f"{r['sm_mhz_loaded']:.0f} / {r['power_w_loaded']:.0f}" if r.get("sm_mhz_loaded") and v else "—",
             f"{same / v:.2f}×" if (same and v) else "—",
             f"{bst[0] / v:.2f}× (mb {bst[1]})" if (bst and v) else "—",
             note]
    print("| " + " | ".join(cells) + " |")
peers = [r for r in rows if r["system"] != "ingot" and r.get("gpu")]
gpu = peers[0]["gpu"] if peers else next((r["gpu"] for r in rows if r.get("gpu")), None)
if not gpu:
    try:
        gpu = subprocess.run(["nvidia-smi", "-i", os.environ.get("SMI_GPU", "0"), "--query-gpu=name",
                              "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        gpu = "unknown GPU"
vers = f"; PyTorch {peers[0]['torch']}, transformers {peers[0]['transformers']}" if peers else ""
steps = sorted({r.get("steps") for r in rows if r.get("steps")})
print()
on_cpu = gpu.startswith("none (CPU: ") or any(str(r.get("device", "")).startswith("cpu") for r in rows)
where = "the CPU" if on_cpu else f"one {gpu}"
print(f"Measured {datetime.date.today().isoformat()} on {where}{vers}. Median step time after warm-up"
      f" ({'/'.join(map(str, steps)) or '?'} timed steps for the peers); tokens/s = seq × micro-batch ÷ median step."
      " MFU = tokens/s × (6·N_matmul + 6·L·S·H·Dh) ÷ 989.4e12. Peers: bf16 weights, SDPA, fused AdamW,"
      " clip_grad_norm_ 1.0, random token ids. SM MHz / W: medians over the run's samples (nvidia-smi,"
      " every 100 ms) drawing at least 80% of the board's power limit.")
packed = sorted({r["packed_doc_len"] for r in rows if r.get("packed_doc_len")})
if packed:
    print(f"Packed rows (--packed-doc-len {'/'.join(map(str, packed))}): both sides train the same documents (positions"
          " restart at each; transformers derives its document mask from them), and MFU counts attention over the"
          " pairs that attend: 12·L·H·Dh·(mean keys a token attends to) in place of 6·L·S·H·Dh.")
caps = [r for r in rows if r.get("power_limit_w")]
if caps:
    print(f"Power limit {caps[0]['power_limit_w']:.0f} W; share of loaded samples the driver flags as power-capped: "
          + ", ".join(f"{r['system'].replace('transformers-', '')} {r['model']} {r['seq']}×{r['micro_batch']}"
                      f" {100 * r['power_capped_share']:.0f}%" for r in caps) + ".")
PY
