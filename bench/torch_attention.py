"""PyTorch's own attention kernels at the peer shapes, for comparison with Ingot's (docs/perf.md).

Times F.scaled_dot_product_attention (causal, GQA, bf16, B = 4, T = 4096) on each SDPA backend that
takes the shape: the forward, and forward + backward minus the forward. Then it checks whether the
backward repeats bit for bit over five calls. With --deterministic, torch.use_deterministic_algorithms
is on, as a peer that wants reproducible runs would set it (PyTorch then refuses the backends that
are not deterministic).

    python3 bench/torch_attention.py [--deterministic]

TFLOP/s count causal FLOPs as Ingot does: forward 4·B·Hq·T²·D / 2, backward 2.5 times that.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS = [("llama-3.2-1b", 32, 8, 64), ("qwen3-0.6b", 16, 8, 128), ("qwen2.5-0.5b", 14, 2, 64)]
BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def median_ms(fn, repeats=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(args.deterministic)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}, "
          f"deterministic algorithms {'on' if args.deterministic else 'off'}")
    print("heads        | backend             | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | bwd repeats bitwise")
    batch, seq = 4, 4096
    for name, hq, hkv, dim in HEADS:
        torch.manual_seed(0)
        q = torch.randn(batch, hq, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(batch, hkv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(batch, hkv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(batch, hq, seq, dim, device="cuda", dtype=torch.bfloat16)
        fwd_flops = 4 * batch * hq * seq * seq * dim / 2

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def forward_backward():
            return torch.autograd.grad(forward(), (q, k, v), dout)

        for backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    fwd = median_ms(forward)
                    bwd = median_ms(forward_backward) - fwd
                    grads = [forward_backward() for _ in range(5)]
            except RuntimeError as error:
                print(f"{name:12s} | {backend.name:19s} | not available: {str(error).splitlines()[0][:80]}")
                continue
            repeats = all(torch.equal(g[i], grads[0][i]) for g in grads for i in range(3))
            print(f"{name:12s} | {backend.name:19s} | {fwd:6.3f} | {fwd_flops / fwd / 1e9:11.0f} | {bwd:6.3f} | "
                  f"{2.5 * fwd_flops / bwd / 1e9:11.0f} | {'yes' if repeats else 'no'}")


if __name__ == "__main__":
    main()
