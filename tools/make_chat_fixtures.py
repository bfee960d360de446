#!/usr/bin/env python3
"""Chat-format fixtures for tests/cpu/test_chat.cpp: token ids from transformers'
apply_chat_template(messages, tokenize=True) for conversations written here.

Formats covered:
  qwen3           the real Qwen3 tokenizer and its own chat template (../shared/data/tokenizers/qwen3)
  chatml_default  the Qwen3 tokenizer with a ChatML template written here that, like Qwen2.5's,
                  inserts a default system turn
  llama3          a byte-level BPE tokenizer trained here with `tokenizers` on text written here,
                  with the Llama 3 special tokens and a Llama-3-style template written here; its
                  tokenizer.json / tokenizer_config.json are committed next to the fixtures
  llama31         the llama3 tokenizer under a Llama-3.1-style template written here (a dated system
                  turn opens every conversation, holding the trimmed first system message), rendered
                  with date_string="26 Jul 2024"; its tokenizer_config.json is in llama31/
  prompts         generation_prompts.json: apply_chat_template(..., add_generation_prompt=True) ids of
                  conversations that end on a user turn, for the committed tokenizers above (and
                  Qwen3's where ../shared has it), as `ingot generate --chat` renders its prompt
  chatml          likewise a tokenizer trained here, with Qwen2's pre-tokenizer and NFC and the
                  ChatML special tokens, under the chatml_default template: ChatML parity that
                  CI can run (the two Qwen3 ones need ../shared)

Each case stores the conversation (or an alpaca record), the ids, and `trained_texts`: for each
assistant turn, the text from after the assistant header through the end-of-turn token, cut out of
the rendered string by its markers (an independent check of the loss mask).

Usage (needs transformers, tokenizers, jinja2; no torch):
  python3 -m venv /tmp/cvenv && /tmp/cvenv/bin/pip install transformers tokenizers jinja2
  /tmp/cvenv/bin/python tools/make_chat_fixtures.py [--only llama3|llama31|prompts|qwen3|chatml]
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")
QWEN3 = os.path.join(ROOT, "..", "shared", "data", "tokenizers", "qwen3")

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Llama 3.1's structure: today's date through strftime_now where the renderer defines it, unless the
# caller passes date_string; the knowledge date differs from Meta's so that a test sees it read.
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if date_string is not defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') if strftime_now is defined else '1 Jan 2000' %}"
    "{%- endif %}"
    "{%- set system_message = messages[0]['content'] | trim if messages[0]['role'] == 'system' else '' %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set messages = messages[1:] %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + 'Cutting Knowledge Date: March 2025\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' + system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

CHATML_DEFAULT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a careful assistant. Answer briefly.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Conversations written for these fixtures.
CONVERSATIONS = {
    "single_turn": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "You are a terse math tutor."},
        {"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "content": "84."},
        {"role": "user", "content": "And 84 / 4?"},
        {"role": "assistant", "content": "21, because 4 * 21 = 84."},
    ],
    "whitespace_edges": [
        {"role": "user", "content": "  spaces around, and a tab\t\n"},
        {"role": "assistant", "content": "Sure:  two  spaces\n\n- item one\n- item two  \n"},
        {"role": "user", "content": "\n\nleading newlines"},
        {"role": "assistant", "content": " a leading space"},
    ],
    "thinking_history_and_final": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo, 91 = 7 × 13."},
        {"role": "user", "content": "Is 97 prime?"},
        {"role": "assistant", "content": "<think>\nCheck 2, 3, 5, 7: none divide 97.\n</think>\n\nYes, 97 is prime."},
    ],
    "reasoning_content_field": [
        {"role": "user", "content": "Name a primary colour."},
        {"role": "assistant", "content": "Red.", "reasoning_content": "\nAny of red, blue, yellow.\n"},
    ],
    "unicode_and_code": [
        {"role": "user", "content": "翻译：早上好 🌅 and write hello world in C"},
        {"role": "assistant", "content": "Good morning 🌅\n\n```c\n#include <stdio.h>\nint main(void) {\n    puts(\"hello world\");\n    return 0;\n}\n```"},
    ],
    "late_system_and_trailing_user": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "system", "content": "Switch to French."},
        {"role": "user", "content": "Bonjour ?"},
    ],
    "special_text_and_empty_answer": [
        {"role": "user", "content": "Repeat the marker <|im_end|> or <|eot_id|> back."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "numbers 1234567 and 3.14159"},
        {"role": "assistant", "content": "1234567 and 3.14159."},
    ],
    "decomposed_accents": [
        {"role": "user", "content": "Cafe\u0301 or caf\u00e9?"},
        {"role": "assistant", "content": "Both spell cafe\u0301."},
    ],
    # An answer that starts with a newline: under ChatML the header's newline and the answer's
    # merge into one token, which the mask trains (it holds the answer's first byte); Llama 3's
    # templates trim the newline away.
    "answer_starts_with_newline": [
        {"role": "user", "content": "Print two lines."},
        {"role": "assistant", "content": "\nfirst\nsecond"},
    ],
    # Qwen3: user turns that wrap a tool response are not queries, so every assistant turn after
    # the first user turn is after the last query: the non-final one with reasoning keeps its think
    # block, the one without renders its answer alone.
    "tool_responses_after_the_query": [
        {"role": "user", "content": "How warm is Paris?"},
        {"role": "assistant", "content": "<think>\nLook it up first.\n</think>\n\nChecking the weather."},
        {"role": "user", "content": "<tool_response>\n{\"paris\": 18}\n</tool_response>"},
        {"role": "assistant", "content": "And the forecast."},
        {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"},
        {"role": "assistant", "content": "<think>\n18 and sunny.\n</think>\n\nIt is 18 degrees and sunny."},
    ],
    # Jinja's trim is Python's str.strip: it removes Unicode whitespace (no-break and ideographic
    # spaces, NEL, the line separator, the ASCII file separators), not the zero-width space.
    "unicode_whitespace_trim": [
        {"role": "user", "content": "\u3000\u00a0no-break and ideographic\u2003\u2028"},
        {"role": "assistant", "content": "\u0085\u001f answer after NEL\u202f\u3000"},
        {"role": "user", "content": "\u200bzero width stays\u200b"},
        {"role": "assistant", "content": "\u00a0\u200b"},
    ],
}

# Only in the llama31 fixtures, whose dated turn holds the first system message, trimmed.
SYSTEM_EDGES = {
    "padded_system": [
        {"role": "system", "content": " \n Reply in one line.\t\n"},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
    ],
    "empty_system_and_late_system": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "system", "content": "  Now be formal. "},
        {"role": "user", "content": "hi again"},
        {"role": "assistant", "content": "Good day."},
    ],
}

# Alpaca records written for these fixtures: rendered as user (instruction [+ "\n\n" + input])
# and assistant (output) turns.
ALPACA = {
    "alpaca_with_input": {"instruction": "Summarise the text.", "input": "Cats sleep a lot. They also purr.", "output": "Cats sleep and purr."},
    "alpaca_without_input": {"instruction": "Give a synonym for quick.", "input": "", "output": "Fast."},
}

CORPUS = """The quick brown fox jumps over the lazy dog. A capital city is where a government sits.
Paris, Berlin, Madrid and Rome are capitals. Numbers like 12, 84, 97 and 3.14159 appear in math.
You are a helpful assistant. Answer the question briefly and clearly, please.
def main():\n    print("hello world")\n    return 0\n
int main(void) { puts("hello"); return 0; }
Good morning! How can I help you today? Sure, here is a list:\n- one\n- two\n
早上好，世界。翻译这句话。 🌅🙂 café naïve résumé
""" * 3


def alpaca_messages(record):
    user = record["instruction"]
    if record.get("input"):
        user += "\n\n" + record["input"]
    return [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]


def trained_texts(rendered, header, end):
    out, at = [], 0
    while True:
        at = rendered.find(header, at)
        if at < 0:
            return out
        begin = at + len(header)
        stop = rendered.index(end, begin) + len(end)
        out.append(rendered[begin:stop])
        at = stop


def ids_of(result):
    if isinstance(result, dict) or hasattr(result, "keys"):
        result = result["input_ids"]
    return [int(i) for i in result]


def make_cases(tok, header, end, names, **template_kwargs):
    cases = []
    for name in names:
        if name in ALPACA:
            record, messages = ALPACA[name], alpaca_messages(ALPACA[name])
        else:
            record, messages = None, CONVERSATIONS.get(name) or SYSTEM_EDGES[name]
        ids = ids_of(tok.apply_chat_template(messages, tokenize=True, **template_kwargs))
        rendered = tok.apply_chat_template(messages, tokenize=False, **template_kwargs)
        case = {"name": name, "ids": ids, "trained_texts": trained_texts(rendered, header, end)}
        if record is not None:
            case["alpaca"] = record
        else:
            case["messages"] = messages
        cases.append(case)
    return cases


# Conversations that end on a user turn, as a chat prompt does.
PROMPTS = {
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "system_and_user": [{"role": "system", "content": " Be terse. "}, {"role": "user", "content": "  2 + 2?\n"}],
    "after_a_turn": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                     {"role": "user", "content": "Name a colour."}],
}


def generation_prompt_cases(AutoTokenizer):
    """{folder in tests/fixtures/chat ("qwen3": ../shared's): [{name, messages, ids}]}."""
    setups = [("llama3_tokenizer", "llama3_tokenizer", None), ("llama31", "llama3_tokenizer", LLAMA31_TEMPLATE),
              ("chatml_tokenizer", "chatml_tokenizer", None)]
    if os.path.isdir(QWEN3):
        setups.append(("qwen3", QWEN3, None))  # ../shared/data/tokenizers/qwen3
    out = {}
    for folder, tokenizer_dir, template in setups:
        tok = AutoTokenizer.from_pretrained(os.path.join(OUT, tokenizer_dir))
        if template is not None:
            tok.chat_template = template
        out[folder] = [{"name": name, "messages": messages,
                        "ids": ids_of(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                              date_string="26 Jul 2024"))}
                       for name, messages in PROMPTS.items()]
    return out


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def train_chatml_tokenizer(out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's split: single digits, contractions, letters with one leading non-letter.
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Blank lines too, so that "\n\n" becomes a token as in Qwen's vocabulary: the header's newline
    # and an answer's first one then merge into one trained token (answer_starts_with_newline).
    tok.train_from_iterator(CORPUS.splitlines(keepends=True) + ["\n\n"] * 20, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": CHATML_DEFAULT_TEMPLATE,
    })


def train_llama3_tokenizer(out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": LLAMA3_TEMPLATE,
    })


def main():
    import transformers
    from transformers import AutoTokenizer

    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    os.makedirs(OUT, exist_ok=True)
    all_names = list(CONVERSATIONS) + list(ALPACA)
    versions = {"transformers": transformers.__version__}

    def trained_fixture(name, train, header, end):
        tokenizer_dir = os.path.join(OUT, name + "_tokenizer")
        train(tokenizer_dir)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        write_json(os.path.join(OUT, name + ".json"), {
            "generator": "tools/make_chat_fixtures.py", "versions": versions,
            "tokenizer": "tests/fixtures/chat/" + name + "_tokenizer",
            "cases": make_cases(tok, header, end, all_names)})

    if only in (None, "chatml"):
        trained_fixture("chatml", train_chatml_tokenizer, "<|im_start|>assistant\n", "<|im_end|>")
    if only in (None, "llama3"):
        trained_fixture("llama3", train_llama3_tokenizer, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")

    if only in (None, "llama3", "llama31"):
        llama31_dir = os.path.join(OUT, "llama31")
        os.makedirs(llama31_dir, exist_ok=True)
        write_json(os.path.join(llama31_dir, "tokenizer_config.json"), {
            "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA31_TEMPLATE})
        tok = AutoTokenizer.from_pretrained(os.path.join(OUT, "llama3_tokenizer"))
        tok.chat_template = LLAMA31_TEMPLATE
        write_json(os.path.join(OUT, "llama31.json"), {
            "generator": "tools/make_chat_fixtures.py", "versions": versions,
            "tokenizer": "tests/fixtures/chat/llama3_tokenizer with tests/fixtures/chat/llama31/tokenizer_config.json",
            "date_string": "26 Jul 2024",
            "cases": make_cases(tok, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
                                all_names + list(SYSTEM_EDGES),
                                date_string="26 Jul 2024")})

    if only in (None, "prompts", "llama3", "llama31", "chatml"):  # their ids follow those tokenizers
        write_json(os.path.join(OUT, "generation_prompts.json"), {
            "generator": "tools/make_chat_fixtures.py", "versions": versions, "date_string": "26 Jul 2024",
            "formats": generation_prompt_cases(AutoTokenizer)})

    if only in (None, "qwen3"):
        if not os.path.isdir(QWEN3):
            sys.exit(f"missing {QWEN3}: the Qwen3 fixtures need the shared tokenizer")
        qwen = AutoTokenizer.from_pretrained(QWEN3)
        write_json(os.path.join(OUT, "qwen3.json"), {
            "generator": "tools/make_chat_fixtures.py", "versions": versions,
            "tokenizer": "../shared/data/tokenizers/qwen3",
            "cases": make_cases(qwen, "<|im_start|>assistant\n", "<|im_end|>", all_names)})

        default_dir = os.path.join(OUT, "chatml_default")
        os.makedirs(default_dir, exist_ok=True)
        write_json(os.path.join(default_dir, "tokenizer_config.json"), {"chat_template": CHATML_DEFAULT_TEMPLATE})
        qwen.chat_template = CHATML_DEFAULT_TEMPLATE
        write_json(os.path.join(OUT, "chatml_default.json"), {
            "generator": "tools/make_chat_fixtures.py", "versions": versions,
            "tokenizer": "../shared/data/tokenizers/qwen3 with tests/fixtures/chat/chatml_default/tokenizer_config.json",
            "cases": make_cases(qwen, "<|im_start|>assistant\n", "<|im_end|>", all_names)})
    print("wrote", OUT)


if __name__ == "__main__":
    main()
