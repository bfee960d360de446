#include "ingot/train/generate.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <limits>
#include <filesystem>
#include <numeric>
#include <iostream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/byte_tokenizer.h"
#include "ingot/data/chat_format.h"
#include "ingot/data/unicode_nfc.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/json_util.h"
#include "ingot/model/parameters.h"
#include "ingot/model/transformer.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/trainer.h"

namespace ingot {

namespace fs = std::filesystem;

std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& model_dir, const std::string& explicit_path) {
  std::string path = explicit_path;
  if (path.empty() && optional_file_exists(fs::path(model_dir) / "tokenizer.json")) path = (fs::path(model_dir) / "tokenizer.json").string();
  if (path.empty() || explicit_path == "byte") return std::make_unique<data::ByteTokenizer>();
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

int32_t sample_next_token(std::vector<double> logits, double temperature, int64_t top_k, SplitMixRng& rng) {
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

// As transformers' generate stops: on generation_config.json's eos_token_id where the model has
// that file (none where the file has none: transformers does not fall back to config.json then),
// else on config.json's (an int or a list: Llama 3 Instruct ends on <|eot_id|> and
// <|end_of_text|>, Qwen instruct on <|im_end|> and <|endoftext|>). Not on the tokenizer's
// eos_token, which generate never reads: Ingot stopped there too, and ended texts transformers
// goes on with.
std::vector<int64_t> generation_stop_ids(const std::string& dir, const ModelConfig& config) {
  std::vector<int64_t> ids = config.eos_token_ids.empty() ? std::vector<int64_t>{config.eos_token_id} : config.eos_token_ids;
  const fs::path generation_config = fs::path(dir) / "generation_config.json";
  if (optional_file_exists(generation_config)) {
    ids.clear();
    const std::string file = generation_config.string();
    const nlohmann::json g = io::parse_json(io::read_text_file(file, "generation config"), file, "generation config");
    // transformers cannot load one that is not an object; ignored, its stop ids would go unused.
    if (!g.is_object()) fail(file, ": a generation config must be a JSON object, got ", io::json_brief(g));
    const nlohmann::json eos = g.value("eos_token_id", nlohmann::json());
    // An id past int64 wrapped to a negative one, which is dropped below as "none".
    auto too_large = [](const nlohmann::json& id) {
      return id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
    };
    if (too_large(eos) || (eos.is_array() && std::any_of(eos.begin(), eos.end(), too_large)))
      fail(file, ": eos_token_id ", io::json_brief(eos), " holds an id beyond any vocabulary");
    if (eos.is_number_integer()) ids = {eos.get<int64_t>()};
    else if (eos.is_array() && std::all_of(eos.begin(), eos.end(), [](const auto& id) { return id.is_number_integer(); }))
      ids = eos.get<std::vector<int64_t>>();
    else if (!eos.is_null())
      fail(file, ": eos_token_id must be an integer or a list of integers, got ", io::json_brief(eos));
    // An id the model cannot produce would never stop generation, as config.json's checks say there.
    for (const int64_t id : ids)
      if (id < -1 || id >= config.vocab_size)  // -1: none, as in config.json
        fail(file, ": eos_token_id holds ", id, ", outside the vocabulary of ", config.vocab_size, " of ", dir,
             "/config.json");
  }
  std::erase_if(ids, [](int64_t id) { return id < 0; });
  return ids;
}

namespace {
// A tokenizer.json tokenizer reads UTF-8 only; checked per flag, since its own error gives the
// offset in the text it was handed (with --chat, the whole rendered conversation).
void check_utf8(const char* flag, const std::string& text) {
  if (const size_t bad = data::utf8_find_invalid(text); bad != std::string::npos)
    fail("generate: ", flag, ": invalid UTF-8 at byte ", bad, " (the tokenizer reads UTF-8 text)");
}

struct ChatPrompt {
  std::vector<int32_t> tokens;
  int32_t end_of_turn = -1;  // the format's end-of-turn token (<|eot_id|>, <|im_end|>)
};

// --chat: the prompt as one user turn under dir's chat template, then the assistant's header.
ChatPrompt chat_prompt(const std::string& dir, const GenerateOptions& o, const data::Tokenizer& tokenizer) {
  if (!o.add_special_tokens)
    fail("generate: --no-special-tokens applies to a plain prompt; with --chat the chat template decides how the "
         "prompt starts");
  const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(&tokenizer);
  if (bpe == nullptr)
    fail("generate --chat: the chat template's tokens need the model's tokenizer.json, and ", dir,
         " has none (or --tokenizer byte was given)");
  data::ChatFormat format;
  try {
    format = data::load_chat_format(dir, o.chat_format);
  } catch (const Error& e) {
    fail("generate --chat: ", e.what());
  }
  // The tokenizer reads the rendered conversation: its complaint about a byte of --system gave an
  // offset there, and blamed --prompt.
  check_utf8("--prompt", o.prompt);
  if (o.system) check_utf8("--system", *o.system);
  check_utf8("--chat-date-string", o.chat_date_string);
  if (!o.chat_date_string.empty()) data::pin_chat_date(&format, o.chat_date_string, "generate", dir);
  if (const std::string token = data::first_split_control_token(format, *bpe); !token.empty())
    fail("generate --chat: the chat template of ", dir, " (", format.name(), ") writes ", token,
         ", which the tokenizer does not read as one token");
  std::vector<data::ChatMessage> messages;
  if (o.system) messages.push_back({"system", *o.system, std::nullopt});
  messages.push_back({"user", o.prompt, std::nullopt});
  ChatPrompt prompt;
  try {
    prompt.tokens = bpe->encode(data::render_generation_prompt(format, messages));
  } catch (const Error& e) {  // the flags' texts are checked above: this is the template's own text
    fail("generate --chat: the conversation rendered with the chat template of ", dir, ": ", e.what());
  }
  prompt.end_of_turn = bpe->token_to_id(format.end_of_turn());
  return prompt;
}
}  // namespace

std::string generate_text(const GenerateOptions& o, std::ostream* out) {
  INGOT_CHECK(o.max_new_tokens >= 0, "ingot generate: --max-new-tokens must be 0 or more, got ", o.max_new_tokens);
  INGOT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
              "ingot generate: --temperature must be a finite number >= 0 (0 is greedy), got ", o.temperature);
  INGOT_CHECK(o.top_k >= 0, "ingot generate: --top-k must be 0 (all tokens) or more, got ", o.top_k);
  const std::string dir = resolve_model_dir(o.model_dir);
  const ModelConfig config = load_model_config(dir);
  const auto tokenizer = load_tokenizer(dir, o.tokenizer);
  if (tokenizer->vocab_size() > config.vocab_size) {
    // Which tokenizer: the message said only "bpe" or "byte".
    const fs::path own = fs::path(dir) / "tokenizer.json";
    const std::string which = o.tokenizer == "byte" ? "byte (--tokenizer byte)"
                              : !o.tokenizer.empty() ? o.tokenizer
                              : fs::exists(own)      ? own.string()
                                                     : "byte (" + dir + " has no tokenizer.json)";
    fail("tokenizer ", which, " has ", tokenizer->vocab_size(), " ids but the model's vocab_size is ", config.vocab_size,
         " (", dir, "/config.json); give the model's own tokenizer with --tokenizer");
  }
  // Bytes by default where the folder has no tokenizer.json: right for Ingot's byte-level models
  // (their checkpoints, trainer_state.json beside them, and their exports, whose end of text is the
  // byte tokenizer's 256, may pad the vocabulary), garbage for a model whose tokenizer files were
  // not copied along with its weights.
  const bool byte_level_model =
      fs::exists(fs::path(dir) / "trainer_state.json") || config.eos_token_id == data::ByteTokenizer::kEndOfText;
  if (o.tokenizer.empty() && !fs::exists(fs::path(dir) / "tokenizer.json") && !byte_level_model &&
      config.vocab_size != data::ByteTokenizer::kVocabSize)
    std::cerr << "warning: " << dir << " has no tokenizer.json, so text is read and written as bytes (ids 0-256), but "
              << "the model's vocab_size is " << config.vocab_size << ": it was likely trained with another tokenizer; "
              << "copy that tokenizer.json into " << dir << " or pass --tokenizer\n";
  std::vector<int32_t> tokens;
  int32_t end_of_turn = -1;  // --chat: a stop id besides the model's
  if (o.chat) {
    const ChatPrompt chat = chat_prompt(dir, o, *tokenizer);
    tokens = chat.tokens;
    end_of_turn = chat.end_of_turn;
  } else {
    // As transformers' tokenizer(prompt) starts it: Llama 3's <|begin_of_text|> first, as in training.
    try {
      if (o.add_special_tokens) tokens = tokenizer->special_prefix();
    } catch (const Error& e) {
      std::cerr << "warning: " << e.what() << " (the prompt starts without them)\n";
    }
    if (dynamic_cast<const data::BpeTokenizer*>(tokenizer.get())) check_utf8("--prompt", o.prompt);
    std::vector<int32_t> prompt;
    try {
      prompt = tokenizer->encode(o.prompt);
    } catch (const Error& e) {  // the tokenizer's "input text" is the prompt here
      fail("generate: --prompt: ", e.what());
    }
    tokens.insert(tokens.end(), prompt.begin(), prompt.end());
  }
  if (tokens.empty()) tokens.push_back(tokenizer->eos_id() >= 0 ? tokenizer->eos_id() : 0);
  // (max_new_tokens clamped first: a value near 2^63 overflowed the sum.)
  const int64_t context = std::min<int64_t>(config.max_position_embeddings,
                                            static_cast<int64_t>(tokens.size()) +
                                                std::min<int64_t>(o.max_new_tokens, config.max_position_embeddings));
  if (static_cast<int64_t>(tokens.size()) > config.max_position_embeddings)
    std::cerr << "warning: the prompt is " << tokens.size() << " tokens, above max_position_embeddings "
              << config.max_position_embeddings << " of " << dir << ": the model sees only its last "
              << config.max_position_embeddings << "\n";
  // Said up front (the text streams to stdout): transformers' generate keeps the whole sequence
  // and walks past the trained positions; Ingot keeps its window at the trained length instead,
  // so a long sample from a short-context model (the demo's 64 bytes) stays text.
  // The last token sampled is never fed back: the window grows to prompt + max_new_tokens - 1.
  if (o.max_new_tokens > 0 && static_cast<int64_t>(tokens.size()) + std::min<int64_t>(o.max_new_tokens, context) - 1 >
                                  config.max_position_embeddings)
    std::cerr << "note: the prompt's " << tokens.size() << " tokens plus --max-new-tokens " << o.max_new_tokens
              << " pass max_position_embeddings " << config.max_position_embeddings << " of " << dir
              << ": from there on the model sees the last " << config.max_position_embeddings
              << " tokens, at positions 0 to " << config.max_position_embeddings - 1
              << " (transformers' generate would keep them all, at positions the model was not trained on)\n";
  DeviceContext device(o.device, 0);
  Context& ctx = device.get();
  // Sampling needs no optimizer: on CUDA the bf16 weights alone, without f32 master copies.
  const bool cuda = ctx.device == Device::cuda;
  const Recipe recipe = make_recipe(cuda ? "bf16" : "fp32", ctx.device, {.master_weights = !cuda});
  // Shapes the CUDA kernels refuse, by key, before the weights are read (not at the first forward).
  if (cuda) check_cuda_model_shapes(config, "use --device cpu");
  io::check_hf_weights(dir, plan_parameters(config));  // before the model is allocated
  // The model is sized for the whole window: an allocation that fails names what set its length.
  std::optional<Transformer> built;
  try {
    built.emplace(config, recipe, ctx, 1, context, 1);
  } catch (const Error& e) {
    fail("generate: ", e.what(), " (the model is sized for a window of ", context, " tokens: the prompt's ", tokens.size(),
         " plus --max-new-tokens ", o.max_new_tokens, ", at most max_position_embeddings ", config.max_position_embeddings,
         " of ", dir, "/config.json; a smaller --max-new-tokens needs less)");
  }
  Transformer& model = *built;
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  std::vector<int64_t> stops = generation_stop_ids(dir, config);
  if (end_of_turn >= 0) stops.push_back(end_of_turn);
  // Only the tokenizer's ids are sampled (below): stop ids past them all would never end the text,
  // as with a model whose tokenizer.json was not copied along (bytes, 257 ids, read instead).
  if (o.max_new_tokens > 0 && !stops.empty() &&
      std::all_of(stops.begin(), stops.end(), [&](int64_t id) { return id >= tokenizer->vocab_size(); })) {
    std::cerr << "warning: no stop id of " << dir << " (";
    for (size_t i = 0; i < stops.size(); ++i) std::cerr << (i ? ", " : "") << stops[i];
    std::cerr << ") is among the " << tokenizer->vocab_size() << " ids of the tokenizer, which generate samples "
              << "from: the text runs to --max-new-tokens; give the model's own tokenizer with --tokenizer\n";
  }

  SplitMixRng rng(o.seed);
  // A plain prompt is continued, so the text starts with it; a chat reply stands alone.
  std::string text = o.chat ? std::string() : o.prompt;
  if (out) *out << text << std::flush;
  std::vector<int32_t> positions;
  TextStream stream(*tokenizer);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    // Keep the last `context` tokens when the window is full.
    const size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    std::vector<int32_t> window(tokens.begin() + begin, tokens.end());
    const int64_t length = static_cast<int64_t>(window.size());
    // On CUDA the window is padded to a multiple of 128 tokens: cuDNN and cuBLASLt plan (and keep)
    // every shape they meet, and a plan for each length took time and memory at every token. The
    // padding follows the last token, so under causal attention its logits are the same.
    const int64_t padded = cuda ? std::min(context, (length + 127) / 128 * 128) : length;
    window.resize(static_cast<size_t>(padded), 0);
    positions.resize(window.size());
    std::iota(positions.begin(), positions.end(), 0);
    HostBatch batch;
    batch.input_ids = window.data();
    batch.positions = positions.data();
    model.load_batch(batch, padded);
    std::vector<double> logits = model.forward_logits_at(length - 1);
    // A model's vocabulary may be padded past the tokenizer's (Qwen: 151936 against 151665 ids):
    // ids no text maps to are never sampled.
    logits.resize(static_cast<size_t>(tokenizer->vocab_size()));
    // NaN logits compare false either way: sampling would pick an arbitrary token, quietly.
    if (const auto bad = std::find_if(logits.begin(), logits.end(), [](double x) { return !std::isfinite(x); });
        bad != logits.end()) {
      if (out) *out << "\n" << std::flush;  // the text so far ends its line: the error starts its own
      fail("generate: the model's logit for token ", bad - logits.begin(), " is ", *bad, " at position ", length - 1,
           " of the window: the weights or config.json of ", o.model_dir,
           " give non-finite values (check rope_theta, rms_norm_eps and the weights)");
    }
    const int32_t next = sample_next_token(logits, o.temperature, o.top_k, rng);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    tokens.push_back(next);
    const std::string piece = stream.push(next);
    text += piece;
    if (out) *out << piece << std::flush;
    // A closed pipe or a full disk (SIGPIPE is ignored): stop, rather than sample on for no reader.
    if (out && !*out) fail("generate: cannot write the generated text (", std::strerror(errno), ")");
  }
  const std::string rest = stream.flush();
  text += rest;
  if (out) *out << rest << "\n";
  return text;
}

}  // namespace ingot
