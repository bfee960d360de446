#!/usr/bin/env bash
# Ingot's exports under transformers: the greedy text transformers generates from each export must
# equal `ingot generate`'s (tools/check_export_generate.py, on the CPU). Cases:
#   - the demo run (Llama-style, byte-level), exported in f32 and in bf16, two prompts;
#   - a small Qwen3 (qk-norm, tied embeddings) trained here for 150 steps on Debian's fortunes with
#     the Qwen3 tokenizer of ../shared (skipped without it), exported in bf16 with its tokenizer.
# Prompt plus new tokens stay within the models' 64 positions, where Ingot's window does not slide.
#
# Usage: bash tools/check_exports.sh BUILD_DIR DEMO_RUN_DIR [PYTHON]
#   DEMO_RUN_DIR: a finished `make demo` run (runs/demo); PYTHON: a python with torch and transformers
#   (default python3). Takes about 4 minutes on a 2-core machine, most of it the Qwen3 training.
# Exit status: 0 when every text matches, 1 otherwise.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,13p' "$0"
  exit 2
fi
ingot=$1/ingot
demo=$2
python=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
qwen3_tokenizer=$here/../../shared/data/tokenizers/qwen3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0
# check EXPORT PROMPT NEW_TOKENS: Ingot's greedy text, then transformers' against it.
check() {
  local export_dir=$1 prompt=$2 tokens=$3
  "$ingot" generate "$export_dir" --prompt "$prompt" --max-new-tokens "$tokens" --temperature 0 --device cpu \
    > "$work/ingot.txt" 2> "$work/ingot.err"
  echo "== $(basename "$export_dir"): \"$prompt\", $tokens tokens"
  if ! "$python" "$here/check_export_generate.py" "$export_dir" "$work/ingot.txt" --prompt "$prompt" \
      --max-new-tokens "$tokens" 2> "$work/check.err"; then
    grep -v -i -e warn -e "Loading weights" "$work/check.err" || true
    failed=1
  fi
}

"$ingot" export "$demo" "$work/demo-f32" > /dev/null
"$ingot" export "$demo" "$work/demo-bf16" --dtype bf16 > /dev/null
check "$work/demo-f32" "The meaning of life is" 40
check "$work/demo-f32" "Love is" 50
check "$work/demo-bf16" "The meaning of life is" 40

if [ -f "$qwen3_tokenizer/tokenizer.json" ]; then
  "$ingot" prepare /usr/share/games/fortunes --doc-separator % --tokenizer "$qwen3_tokenizer" -o "$work/q3-data" > /dev/null
  cat > "$work/q3.yaml" <<EOF
model_config:
  model_type: qwen3
  vocab_size: 151936
  hidden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 2
  num_key_value_heads: 1
  head_dim: 32
  max_position_embeddings: 64
  tie_word_embeddings: true
train_data: $work/q3-data
sequence_len: 64
micro_batch_size: 8
max_steps: 150
learning_rate: 3.0e-3
warmup_steps: 20
lr_scheduler_type: cosine
output_dir: $work/q3-run
logging_steps: 50
eval_steps: 0
save_steps: 150
seed: 1
EOF
  "$ingot" train "$work/q3.yaml" > "$work/q3-train.log"
  "$ingot" export "$work/q3-run" "$work/qwen3-bf16" --dtype bf16 > /dev/null
  check "$work/qwen3-bf16" "The meaning of life is" 30
else
  echo "== qwen3: skipped, no $qwen3_tokenizer/tokenizer.json"
fi
exit $failed
