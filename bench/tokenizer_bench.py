#!/usr/bin/env python3
"""Tokenizer throughput: Ingot's BpeTokenizer vs Hugging Face `tokenizers`, same text, same run.

The text mixes English prose (the `fortunes` package when installed, else generated), source code
(this repository's own files) and generated multilingual text (CJK, emoji, numbers), split into
documents at blank lines. Both sides encode every document without special tokens; the token
counts must agree. Each measurement is the best of 3 passes. "MB per CPU-second" divides the bytes by
the process CPU time of the pass: the per-core rate, which other load on the machine does not skew.
  Ingot: build/tests/ingot_tests, test BpeTokenizer.DISABLED_Bench (encode_batch, N threads).
  HF:    Tokenizer.encode_batch (and encode_batch_fast, which skips offsets) in a subprocess with
         RAYON_NUM_THREADS=N.

Usage: python3 bench/tokenizer_bench.py [--build build] [--tokenizer ../shared/data/tokenizers/qwen3]
                                        [--mb 8] [--threads 1,2]
"""
import argparse
import datetime
import glob
import os
import platform
import random
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_text(target_bytes):
    parts = []
    fortunes = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if "." not in os.path.basename(f))
    for f in fortunes:
        try:
            with open(f, encoding="utf-8") as fh:
                parts.append(fh.read().replace("\n%\n", "\n\n"))
        except (UnicodeDecodeError, IsADirectoryError):
            pass
    prose = "".join(parts)
    code = []
    for pattern in ("src/**/*.cpp", "src/**/*.h", "tests/**/*.cpp", "tools/*.py", "bench/*.py"):
        for f in sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True)):
            if f.endswith(".inc"):
                continue
            with open(f, encoding="utf-8", errors="replace") as fh:
                code.append(fh.read())
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import tokenizer_parity  # the parity corpus generator: multilingual, emoji, numbers
    multi = "\n\n".join(tokenizer_parity.random_cases(3000, seed=5))
    if not prose:
        rng = random.Random(1)
        prose = "\n\n".join(" ".join(rng.choice(tokenizer_parity.WORDS) for _ in range(rng.randint(20, 200))) + "."
                            for _ in range(5000))
    unit = prose + "\n\n" + "\n\n".join(code) + "\n\n" + multi + "\n\n"
    # Whole copies while they fit, then the next copy's documents up to --mb: the code part grows
    # with the repository, and whole copies alone left --mb 8 at one 4.6 MB copy.
    unit_bytes = len(unit.encode("utf-8"))
    copies = max(1, target_bytes // unit_bytes)
    text = unit * copies
    if copies * unit_bytes < target_bytes:
        rest = unit.encode("utf-8")[:target_bytes - copies * unit_bytes]
        cut = rest.rfind(b"\n\n")
        text += rest[:cut + 2].decode("utf-8") if cut > 0 else ""
    return text, {"prose": len(prose.encode()), "code": sum(len(c.encode()) for c in code),
                  "multilingual": len(multi.encode())}


def split_docs(text):
    docs, pos = [], 0
    while pos < len(text):
        end = text.find("\n\n", pos)
        end = len(text) if end < 0 else end + 2
        docs.append(text[pos:end])
        pos = end
    return docs


def hf_worker(tokenizer_json, text_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    with open(text_path, encoding="utf-8", newline="") as f:
        text = f.read()
    docs = split_docs(text)
    size = len(text.encode("utf-8"))
    for label, encode in (("hf", tok.encode_batch), ("hf_fast", getattr(tok, "encode_batch_fast", None))):
        if encode is None:
            continue
        best, best_cpu, tokens = 1e30, 1e30, 0
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            out = encode(docs, add_special_tokens=False)
            best_cpu = min(best_cpu, time.process_time() - c0)
            best = min(best, time.perf_counter() - t0)
            tokens = sum(len(e.ids) for e in out)
        print("BENCH %s bytes=%d docs=%d tokens=%d seconds=%.4f MB/s=%.2f MB/cpu-s=%.2f" % (
            label, size, len(docs), tokens, best, size / best / 1e6, size / best_cpu / 1e6))


def parse(line):
    return {k: v for k, v in re.findall(r"(\S+)=(\S+)", line)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    shared = os.environ.get("INGOT_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
    parser.add_argument("--tokenizer", default=os.path.join(shared, "data", "tokenizers", "qwen3"))
    parser.add_argument("--mb", type=float, default=8)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--hf-worker", nargs=2, metavar=("TOKENIZER_JSON", "TEXT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_worker:
        return hf_worker(*args.hf_worker)
    tokenizer_json = args.tokenizer
    if os.path.isdir(tokenizer_json):
        tokenizer_json = os.path.join(tokenizer_json, "tokenizer.json")
    if not os.path.isfile(tokenizer_json):
        sys.exit(f"no tokenizer.json at {tokenizer_json}: pass --tokenizer (tests/fixtures/chat/llama3_tokenizer "
                 "is in the repository)")
    if not os.path.isfile(os.path.join(args.build, "tests", "ingot_tests")):
        sys.exit(f"no {args.build}/tests/ingot_tests: build first (make build) or pass --build BUILD_DIR")
    text, mix = build_text(int(args.mb * 1e6))
    text_path = os.path.join(args.build, "tokenizer_bench.txt")
    with open(text_path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    import tokenizers
    print("date: %s; host: %s, %d cores (%s); tokenizers %s; tokenizer %s" % (
        datetime.date.today(), platform.processor() or platform.machine(), os.cpu_count(), cpu_name(),
        tokenizers.__version__, tokenizer_json))
    print("text: %.1f MB in %d documents (one unit: %s, repeated)" % (
        len(text.encode()) / 1e6, len(split_docs(text)), ", ".join("%s %.2f MB" % (k, v / 1e6) for k, v in mix.items())))
    print("| threads | Ingot MB/s | HF encode_batch MB/s | HF encode_batch_fast MB/s | Ingot/HF | Ingot/HF fast "
          "| Ingot MB per CPU-second | HF MB per CPU-second | token counts equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    tests = os.path.join(args.build, "tests", "ingot_tests")
    for n in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ, INGOT_TOKENIZER_BENCH_TEXT=text_path, INGOT_TOKENIZER_BENCH_JSON=tokenizer_json,
                   INGOT_TOKENIZER_BENCH_THREADS=str(n))
        out = subprocess.run([tests, "--gtest_also_run_disabled_tests", "--gtest_filter=BpeTokenizer.DISABLED_Bench"],
                             env=env, capture_output=True, text=True).stdout
        ingot = parse(next(l for l in out.splitlines() if l.startswith("BENCH ingot")))
        env = dict(os.environ, RAYON_NUM_THREADS=str(n), TOKENIZERS_PARALLELISM="true")
        out = subprocess.run([sys.executable, __file__, "--hf-worker", tokenizer_json, text_path], env=env,
                             capture_output=True, text=True).stdout
        hf = parse(next(l for l in out.splitlines() if l.startswith("BENCH hf ")))
        fast = [parse(l) for l in out.splitlines() if l.startswith("BENCH hf_fast ")]
        a, b = float(ingot["MB/s"]), float(hf["MB/s"])
        c = float(fast[0]["MB/s"]) if fast else float("nan")
        same = all(x["tokens"] == ingot["tokens"] for x in [hf] + fast)
        print("| %d | %.2f | %.2f | %.2f | %.2fx | %.2fx | %s | %s | %s |" % (
            n, a, b, c, a / b, a / c, ingot["MB/cpu-s"], hf["MB/cpu-s"],
            "yes" if same else "NO (%s vs %s)" % (ingot["tokens"], hf["tokens"])))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
