#!/usr/bin/env bash
# `make demo`: prepare Debian's fortunes as byte-level shards, train the ~3M-parameter model of
# examples/demo.yaml from scratch, then sample from it. Re-running starts the run afresh.
set -euo pipefail
build=${1:-build}
ingot="$build/ingot"
corpus=/usr/share/games/fortunes
[ -d "$corpus" ] || { echo "demo: $corpus is missing (Debian package 'fortunes'; 'make deps' installs it)" >&2; exit 1; }

"$ingot" prepare "$corpus" --doc-separator % -o runs/demo-data --overwrite
start=$(date +%s)
"$ingot" train examples/demo.yaml --overwrite
end=$(date +%s)
echo
echo "=== sample (temperature 0.8, top-k 40) ==="
"$ingot" generate runs/demo --prompt "The meaning of life is" --max-new-tokens 300 --seed 1
echo
# The last evaluation's val_loss; none (no evaluation, or null for a non-finite loss) is said so.
val=$({ grep -o '"val_loss":[0-9.eE+-]*' runs/demo/metrics.jsonl || true; } | tail -1 | cut -d: -f2)
if [ -n "$val" ]; then
  LC_ALL=C printf 'training took %d s; final val_loss %.4f nats/byte\n' "$((end - start))" "$val"
else
  echo "training took $((end - start)) s; no finite val_loss in runs/demo/metrics.jsonl"
fi
echo "metrics:    runs/demo/metrics.jsonl"
echo "plot:       runs/demo/loss.svg"
echo "checkpoint: $(ls -d runs/demo/checkpoint-* | sort -t- -k2 -n | tail -1)"
