// Training checkpoints. OUTPUT_DIR/checkpoint-<step>/ holds:
//   config.json, model.safetensors     the trainable weights by Hugging Face names, at full
//                                      precision (f32 master weights when the recipe has them), so a
//                                      checkpoint is also a model directory transformers can load
//   optimizer.safetensors              exp_avg and exp_avg_sq, flat (P) in the optimizer's dtype
//   trainer_state.json                 step, updates, data cursor, seed, schedule and optimizer settings (docs/formats.md)
//   tokenizer.json etc.                copied from the model or data directory when present
// A checkpoint is written to checkpoint-<step>.tmp-<pid> and renamed, so a directory named
// checkpoint-<step> is always complete. Only the newest save_total_limit are kept.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ingot/core/dir_lock.h"  // list_checkpoints, checkpoint_step
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"

namespace ingot {

// Files beside a model's weights that make a checkpoint or an export self-contained for generation
// and chat data (transformers >= 4.49 keeps the chat template in chat_template.jinja).
inline constexpr std::array<const char*, 5> kModelCompanionFiles = {
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json", "generation_config.json"};

// A companion file as it was read when a run or an export began. Checkpoints are written from these
// bytes: copied from disk at each save, a dataset replaced mid-run (`prepare --overwrite`) handed
// its tokenizer, or none, to every later checkpoint of weights trained on the old ids.
struct CompanionFile {
  std::string path;   // where it was read (its file name is the one written)
  std::string bytes;
};

// The companion files present in `dir`, checked before a run or an export writes them: each a
// regular file, and the JSON ones valid JSON (a broken one was copied into every checkpoint, where
// generate then failed on it, or a folder in its place failed the first save after the training).
// Errors name the file.
std::vector<CompanionFile> model_companion_files(const std::string& dir);

struct CheckpointContents {
  int64_t step = 0;
  nlohmann::json trainer_state;       // everything but the tensors
};

// Deletes all but the newest keep_last checkpoints (none where keep_last <= 0); returns a line for
// each that could not go: such a checkpoint stays, and the run goes on.
std::vector<std::string> rotate_checkpoints(const std::string& output_dir, int64_t keep_last);

// Saves, then rotates to keep_last (rotate_checkpoints): returns one line for each older checkpoint
// that could not be deleted, since the new one is safely in place. Weights holding a non-finite
// value are refused first; then check_before_writing runs (the trainer's loss check), and may throw.
std::vector<std::string> save_checkpoint(const std::string& output_dir, Context& ctx, Transformer& model,
                                         AdamW& optimizer, const CheckpointContents& contents,
                                         const std::vector<CompanionFile>& companions, int64_t keep_last,
                                         const std::function<void()>& check_before_writing = {});
// Restores weights, master weights and optimizer state; returns trainer_state.json.
nlohmann::json load_checkpoint(const std::string& checkpoint_dir, Context& ctx, Transformer& model,
                               AdamW& optimizer);
// checkpoint-<step>.tmp-<pid> folders under output_dir left by a run killed while saving (such a
// folder can hold gigabytes), removed; returns their paths. With `exclusive` (this process holds
// output_dir's DirectoryLock) every such folder is stale; without it, the folder of a live process
// is left alone, since it may be saving right now.
std::vector<std::string> remove_stale_partial_checkpoints(const std::string& output_dir, bool exclusive);
// loss.svg.tmp-<pid> files under output_dir left by a run killed while writing its plot, removed on
// the same terms; returns their paths.
std::vector<std::string> remove_stale_partial_plots(const std::string& output_dir, bool exclusive);
// A checkpoint or model directory as given, or the newest checkpoint of a run's output_dir.
std::string resolve_model_dir(const std::string& path);
// Whether `path` is `dir` or lies inside it, compared as weakly canonical paths.
bool is_same_or_inside(const std::string& path, const std::string& dir);

// The trainable weights at full precision as a host f32/f64 flat buffer (master copy if present).
std::vector<char> host_trainable_weights(Context& ctx, Transformer& model, AdamW* optimizer, DType* dtype);

}  // namespace ingot
