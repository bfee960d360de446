#!/usr/bin/env python3
"""Greedy text from an Ingot export under transformers, against `ingot generate` on the same model.

Usage:  python3 tools/check_export_generate.py EXPORT_DIR INGOT_TEXT_FILE --prompt TEXT --max-new-tokens N

INGOT_TEXT_FILE holds what `ingot generate EXPORT_DIR --prompt TEXT --max-new-tokens N --temperature 0`
printed (the prompt, the continuation and a final newline). This script loads EXPORT_DIR with
transformers' AutoModelForCausalLM in float32, encodes the prompt (bytes for a byte-level model, whose
folder has no tokenizer.json; else the folder's tokenizer with its special tokens), continues it
greedily for N tokens with generate(do_sample=False), and compares the two texts byte for byte.

Keep the prompt plus N within the model's max_position_embeddings: past it Ingot slides its window and
transformers does not, so the texts part there by design. Near ties between the top two logits may
still flip a greedy pick between two float32 implementations; the script prints where the texts part.

Exit status: 0 when the texts are equal, 1 when they differ, 2 when the export does not load.
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("ingot_text_file")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, required=True)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(args.export_dir, dtype=torch.float32)
    except Exception as e:  # any load failure is the export's
        print(f"cannot load {args.export_dir}: {e}", file=sys.stderr)
        return 2
    model.eval()
    byte_level = not os.path.exists(os.path.join(args.export_dir, "tokenizer.json"))
    if byte_level:
        ids = list(args.prompt.encode("utf-8"))
        decode = lambda tokens: bytes(t for t in tokens if t < 256)
    else:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.export_dir)
        ids = tokenizer(args.prompt)["input_ids"]
        decode = lambda tokens: tokenizer.decode(tokens).encode("utf-8")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
    new_tokens = out[0, len(ids):].tolist()
    hf_text = decode(new_tokens)

    with open(args.ingot_text_file, "rb") as f:
        ingot = f.read()
    prompt = args.prompt.encode("utf-8")
    if not ingot.startswith(prompt):
        print(f"{args.ingot_text_file} does not start with the prompt", file=sys.stderr)
        return 2
    ingot_text = ingot[len(prompt):]
    if ingot_text.endswith(b"\n"):
        ingot_text = ingot_text[:-1]  # the newline `ingot generate` ends its output with

    same = 0
    while same < min(len(hf_text), len(ingot_text)) and hf_text[same] == ingot_text[same]:
        same += 1
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{'byte-level' if byte_level else 'tokenizer.json'} model, {len(new_tokens)} new tokens")
    print(f"transformers: {hf_text!r}")
    print(f"ingot:        {ingot_text!r}")
    print(f"{same} of {max(len(hf_text), len(ingot_text))} bytes equal before the first difference")
    return 0 if hf_text == ingot_text else 1


if __name__ == "__main__":
    sys.exit(main())
