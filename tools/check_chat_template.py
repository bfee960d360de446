#!/usr/bin/env python3
"""Checks Ingot's rendering of chat templates against transformers' (jinja2, as apply_chat_template
runs it), token id for token id, on a set of conversations (the loss mask is not compared). A
template whose every conversation matches ("match (8 of 8 ...)", exit 0) may join kCheckedTemplates
in src/ingot/data/chat_format.cpp under the hash printed here, after which Ingot (rebuilt) takes it
without --chat-format. A template that refuses a conversation, or that Ingot refuses, fails.

Usage: python3 tools/check_chat_template.py --ingot build/ingot --tokenizer DIR [--chat-format NAME] TEMPLATE...
  TEMPLATE   a tokenizer_config.json, or a folder holding one (its chat_template.jinja wins, as in
             transformers)
  --tokenizer the tokenizer.json (or its folder) to encode with; it must hold the template's tokens
  --chat-format  passed to `ingot prepare` (needed for a template not yet checked)
Needs: pip install jinja2 tokenizers. Prints one line a template: hash, verdict, matching cases.
"""
import argparse
import datetime
import json
import os
import struct
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "What is a token?"},
              {"role": "assistant", "content": "A piece of text the model reads as one unit."}],
    "system": [{"role": "system", "content": "Answer in one word."},
               {"role": "user", "content": "Colour of the sky?"}, {"role": "assistant", "content": "Blue."}],
    "turns": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "one"},
              {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"},
              {"role": "assistant", "content": "four"}],
    "turns_no_system": [{"role": "user", "content": "x?"}, {"role": "assistant", "content": " y "},
                        {"role": "user", "content": "z?\n"}, {"role": "assistant", "content": "w"}],
    "whitespace": [{"role": "system", "content": " \tspaced system\n"}, {"role": "user", "content": "\n\n  ask  \n"},
                   {"role": "assistant", "content": "\n reply\twith tab\n\n "}],
    "think": [{"role": "user", "content": "Why?"},
              {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."}],
    "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "hello"},
                     {"role": "assistant", "content": "hi"}],
    "ends_on_user": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"},
                     {"role": "user", "content": "second"}],
}


def fnv1a64(text):
    """Ingot's chat_template_hash: of the text as Jinja reads it (CR LF and CR as LF, one final
    newline dropped)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.endswith("\n"):
        text = text[:-1]
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def token_text(value):
    return value.get("content") if isinstance(value, dict) else value


def load_template(path):
    config_path = os.path.join(path, "tokenizer_config.json") if os.path.isdir(path) else path
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    jinja_path = os.path.join(os.path.dirname(config_path), "chat_template.jinja")
    template = config.get("chat_template")
    if os.path.exists(jinja_path) and (os.path.basename(config_path) == "tokenizer_config.json" or template is None):
        with open(jinja_path, encoding="utf-8", newline="") as f:  # the bytes Ingot hashes
            template = f.read()
    if isinstance(template, list):
        template = next(t["template"] for t in template if t.get("name") == "default")
    return config, template


def render(config, template, messages):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(x, indent=indent,
                                                                                      ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda pattern: datetime.datetime.now().strftime(pattern)
    special = {key: token_text(config.get(key)) or "" for key in
               ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")}
    return env.from_string(template).render(messages=messages, add_generation_prompt=False, **special)


def shard_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    width, count = struct.unpack_from("<I", data, 12)[0], struct.unpack_from("<Q", data, 16)[0]
    return list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, 40))


def check(args, template_path, tokenizer):
    config, template = load_template(template_path)
    matched, verdict = [], ""
    with tempfile.TemporaryDirectory() as work:
        for name, messages in CONVERSATIONS.items():
            try:
                expected = tokenizer.encode(render(config, template, messages), add_special_tokens=False).ids
            except jinja2.exceptions.TemplateError as error:  # Ingot would render it all the same
                verdict = verdict or "TEMPLATE ERROR in %s: %s" % (name, error)
                continue
            records = os.path.join(work, name + ".jsonl")
            with open(records, "w", encoding="utf-8") as f:
                f.write(json.dumps({"messages": messages}) + "\n")
            command = [args.ingot, "prepare", records, "--format", "chat", "--tokenizer", args.tokenizer,
                       "--chat-template", template_path, "-o", os.path.join(work, name), "--threads", "1"]
            if args.chat_format:
                command += ["--chat-format", args.chat_format]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                lines = (run.stderr or run.stdout).strip().splitlines()
                return fnv1a64(template), "refused: " + (lines[-1] if lines else "exit %d" % run.returncode), []
            got = shard_tokens(os.path.join(work, name, "train-00000.bin"))
            if got == expected:
                matched.append(name)
            else:
                verdict = verdict or "MISMATCH in %s: transformers %r, ingot %r" % (
                    name, tokenizer.decode(expected, skip_special_tokens=False)[:300],
                    tokenizer.decode(got, skip_special_tokens=False)[:300])
    return fnv1a64(template), verdict or "match", matched


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ingot", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--chat-format", default="")
    parser.add_argument("templates", nargs="+")
    args = parser.parse_args()
    tokenizer_file = os.path.join(args.tokenizer, "tokenizer.json") if os.path.isdir(args.tokenizer) else args.tokenizer
    tokenizer = Tokenizer.from_file(tokenizer_file)
    failed = False
    for path in args.templates:
        digest, verdict, matched = check(args, path, tokenizer)
        print("0x%016x  %s  %s (%d of %d conversations: %s)" % (digest, path, verdict, len(matched),
                                                             len(CONVERSATIONS), " ".join(matched)))
        failed |= verdict != "match"
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
