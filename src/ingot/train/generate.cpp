#include "ingot/train/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <iostream>
#include <ostream>

#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/byte_tokenizer.h"
#include "ingot/io/hf_model.h"
#include "ingot/model/transformer.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/trainer.h"

namespace ingot {

namespace fs = std::filesystem;

std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& model_dir, const std::string& explicit_path) {
  std::string path = explicit_path;
  if (path.empty() && fs::exists(fs::path(model_dir) / "tokenizer.json")) path = (fs::path(model_dir) / "tokenizer.json").string();
  if (path.empty()) return std::make_unique<data::ByteTokenizer>();
  return std::make_unique<data::BpeTokenizer>(data::BpeTokenizer::from_file(path));
}

std::string TextStream::push(int32_t id) {
  pending_.push_back(id);
  const std::string text = tokenizer_.decode(pending_);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  if (pending_.size() < 4 && text.ends_with(kReplacement)) return "";
  pending_.clear();
  return text;
}

std::string TextStream::flush() {
  const std::string text = pending_.empty() ? std::string() : tokenizer_.decode(pending_);
  pending_.clear();
  return text;
}

static int32_t sample(std::vector<double> logits, double temperature, int64_t top_k, SplitMixRng& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  // Ties broken by id so sampling is reproducible.
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  const double top = logits[order[0]];
  std::vector<double> weights(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += weights[i] = std::exp((logits[order[i]] - top) / temperature);
  double u = rng.uniform() * total;
  for (int64_t i = 0; i < k; ++i) {
    u -= weights[i];
    if (u <= 0) return order[i];
  }
  return order[k - 1];
}

std::string generate_text(const GenerateOptions& o, std::ostream* out) {
  INGOT_CHECK(o.max_new_tokens >= 0, "ingot generate: --max-new-tokens must be 0 or more, got ", o.max_new_tokens);
  INGOT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
              "ingot generate: --temperature must be a finite number >= 0 (0 is greedy), got ", o.temperature);
  INGOT_CHECK(o.top_k >= 0, "ingot generate: --top-k must be 0 (all tokens) or more, got ", o.top_k);
  const std::string dir = resolve_model_dir(o.model_dir);
  const ModelConfig config = load_model_config(dir);
  const auto tokenizer = load_tokenizer(dir, o.tokenizer);
  INGOT_CHECK(tokenizer->vocab_size() <= config.vocab_size, "tokenizer ", tokenizer->name(), " has ",
              tokenizer->vocab_size(), " ids but the model's vocab_size is ", config.vocab_size);
  std::vector<int32_t> tokens = tokenizer->encode(o.prompt);
  if (tokens.empty()) tokens.push_back(tokenizer->eos_id() >= 0 ? tokenizer->eos_id() : 0);
  const int64_t context = std::min<int64_t>(config.max_position_embeddings,
                                            static_cast<int64_t>(tokens.size()) + o.max_new_tokens);
  if (static_cast<int64_t>(tokens.size()) > config.max_position_embeddings)
    std::cerr << "warning: the prompt is " << tokens.size() << " tokens, above max_position_embeddings "
              << config.max_position_embeddings << " of " << dir << ": the model sees only its last "
              << config.max_position_embeddings << "\n";
  DeviceContext device(o.device, 0);
  Context& ctx = device.get();
  // Sampling needs no optimizer: on CUDA the bf16 weights alone, without f32 master copies.
  const bool cuda = ctx.device == Device::cuda;
  const Recipe recipe = make_recipe(cuda ? "bf16" : "fp32", ctx.device, {.master_weights = !cuda});
  Transformer model(config, recipe, ctx, 1, context, 1);
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());

  SplitMixRng rng(o.seed);
  std::string text = o.prompt;
  if (out) *out << o.prompt << std::flush;
  std::vector<int32_t> positions;
  TextStream stream(*tokenizer);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    // Keep the last `context` tokens when the window is full.
    const size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    const std::vector<int32_t> window(tokens.begin() + begin, tokens.end());
    positions.resize(window.size());
    std::iota(positions.begin(), positions.end(), 0);
    HostBatch batch;
    batch.input_ids = window.data();
    batch.positions = positions.data();
    model.load_batch(batch, static_cast<int64_t>(window.size()));
    std::vector<double> logits = model.forward_last_logits();
    // A model's vocabulary may be padded past the tokenizer's (Qwen: 151936 against 151665 ids):
    // ids no text maps to are never sampled.
    logits.resize(static_cast<size_t>(tokenizer->vocab_size()));
    const int32_t next = sample(logits, o.temperature, o.top_k, rng);
    if (next == tokenizer->eos_id()) break;
    tokens.push_back(next);
    const std::string piece = stream.push(next);
    text += piece;
    if (out) *out << piece << std::flush;
  }
  const std::string rest = stream.flush();
  text += rest;
  if (out) *out << rest << "\n";
  return text;
}

}  // namespace ingot
