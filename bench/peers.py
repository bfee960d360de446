#!/usr/bin/env python3
"""The peer side of Ingot's speed benchmark: a training step of Hugging Face transformers.

A randomly initialised model of a public architecture (bench/presets.py; no download), bf16
weights, SDPA attention, torch.optim.AdamW(fused=True, lr=1e-4); one step is
    loss = model(input_ids, labels=labels).loss; loss.backward();
    clip_grad_norm_(params, 1.0); opt.step(); opt.zero_grad(set_to_none=True)
in mode "eager" or "compile" (torch.compile(model)). Random token ids (never zeros), a fresh batch
each step. With --packed-doc-len N the rows are packed with documents as `ingot bench
--packed-doc-len N` packs them (bench/presets.py, the same draws): position_ids restart at each
document, from which transformers derives the document mask (padding-free training without a
data collator; with SDPA that is a dense boolean mask), and MFU counts the pairs that attend. After the warm-up steps, peak memory is reset and >= 10 steps are timed with CUDA events;
the median step time gives tokens/s = B*T/median and MFU (bench/presets.py, DESIGN.md).

Prints one JSON line per measurement and appends it to --json-out; an out-of-memory error becomes a
row with "oom": true, any other failure a row with "error".

  python3 bench/peers.py --preset llama-3.2-1b [--modes eager,compile] [--seq 4096] [--micro-batch 4]
                         [--steps 10] [--json-out FILE] [--device cuda|cpu] [--packed-doc-len N]
  python3 bench/peers.py --preset qwen3-0.6b --write-config DIR   # DIR/config.json, for `ingot bench`
  python3 bench/peers.py --check                                 # shapes vs the public param counts
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import presets  # noqa: E402


def log(*args):
    print("#", *args, flush=True)


def emit(row, json_out):
    line = json.dumps(row)
    print(line, flush=True)
    if json_out:
        with open(json_out, "a") as f:
            f.write(line + "\n")


def hf_config(cfg_dict):
    import transformers
    d = {k: v for k, v in cfg_dict.items() if k != "architectures"}
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    config.use_cache = False
    # transformers 5 folds rope_theta/rope_scaling into rope_parameters; make sure it understood them.
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    want = cfg_dict.get("rope_scaling") or {}
    if theta != cfg_dict["rope_theta"] or any(rope.get(k) != v for k, v in want.items()):
        raise RuntimeError(f"transformers built RoPE {rope} (theta {theta}), expected {want} theta {cfg_dict['rope_theta']}")
    return config


def build_model(cfg_dict, device):
    import torch
    import transformers
    config = hf_config(cfg_dict)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.bfloat16)
    model = model.to(device=device, dtype=torch.bfloat16)
    model.train()
    return model


def linear_weight_count(model):
    """Sum over every nn.Linear of its weight's size, a tied LM head included (module walk, no dedup)."""
    import torch
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _graph_count():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(name, cfg_dict, mode, args, info):
    import torch
    device = args.device
    cuda = device.startswith("cuda")
    torch.manual_seed(args.seed)
    t_build = time.perf_counter()
    model = build_model(cfg_dict, device)
    n_linear = linear_weight_count(model)
    n_formula = presets.n_matmul(cfg_dict)
    if n_linear != n_formula:
        log(f"WARNING {name}: nn.Linear weights {n_linear} != N_matmul formula {n_formula}")
    n_params = sum(p.numel() for p in model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        fused = True
    except (RuntimeError, TypeError) as e:  # fused AdamW needs CUDA (or a recent CPU build)
        log(f"fused AdamW unavailable on {device} ({e}); using foreach")
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        fused = False
    step_model = torch.compile(model) if mode == "compile" else model
    sync(device)
    build_s = time.perf_counter() - t_build

    B, T = args.micro_batch, args.seq
    V = cfg_dict["vocab_size"]
    warmup = args.warmup if args.warmup is not None else (args.warmup_compile if mode == "compile" else args.warmup_eager)
    n_total = warmup + args.steps
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 1)
    # Random ids in [1, V): never zeros. One batch per step, made before any timing.
    batches = [torch.randint(1, V, (B, T), device=device, generator=gen) for _ in range(n_total)]
    position_ids, flops = None, presets.flops_per_token(cfg_dict, T)
    if args.packed_doc_len:
        positions = presets.packed_positions(B, T, args.packed_doc_len)
        position_ids = torch.tensor(positions, device=device)
        mean_keys = sum(p + 1 for row in positions for p in row) / (B * T)
        flops = presets.flops_per_token_attending(cfg_dict, mean_keys)
        try:  # what transformers makes of them: one id per document
            from transformers.masking_utils import find_packed_sequence_indices
            docs = find_packed_sequence_indices(position_ids)
            docs = "none (one sequence a row)" if docs is None else int((docs[:, -1] + 1).sum())
        except ImportError:
            docs = "unknown (no transformers.masking_utils)"
        log(f"packed rows: {sum(p == 0 for row in positions for p in row)} documents, "
            f"{mean_keys:.1f} keys a token on average; transformers sees {docs} documents")

    def step(ids):
        loss = step_model(ids, labels=ids, position_ids=position_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_warm = time.perf_counter()
    first_loss = None
    for i in range(warmup):
        loss = step(batches[i])
        if i == 0:
            first_loss = loss
    sync(device)
    warmup_s = time.perf_counter() - t_warm

    graphs_before = _graph_count()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.steps)]
    losses, host_ms = [], []
    t0 = time.perf_counter()
    for i in range(args.steps):
        ts = time.perf_counter()
        if cuda:
            events[i][0].record()
        losses.append(step(batches[warmup + i]))
        if cuda:
            events[i][1].record()
        else:
            host_ms.append((time.perf_counter() - ts) * 1e3)
    sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    graphs_timed = _graph_count() - graphs_before
    step_times = [a.elapsed_time(b) for a, b in events] if cuda else host_ms
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    median_ms = statistics.median(step_times)
    tokens_per_s = B * T / (median_ms / 1e3)
    loss_values = [float(x) for x in losses]
    row = {
        "system": f"transformers-{mode}", "model": name, "seq": T, "micro_batch": B,
        "tokens_per_s": round(tokens_per_s, 1), "mfu": round(tokens_per_s * flops / presets.PEAK_FLOPS, 6),
        "step_ms": round(median_ms, 3), "peak_gib": None if peak_gib is None else round(peak_gib, 3),
        "step_ms_mean_wall": round(wall_ms, 3),
        "step_ms_min": round(min(step_times), 3), "step_ms_max": round(max(step_times), 3),
        "steps": args.steps, "warmup": warmup, "warmup_s": round(warmup_s, 1), "build_s": round(build_s, 1),
        "first_loss": None if first_loss is None else round(float(first_loss), 4),
        "last_loss": round(loss_values[-1], 4),
        "n_params": n_params, "n_matmul": n_formula,
        "flops_per_token": flops,
        "fused_adamw": fused, "device": device, **info,
    }
    if args.packed_doc_len:
        row["packed_doc_len"] = args.packed_doc_len
    if mode == "compile" and graphs_timed:
        row["graphs_compiled_while_timed"] = graphs_timed  # recompilation inside the timed steps
    if not all(math.isfinite(x) for x in loss_values):
        row["error"] = "non-finite loss"
    return row


def free_memory():
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_one(name, cfg_dict, mode, args, info):
    import torch
    base = {"system": f"transformers-{mode}", "model": name, "seq": args.seq, "micro_batch": args.micro_batch,
            "tokens_per_s": None, "mfu": None, "step_ms": None, "peak_gib": None, **info}
    try:
        row = measure(name, cfg_dict, mode, args, info)
    except Exception as e:  # report, do not crash: the other measurements still run
        first_line = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
        if isinstance(e, oom_type) or "out of memory" in str(e).lower():
            row = dict(base, oom=True, error=f"out of memory: {first_line}")
            if torch.cuda.is_available():
                row["peak_gib_at_oom"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        else:
            traceback.print_exc()
            row = dict(base, error=f"{type(e).__name__}: {first_line}")
    if mode == "compile":
        torch._dynamo.reset()
    free_memory()
    return row


def env_info(device):
    import torch
    import transformers
    info = {"torch": torch.__version__, "transformers": transformers.__version__}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    else:
        import platform
        info["gpu"] = f"none (CPU: {platform.processor() or platform.machine()})"
    return info


def check(names):
    """Build each preset on the meta device and compare with the public checkpoints' sizes."""
    import torch
    import transformers
    ok = True
    for name in names:
        cfg = presets.get(name)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation="sdpa")
        n = sum(p.numel() for p in model.parameters())
        n_lin = linear_weight_count(model)
        want = presets.PUBLIC_PARAM_COUNTS.get(name)
        good = n_lin == presets.n_matmul(cfg) and (want is None or n == want)
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {name:14s} {type(model).__name__:18s} params {n:>13,d}"
              f" (public {want if want is None else format(want, ',d')})  nn.Linear weights {n_lin:>13,d}"
              f"  N_matmul {presets.n_matmul(cfg):>13,d}  FLOPs/token@4096 {presets.flops_per_token(cfg, 4096) / 1e9:.3f}G")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="llama-3.2-1b",
                   help="comma-separated preset names (%s) or config dirs" % ", ".join(presets.PRESETS))
    p.add_argument("--modes", default="eager,compile", help="eager, compile or both (comma-separated)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="timed steps (>= 10 for reported numbers)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps for every mode (overrides the two below)")
    p.add_argument("--warmup-eager", type=int, default=3)
    p.add_argument("--warmup-compile", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--packed-doc-len", type=int, default=0,
                   help="pack rows with documents of mean length N, as `ingot bench --packed-doc-len` (0: whole rows)")
    p.add_argument("--json-out", help="append each JSON row to this file")
    p.add_argument("--write-config", metavar="DIR", help="write the preset's config.json into DIR and exit")
    p.add_argument("--check", action="store_true", help="check the preset shapes on the meta device and exit")
    args = p.parse_args()

    names = [n for n in args.preset.split(",") if n]
    if args.write_config:
        if len(names) != 1:
            raise SystemExit("--write-config takes one preset")
        print(presets.write_config(names[0], args.write_config))
        return 0
    if args.check:
        return 0 if check([n for n in presets.PRESETS if not n.startswith("tiny")] if args.preset == "all" else names) else 1

    import torch
    import transformers
    if not 0 <= args.packed_doc_len <= args.seq:
        raise SystemExit(f"--packed-doc-len must lie in [1, --seq {args.seq}] (0: whole rows), got {args.packed_doc_len}")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("eager", "compile"):
            raise SystemExit(f"unknown mode {m!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        info = {"torch": torch.__version__, "transformers": transformers.__version__, "gpu": None}
        for name in names:
            for mode in modes:
                emit({"system": f"transformers-{mode}", "model": name, "seq": args.seq,
                      "micro_batch": args.micro_batch, "tokens_per_s": None, "mfu": None, "step_ms": None,
                      "peak_gib": None, "error": "CUDA not available", **info}, args.json_out)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    info = env_info(args.device)
    log(f"torch {info['torch']}  transformers {info['transformers']}  device {args.device}  gpu {info['gpu']}")
    failed = False
    for name in names:
        cfg = presets.load(name)
        label = name if name in presets.PRESETS else os.path.basename(os.path.normpath(name))
        for mode in modes:
            log(f"{label} {mode}: seq {args.seq} x micro-batch {args.micro_batch}, "
                f"{args.steps} timed steps; N_matmul {presets.n_matmul(cfg) / 1e6:.1f}M")
            row = run_one(label, cfg, mode, args, info)
            emit(row, args.json_out)
            failed |= bool(row.get("error"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
