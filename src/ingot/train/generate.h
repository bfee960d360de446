// Text generation from a model or checkpoint directory: sampling with temperature and top-k.
// Each new token reruns the forward over the whole context (no KV cache): simple and exactly the
// training forward, fine for the small models the CPU runs; a cached decoder comes with serving.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "ingot/data/tokenizer.h"

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
};

// The model dir's tokenizer.json when present, else the byte tokenizer.
std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& model_dir, const std::string& explicit_path);

// Returns the prompt followed by the sampled continuation; streams new text to `out` if given.
std::string generate_text(const GenerateOptions& options, std::ostream* out);

}  // namespace ingot
