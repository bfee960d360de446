#!/usr/bin/env python3
"""Character (byte) bigram baseline for the demo: fit next-byte counts on the first part of a
token shard, report the mean negative log-likelihood (nats per token) on the held-out tail.

    python3 tools/bigram_baseline.py runs/demo-data/train-00000.bin [--val-fraction 0.02]

The tail matches the data loader's validation split (the last windows of the stream), so the
number is comparable with `val_loss` in metrics.jsonl. Add-k smoothing with k = 0.1.
"""
import argparse
import array
import math
import struct

parser = argparse.ArgumentParser()
parser.add_argument("shard")
parser.add_argument("--val-fraction", type=float, default=0.02)
args = parser.parse_args()

data = open(args.shard, "rb").read()
if data[:8] != b"INGOTTOK":
    raise SystemExit(f"{args.shard}: not an Ingot token shard")
_version, width, n, _docs, _flags, vocab = struct.unpack("<IIQQII", data[8:40])
tokens = array.array("H" if width == 2 else "I")
tokens.frombytes(data[40:40 + width * n])
vocab = vocab or (max(tokens) + 1)
split = int(n * (1 - args.val_fraction))
counts = [[0] * vocab for _ in range(vocab)]
for a, b in zip(tokens[:split - 1], tokens[1:split]):
    counts[a][b] += 1
totals = [sum(row) for row in counts]
k = 0.1
nll = sum(-math.log((counts[a][b] + k) / (totals[a] + k * vocab)) for a, b in zip(tokens[split:-1], tokens[split + 1:]))
print(f"bigram baseline: {nll / (n - split - 1):.3f} nats/token on the last {n - split - 1} tokens of {args.shard}")
