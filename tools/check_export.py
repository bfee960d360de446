#!/usr/bin/env python3
"""Check a model directory exported by Ingot against a Hugging Face fixture.

Usage:  python3 tools/check_export.py EXPORT_DIR FIXTURE_DIR [--tol 1e-6]

Loads EXPORT_DIR (config.json + *.safetensors) with transformers' AutoModelForCausalLM, converts it to
float64, applies the same float64 patches as tools/make_hf_fixtures.py (RoPE cos/sin and llama3
inv_freq, RMSNorm, eager softmax in float64), runs FIXTURE_DIR/expected.safetensors "input_ids" and
compares the logits with its "logits". Prints the dtype(s) of the stored weights, the max abs diff and
the norm-wise relative error ||logits - expected|| / ||expected||. Exits 1 if the relative error
exceeds --tol (default 1e-6: an export may store weights in float32), 2 on a load error.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import patch_float64  # noqa: E402


def stored_dtypes(export_dir: str) -> dict:
    from safetensors import safe_open
    counts: dict = {}
    for path in sorted(glob.glob(os.path.join(export_dir, "*.safetensors"))):
        if os.path.basename(path) == "expected.safetensors":   # a fixture dir used as EXPORT_DIR
            continue
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                dt = str(f.get_slice(name).get_dtype())
                counts[dt] = counts.get(dt, 0) + 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir")
    ap.add_argument("fixture_dir")
    ap.add_argument("--tol", type=float, default=1e-6, help="max norm-wise relative error of the logits")
    args = ap.parse_args()

    import transformers
    from safetensors.torch import load_file

    try:
        expected = load_file(os.path.join(args.fixture_dir, "expected.safetensors"))
        print(f"stored weight dtypes in {args.export_dir}: {stored_dtypes(args.export_dir)}")
        model = transformers.AutoModelForCausalLM.from_pretrained(args.export_dir, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: cannot load: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    loaded = sorted({str(p.dtype) for p in model.parameters()})
    print(f"loaded as {type(model).__name__}, parameter dtype(s) {loaded}; converting to float64")
    model = model.double().eval()
    model.config._attn_implementation = "eager"
    patch_float64(model)

    input_ids = expected["input_ids"]
    want = expected["logits"]
    with torch.no_grad():
        got = model(input_ids=input_ids, use_cache=False).logits
    if got.shape != want.shape:
        print(f"FAIL: logits shape {tuple(got.shape)} != expected {tuple(want.shape)}")
        return 1
    max_abs = (got - want).abs().max().item()
    rel = ((got - want).norm() / want.norm()).item()
    print(f"logits {tuple(got.shape)}: max abs diff {max_abs:.3e}, relative error {rel:.3e} (tol {args.tol:g})")
    if not rel <= args.tol:   # also catches NaN
        print("FAIL")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
