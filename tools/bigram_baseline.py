#!/usr/bin/env python3
"""Character (byte) bigram baseline for the demo: fit next-byte counts on the training part of a
token shard, report the mean negative log-likelihood (nats per token) on validation windows.

    python3 tools/bigram_baseline.py runs/demo-data/train-00000.bin --seq-len 64 --windows 256

The windows are the data loader's (stream packing): the validation tail is the last
max(1, int(windows_in_stream * val_fraction)) windows of seq_len + 1 tokens. `val_loss` in
metrics.jsonl covers the first eval_max_batches x micro_batch_size of them (the demo: 32 x 8 =
256), so --windows 256 scores the same targets; --windows 0 scores the whole tail. Add-k smoothing
with k = 0.1.
"""
import argparse
import array
import math
import struct

parser = argparse.ArgumentParser()
parser.add_argument("shard")
parser.add_argument("--val-fraction", type=float, default=0.02)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--windows", type=int, default=0, help="validation windows to score, from the first; 0: all")
args = parser.parse_args()

data = open(args.shard, "rb").read()
if data[:8] != b"INGOTTOK":
    raise SystemExit(f"{args.shard}: not an Ingot token shard")
_version, width, n, _docs, _flags, vocab = struct.unpack("<IIQQII", data[8:40])
tokens = array.array("H" if width == 2 else "I")
tokens.frombytes(data[40:40 + width * n])
vocab = vocab or (max(tokens) + 1)

# The loader's split (src/ingot/data/loader.cpp): one token separates the train windows from the
# validation tail.
T = args.seq_len
num_val = max(1, int((n - 1) // T * args.val_fraction))
num_train = (n - 2 - num_val * T) // T
if num_train < 1:
    raise SystemExit(f"{args.shard}: {n} tokens are too few for seq_len {T} with val_fraction {args.val_fraction}")
val_begin = num_train * T + 1
windows = num_val if args.windows <= 0 else min(args.windows, num_val)

counts = [[0] * vocab for _ in range(vocab)]
for a, b in zip(tokens[:val_begin - 1], tokens[1:val_begin]):
    counts[a][b] += 1
totals = [sum(row) for row in counts]
k = 0.1
nll, targets = 0.0, 0
for j in range(windows):
    start = val_begin + j * T
    for a, b in zip(tokens[start:start + T], tokens[start + 1:start + T + 1]):
        nll -= math.log((counts[a][b] + k) / (totals[a] + k * vocab))
        targets += 1
print(f"bigram baseline: {nll / targets:.3f} nats/token on the first {windows} of {num_val} validation windows "
      f"({targets} targets, seq_len {T}) of {args.shard}")
