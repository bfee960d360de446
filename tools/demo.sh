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
val=$(grep val_loss runs/demo/metrics.jsonl | tail -1 | sed 's/.*"val_loss":\([0-9.]*\).*/\1/')
printf 'training took %d s; final val_loss %.4f nats/byte\n' "$((end - start))" "$val"
echo "metrics:    runs/demo/metrics.jsonl"
echo "plot:       runs/demo/loss.svg"
echo "checkpoint: $(ls -d runs/demo/checkpoint-* | sort -t- -k2 -n | tail -1)"
