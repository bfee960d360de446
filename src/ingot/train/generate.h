// Text generation from a model or checkpoint directory: sampling with temperature and top-k.
// Each new token reruns the forward over the whole context (no KV cache): simple and exactly the
// training forward, fine for the small models the CPU runs; a cached decoder comes with serving.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ingot/data/tokenizer.h"
#include "ingot/model/config.h"

namespace ingot {

struct GenerateOptions {
  std::string model_dir;        // model or checkpoint directory, or a run's output_dir (newest checkpoint)
  std::string prompt;
  int64_t max_new_tokens = 200;
  double temperature = 0.8;     // 0: greedy
  int64_t top_k = 40;           // 0: no top-k filter
  uint64_t seed = 0;
  std::string device = "auto";
  std::string tokenizer;        // tokenizer.json path; default: the model dir's, else bytes
  // Start the prompt with the tokenizer's special prefix (Llama 3's <|begin_of_text|>), as
  // transformers' tokenizer(prompt) does; off for a model trained on data prepared without it.
  bool add_special_tokens = true;
  // The prompt is a user message: rendered with the model folder's chat template, followed by the
  // assistant's header (apply_chat_template(..., add_generation_prompt=True)); the reply alone is
  // printed, and it ends at the format's end of turn as well as the model's stop ids.
  bool chat = false;
  std::string chat_format;      // --chat: a built-in format for a template Ingot has not checked
  std::optional<std::string> system;  // --chat: a system message before the user's
  std::string chat_date_string;  // --chat, llama3.1: the date its system turn gives ("": the template's)
};

struct SplitMixRng;
// The next token: argmax at temperature <= 0 (greedy), else one draw from softmax(logits /
// temperature) over the top_k largest logits (0: all), ties broken by id.
int32_t sample_next_token(std::vector<double> logits, double temperature, int64_t top_k, SplitMixRng& rng);

// Generated ids to text as they come. A character whose UTF-8 bytes span several tokens decodes
// to U+FFFD until its last byte arrives, so such a tail is held back (at most 3 more tokens: a
// character has at most 4 bytes) and printed whole.
class TextStream {
 public:
  explicit TextStream(const data::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(int32_t id);  // the text now complete; "" while a character is split
  std::string flush();           // what is held back, at the end

 private:
  const data::Tokenizer& tokenizer_;
  std::vector<int32_t> pending_;
};

// The model dir's tokenizer.json when present, else the byte tokenizer.
std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& model_dir, const std::string& explicit_path);

// The ids that end generation in `dir`, as transformers' generate reads them (generate.cpp).
std::vector<int64_t> generation_stop_ids(const std::string& dir, const ModelConfig& config);

// Returns the prompt followed by the sampled continuation; streams new text to `out` if given.
std::string generate_text(const GenerateOptions& options, std::ostream* out);

}  // namespace ingot
