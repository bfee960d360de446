#!/usr/bin/env python3
"""Which bf16 rounding moves the demo model's loss curve? A PyTorch emulation, not Ingot.

The demo model (examples/demo.yaml: Llama-style, 4 layers, C=256, byte vocabulary, AdamW 2e-3
cosine) is trained in f32 on the fortunes shard, with bf16 rounding switched on at chosen points
only. Each rounding is exact emulation: a value is rounded to the nearest bf16 and kept in f32, and
bf16 x bf16 products are exact in f32, so an f32 matmul (TF32 off) of rounded inputs stands for a
tensor-core GEMM with f32 accumulation. Points (letters of --points):
  W  the compute copy of the weights (f32 master weights and AdamW state stay f32)
  A  saved activations: norm outputs, qkv, RoPE output, attention output, gate_up, SwiGLU output
  G  the gradients of those activations in the backward
  R  the residual stream and its gradient
  P  the attention probabilities before P.V
  L  the logits before cross-entropy, and their gradient
Every run is compared with the f32 run of the same seed (same data, same initial weights): mean
|loss - loss_f32| and mean signed difference over the last 100 steps, the measure of
CudaDemoCurve.Bf16FollowsCpuReference. The row "f32+eps" perturbs the initial weights by one part
in 1e7 and shows how far any perturbation grows in this run.
  usage: python3 tools/bf16_rounding_study.py --data runs/demo-data/train-00000.bin [--seeds 1 2 3]
         [--configs all -W -A W A ...] [--workers 8]      (needs torch with CUDA; seconds per run)
"""
import argparse
import json
import math
import multiprocessing as mp

import numpy as np
import torch
import torch.nn.functional as F

V, C, F_, L, HQ, HKV, D, T, B = 257, 256, 704, 4, 4, 2, 64, 64, 8
LR, MIN_RATIO, WARMUP, WD, BETA1, BETA2, EPS, CLIP = 2e-3, 0.1, 50, 0.1, 0.9, 0.95, 1e-8, 1.0


class RoundValue(torch.autograd.Function):  # value to the nearest bf16, gradient untouched
    @staticmethod
    def forward(ctx, x):
        return x.bfloat16().float()

    @staticmethod
    def backward(ctx, g):
        return g


class RoundGrad(torch.autograd.Function):  # value untouched, gradient to the nearest bf16
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.bfloat16().float()


def rounder(value, grad):
    def r(x):
        if value:
            x = RoundValue.apply(x)
        if grad:
            x = RoundGrad.apply(x)
        return x
    return r


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x, cos, sin):  # x: (B,T,H,D), rotate-half convention
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def init_params(seed, device, eps_perturb):
    g = torch.Generator(device="cpu").manual_seed(seed)
    normal = lambda *shape: (torch.randn(*shape, generator=g) * 0.02)
    p = {"embed": normal(V, C), "final_norm": torch.ones(C)}
    for l in range(L):
        p[f"{l}.in_norm"] = torch.ones(C)
        p[f"{l}.qkv"] = normal((HQ + 2 * HKV) * D, C)
        p[f"{l}.o"] = normal(C, HQ * D)
        p[f"{l}.post_norm"] = torch.ones(C)
        p[f"{l}.gate_up"] = normal(2 * F_, C)
        p[f"{l}.down"] = normal(C, F_)
    if eps_perturb:
        for k, v in p.items():
            p[k] = v * (1 + 1e-7 * torch.randn(v.shape, generator=g))
    return {k: v.to(device).requires_grad_(True) for k, v in p.items()}


def loss_fn(p, x, y, points, cos, sin):
    w_round = rounder("W" in points, False)
    act = rounder("A" in points, "G" in points)
    res = rounder("R" in points, "R" in points)
    W = {k: w_round(v) for k, v in p.items()}
    h = res(W["embed"][x])                                          # (B,T,C)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    for l in range(L):
        n = act(rmsnorm(h, W[f"{l}.in_norm"]))
        qkv = act(n @ W[f"{l}.qkv"].t()).view(B, T, HQ + 2 * HKV, D)
        qk = act(rope(qkv[:, :, : HQ + HKV], cos, sin))
        q, k, v = qk[:, :, :HQ], qk[:, :, HQ:], qkv[:, :, HQ + HKV:]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))           # (B,H,T,D)
        k, v = (t.repeat_interleave(HQ // HKV, dim=1) for t in (k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        prob = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        if "P" in points:
            prob = RoundValue.apply(prob)
        a = act((prob @ v).transpose(1, 2).reshape(B, T, HQ * D))
        h = res(h + a @ W[f"{l}.o"].t())
        n = act(rmsnorm(h, W[f"{l}.post_norm"]))
        gu = act(n @ W[f"{l}.gate_up"].t())
        hid = act(F.silu(gu[..., :F_]) * gu[..., F_:])
        h = res(h + hid @ W[f"{l}.down"].t())
    n = act(rmsnorm(h, W["final_norm"]))
    logits = n @ W["embed"].t()
    if "L" in points:
        logits = rounder(True, True)(logits)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def lr_at(step, steps):
    if step < WARMUP:
        return LR * step / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(job):
    data_path, seed, config, steps = job
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda"
    points = "" if config in ("f32", "f32+eps") else ("WAGRPL" if config == "all" else
                                                     ("WAGRPL".replace(config[1:], "") if config.startswith("-") else config))
    header = np.fromfile(data_path, dtype=np.uint64, count=5)
    tokens = torch.from_numpy(np.fromfile(data_path, dtype=np.uint16, count=int(header[2]), offset=40).astype(np.int64))
    p = init_params(seed, device, config == "f32+eps")
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    vv = {k: torch.zeros_like(v) for k, v in p.items()}
    decays = {k: k.split(".")[-1] in ("qkv", "o", "gate_up", "down") for k in p}
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device).float() / D))
    ang = torch.arange(T, device=device).float()[:, None] * inv[None]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]  # (1,T,1,D/2)
    g = torch.Generator(device="cpu").manual_seed(1000 + seed)     # data order: per seed, not per config
    losses = []
    for step in range(steps):
        starts = torch.randint(0, tokens.numel() - T - 1, (B,), generator=g)
        window = torch.stack([tokens[s: s + T + 1] for s in starts]).to(device)
        loss = loss_fn(p, window[:, :-1], window[:, 1:], points, cos, sin)
        grads = torch.autograd.grad(loss, list(p.values()))
        losses.append(loss.item())
        with torch.no_grad():
            norm = torch.sqrt(sum((gr * gr).sum() for gr in grads))
            clip = min(1.0, CLIP / (norm.item() + 1e-6))
            lr = lr_at(step, steps)
            for (k, w), gr in zip(p.items(), grads):
                gr = gr * clip
                m[k].mul_(BETA1).add_(gr, alpha=1 - BETA1)
                vv[k].mul_(BETA2).addcmul_(gr, gr, value=1 - BETA2)
                mh = m[k] / (1 - BETA1 ** (step + 1))
                vh = vv[k] / (1 - BETA2 ** (step + 1))
                if decays[k]:
                    w.mul_(1 - lr * WD)
                w.add_(-lr * mh / (vh.sqrt() + EPS))
    return seed, config, losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--configs", nargs="+",
                    default=["f32+eps", "all", "-W", "-A", "-G", "-R", "-P", "-L", "W", "A", "G", "R", "P", "L"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    configs = ["f32"] + [c for c in args.configs if c != "f32"]
    jobs = [(args.data, s, c, args.steps) for s in args.seeds for c in configs]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(train, jobs)
    curves = {(s, c): l for s, c, l in results}
    k = min(100, args.steps)
    rows = []
    print(f"{'config':8} " + " ".join(f"{'seed ' + str(s):>17}" for s in args.seeds) + "   mean |diff|  mean signed")
    for c in configs[1:]:
        cells, absd, signed = [], [], []
        for s in args.seeds:
            ref, cur = curves[(s, "f32")], curves[(s, c)]
            tail = [cur[i] - ref[i] for i in range(args.steps - k, args.steps)]
            a, sg = sum(map(abs, tail)) / k, sum(tail) / k
            absd.append(a); signed.append(sg)
            cells.append(f"{a:.4f} ({sg:+.4f})")
        rows.append({"config": c, "abs": absd, "signed": signed})
        print(f"{c:8} " + " ".join(f"{x:>17}" for x in cells) +
              f"   {sum(absd) / len(absd):.4f}      {sum(signed) / len(signed):+.4f}")
    # How the gap grows: mean |diff| in each 50-step window, the range over seeds.
    for c in configs[1:]:
        cells = []
        for w0 in range(0, args.steps, 50):
            w1 = min(w0 + 50, args.steps)
            per_seed = [sum(abs(curves[(s, c)][i] - curves[(s, "f32")][i]) for i in range(w0, w1)) / (w1 - w0)
                        for s in args.seeds]
            cells.append(f"{w0 + 1}-{w1}: {min(per_seed):.4f}-{max(per_seed):.4f}")
        print(f"{c:8} windows  " + "  ".join(cells))
    finals = " ".join(f"{curves[(s, 'f32')][-1]:.4f}" for s in args.seeds)
    print(f"f32 final losses by seed: {finals}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "curves": {f"{s}:{c}": l for (s, c), l in curves.items()}}, f)


if __name__ == "__main__":
    main()
