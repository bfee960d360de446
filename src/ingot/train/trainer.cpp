#include "ingot/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "ingot/core/dir_lock.h"
#include "ingot/core/error.h"
#include "ingot/core/paths.h"
#include "ingot/core/process.h"
#include "ingot/core/stop_signals.h"
#include "ingot/core/text.h"
#include "ingot/data/loader.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/json_util.h"
#include "ingot/model/parameters.h"
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"
#include "ingot/optim/lr_schedule.h"
#include "ingot/ops/ops.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/metrics.h"
#include "ingot/train/train_step.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

namespace fs = std::filesystem;

DeviceContext::DeviceContext(const std::string& device, int64_t num_threads) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail("device must be auto, cpu or cuda, got \"", device, "\"");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx_.num_threads = num_threads > 0 ? static_cast<int>(num_threads) : cores;
  bool want_cuda = device == "cuda";
#ifdef INGOT_HAVE_CUDA
  if (device == "auto") want_cuda = cuda::device_available();
  if (want_cuda) {
    if (!cuda::device_available()) fail("device: cuda was requested but no CUDA device is available");
    ctx_.device = Device::cuda;
    ctx_.cuda = cuda::create_state(0);
  }
#else
  if (want_cuda) fail("device: cuda was requested but this build of Ingot has no CUDA backend (build with INGOT_CUDA=ON)");
#endif
}

DeviceContext::~DeviceContext() {
#ifdef INGOT_HAVE_CUDA
  if (ctx_.cuda) cuda::destroy_state(ctx_.cuda);
#endif
}

std::string DeviceContext::description() const {
#ifdef INGOT_HAVE_CUDA
  if (ctx_.device == Device::cuda) return "cuda (" + cuda::device_name() + ")";
#endif
  return "cpu (" + std::to_string(ctx_.num_threads) + " threads)";
}

namespace {

// A double as an error gives it: "nan" for every NaN (iostreams print some as "-nan"), else as <<.
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

// The files of a run in dir: its checkpoints, metrics and plot.
std::vector<fs::path> run_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const std::string& ckpt : list_checkpoints(dir.string())) files.emplace_back(ckpt);
  for (const char* name : {"metrics.jsonl", "loss.svg"})
    if (fs::exists(dir / name)) files.push_back(dir / name);
  return files;
}

// --overwrite moves the old run into a hidden folder of output_dir and deletes it once the new run
// has saved a checkpoint in its own course (save_steps or its end; not the save a stop signal
// forces, after which both are kept). A run that fails before then puts the old one back (one
// killed outright leaves it in the folder), so replacing a run never loses it to an attempt that
// left nothing in its place.
class ReplacedRun {
 public:
  ReplacedRun(const fs::path& dir, const std::vector<fs::path>& old) : dir_(dir) {
    if (old.empty()) return;
    aside_ = fresh_pid_path(dir, ".replaced-run-");
    fs::create_directories(aside_);
    std::vector<fs::path> moved;
    try {
      for (const fs::path& p : old) {
        fs::rename(p, aside_ / p.filename());
        moved.push_back(p);
      }
    } catch (...) {  // what was moved goes back: the old run stays whole
      std::error_code ec;
      for (const fs::path& p : moved) fs::rename(aside_ / p.filename(), p, ec);
      fs::remove(aside_, ec);
      throw;
    }
  }
  // Runs while an exception unwinds: nothing here may throw.
  ~ReplacedRun() {
    if (aside_.empty()) return;
    try {
      std::error_code ec;
      for (const fs::path& p : run_files(dir_)) fs::remove_all(p, ec);  // the failed run's
      for (const auto& entry : fs::directory_iterator(aside_, ec)) fs::rename(entry.path(), dir_ / entry.path().filename(), ec);
      fs::remove(aside_, ec);
    } catch (...) {  // a filesystem error listing the run: the old run stays in aside_, which the next run names
    }
  }
  ReplacedRun(const ReplacedRun&) = delete;
  ReplacedRun& operator=(const ReplacedRun&) = delete;
  // The new run now stands on its own: the old one is deleted. Later calls do nothing.
  void commit() {
    if (aside_.empty()) return;
    std::error_code ec;
    fs::remove_all(aside_, ec);
    aside_.clear();
  }
  // Keeps both: the new run's files where they are, the old run in its folder (returned; empty if
  // it was committed or there was none). For a run stopped by a signal before its first save.
  fs::path keep_aside() { return std::exchange(aside_, fs::path()); }
  bool holds_old_run() const { return !aside_.empty(); }

 private:
  fs::path dir_, aside_;
};

// .replaced-run-* folders of output_dir. Called while this process holds output_dir's lock and
// before it sets anything aside, so each was left by an --overwrite run that was killed, or stopped
// by a signal before its first checkpoint: it holds the old run, which no one will put back or
// delete. Kept; the log names them.
std::vector<fs::path> orphaned_replaced_runs(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind(".replaced-run-", 0) == 0 && entry.is_directory())
      found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found;
}

// Checks before output_dir is created (by its lock): a file in its place, nothing to resume, a
// folder that is the file system's root, the model's or the training data's (the run's
// checkpoints, metrics and an --overwrite would mix with what the folder holds). A run made so
// before these checks still resumes.
void check_output_dir(const TrainConfig& c, const TrainOptions& o, const std::vector<fs::path>& data_dirs) {
  std::error_code ec;
  const fs::file_status status = fs::status(c.output_dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail(c.source_of({"output_dir"}), ": cannot use output_dir ", c.output_dir, ": ", ec.message());
  const fs::path out = fs::weakly_canonical(fs::absolute(c.output_dir, ec), ec);
  if (is_filesystem_root(c.output_dir))
    fail(c.source_of({"output_dir"}), ": output_dir ", c.output_dir, " is the file system's root; give the run a folder of its own");
  auto same = [&](const fs::path& other) {
    std::error_code other_ec;
    const fs::path resolved = fs::weakly_canonical(fs::absolute(other, other_ec), other_ec);
    return !ec && !other_ec && resolved == out;
  };
  for (const fs::path& d : data_dirs)
    if (!o.resume && same(d))
      fail(c.source_of({"output_dir", "train_data"}), ": output_dir ", c.output_dir, " is the folder of the training data (",
           d.string(), "); give the run a folder of its own");
  if (!c.model.empty() && !o.resume && same(c.model) && fs::exists(fs::path(c.model) / "config.json", ec))
    fail(c.source_of({"output_dir", "model"}), ": output_dir ", c.output_dir, " is the folder of model ", c.model,
         "; give the run a folder of its own (its checkpoints, metrics and an --overwrite would mix with the model's files)");
  if (fs::exists(status) && !fs::is_directory(status))
    fail(c.source_of({"output_dir"}), ": output_dir ", c.output_dir, " exists and is not a directory");
  if (o.resume && !fs::exists(status))
    fail("--resume: output_dir ", c.output_dir, " does not exist");
}

// Refuses to mix a new run into an old one unless the user said which they want. Runs under
// output_dir's lock.
std::unique_ptr<ReplacedRun> prepare_output_dir(const TrainConfig& c, const TrainOptions& o, bool lock_held) {
  const fs::path dir(c.output_dir);
  // Something other than a folder under a checkpoint's name is no checkpoint: --resume passed over
  // it, and the save at that step deleted it.
  std::error_code iter_ec;
  for (const auto& entry : fs::directory_iterator(dir, iter_ec)) {
    std::error_code ec;
    if (checkpoint_step(entry.path().filename().string()) >= 0 && !entry.is_directory(ec))
      fail("output_dir ", c.output_dir, " holds ", entry.path().filename().string(),
           ", which is not a checkpoint folder; move it out of output_dir (a save at that step would replace it)");
  }
  if (o.resume) {
    if (list_checkpoints(c.output_dir).empty())
      fail("--resume: no checkpoint-* directory in output_dir ", c.output_dir, " to resume from");
    return nullptr;
  }
  std::vector<fs::path> old = run_files(dir);
  // An empty metrics.jsonl and nothing else: a run killed before its first logged step (a second
  // Ctrl-C, SIGKILL) holds nothing to keep or resume, and it no longer asks for --overwrite. Only
  // under the lock: without one (a file system without flock) it may be a live run's.
  std::error_code ec;
  if (lock_held && old.size() == 1 && old.front() == dir / "metrics.jsonl" && fs::file_size(old.front(), ec) == 0 &&
      !ec) {
    fs::remove(old.front(), ec);
    old.clear();
  }
  if (!old.empty() && !o.overwrite) {
    if (list_checkpoints(c.output_dir).empty())  // e.g. a run killed before its first save
      fail("output_dir ", c.output_dir, " already holds a run (", old.front().filename().string(),
           "; a run is metrics.jsonl, loss.svg and checkpoint-*) with no checkpoint to resume from; pass "
           "--overwrite to replace it");
    // Names the newest checkpoint: the one --resume would continue (run_files' first, in name
    // order, was the oldest).
    fail("output_dir ", c.output_dir, " already holds a run (", fs::path(list_checkpoints(c.output_dir).back()).filename().string(),
         "; a run is metrics.jsonl, loss.svg and checkpoint-*); pass --resume to continue it or --overwrite to replace it");
  }
  return std::make_unique<ReplacedRun>(dir, old);
}

// A data error (its text names the shards) with the setting that listed them, and a hint for a
// list written "a,b".
[[noreturn]] void fail_naming_train_data(const TrainConfig& c, const Error& e) {
  const bool comma = std::any_of(c.train_data.begin(), c.train_data.end(), [](const std::string& entry) {
    std::error_code ec;
    return entry.find(',') != std::string::npos && !fs::exists(entry, ec);
  });
  fail(c.source_of({"train_data"}), ": ", e.what(), comma ? " (a list of paths is written [a, b])" : "");
}

// The folders train_data's shards are in, each once, in order: an entry may be a folder, a shard
// file or a glob over several folders.
std::vector<fs::path> data_directories(const TrainConfig& c) {
  std::vector<std::string> shards;
  try {
    shards = data::resolve_shard_paths(c.train_data);
  } catch (const Error& e) {
    fail_naming_train_data(c, e);
  }
  std::vector<fs::path> dirs;
  for (const std::string& shard : shards) {
    fs::path dir = fs::path(shard).parent_path();
    if (dir.empty()) dir = ".";
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  return dirs;
}

// The meta.json `ingot prepare` wrote in a data folder; an empty object where there is none to
// read (the loader has checked it).
nlohmann::json dataset_meta(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "meta.json", ec)) return nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::parse(io::read_text_file((dir / "meta.json").string(), "dataset meta"), nullptr,
                                              /*allow_exceptions=*/false);
  return meta.is_object() ? meta : nlohmann::json::object();
}

// A tokenizer.json's tokens by id: model.vocab (BPE and WordLevel: token -> id; Unigram: [token,
// score] by id) with added_tokens over it. Conversions differ in whether special tokens are in the
// vocabulary too; by id they agree.
std::map<int64_t, std::string> tokens_by_id(const nlohmann::json& tokenizer) {
  std::map<int64_t, std::string> tokens;
  const nlohmann::json none;
  const nlohmann::json& vocab = tokenizer.contains("model") && tokenizer["model"].is_object()
                                    ? tokenizer["model"].value("vocab", none) : none;
  if (vocab.is_object()) {
    for (const auto& [token, id] : vocab.items())
      if (id.is_number_integer()) tokens[id.get<int64_t>()] = token;
  } else if (vocab.is_array()) {
    for (size_t i = 0; i < vocab.size(); ++i)
      if (vocab[i].is_array() && !vocab[i].empty() && vocab[i][0].is_string()) tokens[int64_t(i)] = vocab[i][0].get<std::string>();
  }
  return tokens;
}
std::map<int64_t, std::string> added_tokens_by_id(const nlohmann::json& tokenizer) {
  std::map<int64_t, std::string> tokens;
  if (tokenizer.contains("added_tokens") && tokenizer["added_tokens"].is_array())
    for (const nlohmann::json& t : tokenizer["added_tokens"])
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") && t["content"].is_string())
        tokens[t["id"].get<int64_t>()] = t["content"].get<std::string>();
  return tokens;
}

// Data prepared with another tokenizer than the starting model's: its ids name other tokens, yet
// nothing else notices (the ids fit a larger vocabulary: Llama 3's 128k inside Qwen's 152k), and
// checkpoints then carry the data's tokenizer. Refused where an id names another token in the two
// vocabularies; another added token at an id both have as added tokens (a renamed reserved special
// token) gets a warning.
void check_data_tokenizer(const TrainConfig& c, const std::vector<fs::path>& data_dirs, std::ostream& log) {
  if (c.model.empty()) return;
  const fs::path model_file = fs::path(c.model) / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(model_file, ec)) return;
  const std::string model_text = io::read_text_file(model_file.string(), "tokenizer");
  const nlohmann::json model_json = nlohmann::json::parse(model_text, nullptr, /*allow_exceptions=*/false);
  for (const fs::path& dir : data_dirs) {
    if (dataset_meta(dir).value("tokenizer", nlohmann::json()) == "byte")
      fail(c.source_of({"train_data"}), ": ", dir.string(), " holds byte-level data (its meta.json says \"tokenizer\": "
           "\"byte\"), but model ", c.model, " has a tokenizer of its own (", model_file.string(),
           "): the data's ids are bytes, not that tokenizer's tokens; prepare it with --tokenizer ", c.model);
    const fs::path data_file = dir / "tokenizer.json";
    if (!fs::is_regular_file(data_file, ec)) continue;
    const std::string data_text = io::read_text_file(data_file.string(), "tokenizer");
    if (data_text == model_text) continue;
    const nlohmann::json data_json = nlohmann::json::parse(data_text, nullptr, /*allow_exceptions=*/false);
    if (model_json.is_discarded() || data_json.is_discarded()) continue;  // unreadable: the tokenizer's own load names it
    std::map<int64_t, std::string> model_tokens = tokens_by_id(model_json), data_tokens = tokens_by_id(data_json);
    const std::map<int64_t, std::string> model_added = added_tokens_by_id(model_json), data_added = added_tokens_by_id(data_json);
    for (const auto& [id, token] : model_added) model_tokens[id] = token;
    for (const auto& [id, token] : data_added) data_tokens[id] = token;
    std::optional<int64_t> renamed;  // the first id that is an added token in both, named otherwise
    for (const auto& [id, token] : data_tokens) {
      const auto it = model_tokens.find(id);
      if (it == model_tokens.end() || it->second == token) continue;
      if (model_added.contains(id) && data_added.contains(id)) {
        if (!renamed) renamed = id;
        continue;
      }
      fail(c.source_of({"train_data", "model"}), ": ", dir.string(), " was prepared with another tokenizer than model ",
           c.model, "'s: id ", id, " is ", nlohmann::json(token).dump(), " in ", data_file.string(), " but ",
           nlohmann::json(it->second).dump(), " in ", model_file.string(), "; prepare the data with --tokenizer ", c.model);
    }
    if (renamed)
      log << "warning: " << c.source_of({"train_data", "model"}) << ": " << data_file.string() << " has added token "
          << nlohmann::json(data_added.at(*renamed)).dump() << " at id " << *renamed << ", where " << model_file.string()
          << " has " << nlohmann::json(model_added.at(*renamed)).dump() << "; checkpoints carry the data's tokenizer\n";
  }
}

// Files that make a checkpoint self-contained for generation and export.
std::vector<CompanionFile> companion_files(const TrainConfig& c, const std::vector<fs::path>& data_dirs) {
  std::vector<CompanionFile> files;
  std::vector<fs::path> dirs;
  if (!c.model.empty()) dirs.emplace_back(c.model);
  for (const fs::path& d : data_dirs) {
    const nlohmann::json meta = dataset_meta(d);
    // A byte-level dataset has no tokenizer files; one that sits beside it is not its tokenizer
    // (checkpoints carrying it could not generate: its vocabulary is not the model's).
    if (meta.value("tokenizer", nlohmann::json()) == "byte") continue;
    // Files the dataset was prepared with and has lost: checkpoints without its tokenizer.json
    // decode as bytes, and generate printed garbage without a word.
    const nlohmann::json listed = meta.value("tokenizer_files", nlohmann::json::array());
    for (const nlohmann::json& name : listed.is_array() ? listed : nlohmann::json::array())
      if (name.is_string() && !fs::exists(d / name.get<std::string>()))
        fail(c.source_of({"train_data"}), ": ", (d / "meta.json").string(), " lists the tokenizer file ",
             name.get<std::string>(), " the data was prepared with, and ", d.string(), " no longer holds it; "
             "checkpoints would carry no tokenizer. Copy it back from the tokenizer prepare used, or prepare again");
    dirs.push_back(d);
  }
  // Later folders' files replace earlier ones (checkpoint.cpp writes them in order), and
  // tokenizer_config.json and chat_template.jinja go together: transformers takes the .jinja over
  // the config's template, so the model's .jinja beside the data's config (the template that
  // rendered the data) would have been the template every export shipped.
  auto named = [](const std::string& name) {
    return [name](const CompanionFile& file) { return fs::path(file.path).filename() == name; };
  };
  for (const fs::path& d : dirs) {
    std::vector<CompanionFile> own = model_companion_files(d.string());
    if (std::any_of(own.begin(), own.end(), named("tokenizer_config.json")))
      std::erase_if(files, named("chat_template.jinja"));
    for (CompanionFile& file : own) files.push_back(std::move(file));
  }
  return files;
}

// Settings that shape every step from here on, recorded in trainer_state.json since 2026-12-01
// (beside max_steps, learning_rate, lr_scheduler_type and the batch shape) and compared on resume.
nlohmann::json step_settings(const TrainConfig& c) {
  return {{"warmup_steps", c.warmup_steps},
          {"min_lr_ratio", c.min_lr_ratio},
          {"wsd_decay_ratio", c.wsd_decay_ratio},
          {"weight_decay", c.weight_decay},
          {"adam_beta1", c.adam_beta1},
          {"adam_beta2", c.adam_beta2},
          {"adam_epsilon", c.adam_epsilon},
          {"max_grad_norm", c.max_grad_norm},
          {"weight_decay_norms", c.weight_decay_norms},
          {"weight_decay_biases", c.weight_decay_biases},
          {"weight_decay_embeddings", c.weight_decay_embeddings},
          {"train_on_inputs", c.train_on_inputs},
          {"logits_chunk_tokens", c.logits_chunk_tokens}};
}

// The attention engine switches set for a CUDA run (docs/config.md, "Engine switches"), as
// "NAME=value" separated by spaces; "" for none, and on the CPU, which ignores them. They choose
// the kernels, so they change the bits.
std::string attention_switches(const Context& ctx) {
  if (ctx.device != Device::cuda) return "";
  std::string set;
  for (const char* name : {"INGOT_ATTENTION", "INGOT_ATTENTION_MMA_SYNC"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == 0 || std::string(value) == "0") continue;  // "0": the flag's default
    if (!set.empty()) set += ' ';
    set.append(name).append("=").append(value);
  }
  return set;
}

// What this run changes from the one that wrote the checkpoint it resumes, one line each for the
// log. Any of these is allowed (extending max_steps is the usual one), but the resumed run then
// no longer repeats an uninterrupted run, and the user should see that rather than find out.
std::vector<std::string> resume_changes(const nlohmann::json& state, const TrainConfig& c, const Recipe& recipe,
                                        const std::string& attention_plan, const std::string& switches) {
  std::vector<std::string> changes;
  // A string the checkpoint recorded (if it did) that differs now; an empty one is shown as `empty`.
  auto compare_record = [&](const char* key, const std::string& now, const std::string& empty, const std::string& what_was,
                            const std::string& is, const std::string& consequence) {
    if (!state.contains(key) || state[key] == now) return;
    auto shown = [&](const std::string& value) { return value.empty() ? empty : value; };
    changes.push_back(what_was + " \"" + shown(state[key].get<std::string>()) + "\" in the checkpoint's run and " + is +
                      " \"" + shown(now) + "\" now" + consequence);
  };
  // The attention backward's plan follows the GPU memory free at the start (one cuDNN call, slices,
  // or Ingot's kernels), and the kernels give other bits than cuDNN. Recorded since 2026-12-01.
  compare_record("attention_plan", attention_plan, "one call, where cuDNN runs it", "the attention backward's plan was",
                 "is", " (the GPU's free memory or INGOT_ATTENTION_WORKSPACE_MIB differs): the run no longer repeats the "
                 "uninterrupted one bit for bit (INGOT_ATTENTION_WORKSPACE_MIB pins the plan)");
  // Recorded since 2026-12-01 (the twenty-first session).
  compare_record("attention_switches", switches, "none", "the attention switches were", "are",
                 ": other kernels run the attention, and the run no longer repeats the uninterrupted one bit for bit");
  // "recipe" since checkpoints of 2026-11-30 (describe(): dtypes of gradients, moments, master
  // weights); older ones record only the precision.
  const bool has_recipe = state.contains("recipe");
  const std::string was = has_recipe ? state["recipe"].get<std::string>() : state.value("precision", std::string());
  const std::string now = has_recipe ? describe(recipe) : recipe.name;
  if (!was.empty() && was != now)
    changes.push_back("the checkpoint was trained with precision " + was + ", this run uses " + now +
                      ": weights and AdamW moments are converted where their dtypes differ");
  auto compare = [&](const char* key, const nlohmann::json& value) {
    if (state.contains(key) && state[key] != value)
      changes.push_back(std::string(key) + " was " + state[key].dump() + " in the checkpoint, now " + value.dump() +
                        ": the learning-rate schedule follows the new value");
  };
  compare("max_steps", c.max_steps);
  compare("learning_rate", c.learning_rate);
  compare("lr_scheduler_type", c.lr_scheduler_type);
  // Recorded since 2026-12-01. The data cursor counts windows, so the batches go on from where the
  // checkpoint stopped, in other groupings (the loader itself refuses another sequence_len).
  for (const auto& [key, value] : {std::pair{"micro_batch_size", c.micro_batch_size},
                                   std::pair{"gradient_accumulation_steps", c.gradient_accumulation_steps}})
    if (state.contains(key) && state[key] != value)
      changes.push_back(std::string(key) + " was " + state[key].dump() + " in the checkpoint, now " + std::to_string(value) +
                        ": the steps from here on group the data differently, so the run no longer repeats the uninterrupted one");
  const nlohmann::json settings = step_settings(c);  // items() refers to it: not a temporary
  for (const auto& [key, value] : settings.items())
    if (state.contains(key) && state[key] != value)
      changes.push_back(key + " was " + state[key].dump() + " in the checkpoint, now " + value.dump() +
                        ": the steps from here on use the new value, so the run no longer repeats the uninterrupted one");
  return changes;
}

// A resumed run keeps the architecture it was trained with. Shapes are checked as the weights load;
// this covers what changes the math without changing a shape (rope_theta, rms_norm_eps, rope
// scaling, max_position_embeddings), which resumed with a jump in the loss and config.json files
// that differ between checkpoints of one run. Token ids, the init std and the dtype may differ.
// Calls read() on what the newest of `checkpoints` holds. An error there is that checkpoint's
// damage, never skipped silently (its steps would be trained again): said with the way to resume
// from the checkpoint before it, where there is one.
template <typename Read>
auto read_newest_checkpoint(const std::vector<std::string>& checkpoints, const std::string& output_dir, Read read) {
  try {
    return read();
  } catch (const Error& e) {
    if (checkpoints.size() < 2) throw;
    fail(e.what(), "\n(to resume from the checkpoint before it, ", checkpoints[checkpoints.size() - 2], ", move ",
         checkpoints.back(), " out of ", output_dir, ")");
  }
}

// `saved`: the config.json of `checkpoint`.
void check_same_architecture(const std::string& checkpoint, const ModelConfig& saved_config, const ModelConfig& now,
                             const TrainConfig& c) {
  const nlohmann::json saved = nlohmann::json::parse(model_config_to_json(saved_config));
  const nlohmann::json current = nlohmann::json::parse(model_config_to_json(now));
  // head_dim last: it follows from hidden_size / num_attention_heads where the config gives none, so
  // a changed hidden_size was reported as a changed head_dim (keys come in alphabetical order).
  for (const bool derived : {false, true})
    for (const auto& [key, value] : saved.items()) {
      // pad_token_id too: checkpoints written before it was read (2026-12-02) hold none.
      if (key == "initializer_range" || key == "bos_token_id" || key == "eos_token_id" || key == "pad_token_id" ||
          key == "torch_dtype" || (key == "head_dim") != derived)
        continue;
      const nlohmann::json other = current.value(key, nlohmann::json());
      if (value != other)
        fail(c.source_of({"model", "model_config"}), ": --resume: ", key, " is ", other.dump(), " in this run's model but ",
             value.dump(), " in ", (fs::path(checkpoint) / "config.json").string(),
             "; a resumed run keeps its architecture (to change it, start a new run with model: ", checkpoint, ")");
    }
}

// The settings trainer_state.json records that a resume compares with the config
// (resume_changes; the seed through the data cursor's), with this run's values: each recorded one
// must be of the same kind.
nlohmann::json compared_settings(const TrainConfig& c) {
  nlohmann::json settings = step_settings(c);
  settings.update({{"seed", c.seed},
                   {"max_steps", c.max_steps},
                   {"learning_rate", c.learning_rate},
                   {"lr_scheduler_type", c.lr_scheduler_type},
                   {"micro_batch_size", c.micro_batch_size},
                   {"gradient_accumulation_steps", c.gradient_accumulation_steps}});
  return settings;
}

// Loads checkpoint dir into the model and optimizer; returns its trainer_state.json, whose "step",
// "data", text fields and compared settings (of the kinds `compared` has) are checked (the data
// cursor is restored by the caller).
nlohmann::json load_resume_checkpoint(const std::string& dir, Context& ctx, Transformer& model, AdamW& optimizer,
                                      const nlohmann::json& compared) {
  const nlohmann::json state = load_checkpoint(dir, ctx, model, optimizer);
  const std::string state_file = (fs::path(dir) / "trainer_state.json").string();
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0)
    fail(state_file, ": key \"step\" must be a non-negative integer, got ",
         state.is_object() && state.contains("step") ? state["step"].dump() : std::string("nothing"));
  if (!state.contains("data") || !state["data"].is_object())
    fail(state_file, ": key \"data\" (the data loader's cursor) must be an object");
  if (const std::string problem = data::DataLoader::malformed_state(state["data"]); !problem.empty())
    fail(state_file, ": key \"data\" (the data loader's cursor): ", problem, ": the checkpoint is damaged");
  for (const char* key : {"recipe", "precision", "attention_plan", "attention_switches", "config_source"})
    if (state.contains(key) && !state[key].is_string())
      fail(state_file, ": key \"", key, "\" must be a string, got ", io::json_brief(state[key]), ": the checkpoint is damaged");
  // A compared setting of another kind (a string or a fraction where a step count belongs; a
  // number for lr_scheduler_type) was edited or damaged: named, where it used to show up only in a
  // resume note.
  for (const auto& [key, now] : compared.items()) {
    if (!state.contains(key)) continue;
    const nlohmann::json& was = state[key];
    const bool same = now.is_number_integer() ? was.is_number_integer()
                      : now.is_number()       ? was.is_number()
                      : now.is_boolean()      ? was.is_boolean()
                                              : was.is_string();
    if (!same)
      fail(state_file, ": key \"", key, "\" must be ",
           now.is_number_integer() ? "an integer" : now.is_number() ? "a number" : now.is_boolean() ? "true or false" : "a string",
           ", got ", io::json_brief(was), ": the checkpoint is damaged");
  }
  // The directory's name is the step it was saved at; a state that disagrees was edited or mixed
  // up with another checkpoint's, and its data cursor and learning rate would not match.
  const int64_t step = state["step"].get<int64_t>();
  if (fs::path(dir).filename().string() != "checkpoint-" + std::to_string(step))
    fail(state_file, ": key \"step\" is ", step, ", but the checkpoint directory is ", fs::path(dir).filename().string(),
         ": the checkpoint is damaged");
  if (state.contains("updates") &&
      (!state["updates"].is_number_integer() || state["updates"].get<int64_t>() < 0 || state["updates"].get<int64_t>() > step))
    fail(state_file, ": key \"updates\" (AdamW updates made) must be an integer from 0 to the step, ", step, ", got ",
         io::json_brief(state["updates"]), ": the checkpoint is damaged");
  return state;
}

}  // namespace

AdamWConfig adamw_config(const TrainConfig& c) {
  AdamWConfig adam;
  adam.beta1 = c.adam_beta1;
  adam.beta2 = c.adam_beta2;
  adam.eps = c.adam_epsilon;
  adam.weight_decay = c.weight_decay;
  adam.max_grad_norm = c.max_grad_norm;
  adam.rounding_seed = c.seed;
  adam.decay_norms = c.weight_decay_norms;
  adam.decay_biases = c.weight_decay_biases;
  adam.decay_embeddings = c.weight_decay_embeddings;
  return adam;
}

TrainResult run_training(const TrainConfig& config, const TrainOptions& options, std::ostream& log) {
  // SIGINT and SIGTERM end the run after the step in hand, with a checkpoint; one that comes while
  // the run is being set up stops it before its first step (and puts back a run --overwrite set aside).
  const StopSignals stop;
  // model: a run's output_dir means its newest checkpoint, as for generate, export and info.
  TrainConfig c = config;
  if (!c.model.empty()) {
    try {
      c.model = resolve_model_dir(config.model);
    } catch (const Error& e) {
      fail_reading_path(c, "model", config.model, e);
    }
    if (c.model != config.model) log << "model: " << c.model << " (the newest checkpoint of " << config.model << ")\n";
  }
  // --overwrite moves the old run (checkpoints, metrics, plot) aside before the weights are read,
  // so they would be missing.
  if (!c.model.empty() && options.overwrite && !options.resume)
    for (const fs::path& old : run_files(c.output_dir))
      if (is_same_or_inside(c.model, old.string()))
        fail(c.source_of({"model"}), ": model ", c.model, " is part of the run in output_dir ", c.output_dir,
             ", which --overwrite replaces; copy it elsewhere first, or train into another output_dir");
  ModelConfig model_config = resolve_model_config(c);
  // The data's folders, resolved once: their meta.json and tokenizer files serve the eos id, the
  // tokenizer check and every checkpoint's companion files.
  const std::vector<fs::path> data_dirs = data_directories(c);
  // A model trained from scratch without an eos_token_id takes its data's end-of-text id, so that
  // its checkpoints and exports say where documents end (generate and transformers stop there).
  std::string eos_note, eos_warning;
  const bool eos_unset = c.model.empty() && model_config.eos_token_id < 0 && model_config.eos_token_ids.empty();
  const std::vector<std::string> resumed =
      eos_unset && options.resume ? list_checkpoints(c.output_dir) : std::vector<std::string>();
  if (eos_unset && !resumed.empty()) {
    // A resumed run keeps the end of text its checkpoints have: the data's meta.json, edited or
    // deleted since, rewrote it (or dropped it) without a word.
    const ModelConfig saved =
        read_newest_checkpoint(resumed, c.output_dir, [&] { return load_model_config(resumed.back()); });
    model_config.eos_token_id = saved.eos_token_id;
    model_config.eos_token_ids = saved.eos_token_ids;
  } else if (eos_unset && !c.train_data.empty()) {
    std::set<int64_t> ids;
    std::string bad_eos;  // the first meta.json whose eos_id is no token id of this model
    for (const fs::path& d : data_dirs) {
      const nlohmann::json eos = dataset_meta(d).value("eos_id", nlohmann::json());
      const bool id = eos.is_number_integer() && eos.get<int64_t>() >= 0 && eos.get<int64_t>() < model_config.vocab_size;
      if (!eos.is_null() && !id && bad_eos.empty())
        bad_eos = (d / "meta.json").string() + ": eos_id " + io::json_brief(eos);
      ids.insert(id ? eos.get<int64_t>() : -1);
    }
    if (!bad_eos.empty()) {
      // The checkpoints then said nothing of where documents end, without a word.
      eos_warning = bad_eos + " is not a token id of this model (vocab_size " + std::to_string(model_config.vocab_size) +
                 "), so eos_token_id stays unset in checkpoints and exports; set model_config.eos_token_id";
    } else if (ids.size() == 1 && *ids.begin() >= 0) {
      model_config.eos_token_id = *ids.begin();
      eos_note = "eos_token_id " + std::to_string(model_config.eos_token_id) + " from the data's meta.json (model_config sets none)";
    } else if (ids.size() > 1) {
      // Checkpoints and exports then say nothing of where documents end: transformers' generate
      // never stops on them.
      std::string listed;
      for (const int64_t id : ids) listed += (listed.empty() ? "" : ", ") + (id < 0 ? std::string("none") : std::to_string(id));
      eos_note = "the train_data folders' meta.json files give different end-of-text ids (" + listed +
                 "), so eos_token_id stays unset in checkpoints and exports; set model_config.eos_token_id";
    }
  }
  // A device that cannot be had names where it was asked for, as any other value's error does.
  std::optional<DeviceContext> device;
  try {
    device.emplace(c.device, c.num_threads);
  } catch (const Error& e) {
    fail(c.source_of({"device"}), ": ", e.what());
  }
  Context& ctx = device->get();
  const std::string precision = c.precision == "auto" ? (ctx.device == Device::cuda ? "bf16" : "fp32") : c.precision;
  if (const RecipeOptionProblem problem = find_recipe_option_problem(c.recipe_options(), precision); problem.key)
    fail(c.source_of({problem.key}), ": ", problem.message);
  const Recipe recipe = [&] {
    try {
      return make_recipe(precision, ctx.device, c.recipe_options());
    } catch (const Error& e) {
      fail(c.source_of({"precision"}), ": ", e.what());
    }
  }();

  // Data first: a bad dataset should fail before any large allocation.
  data::DataLoaderConfig data_config;
  data_config.paths = c.train_data;
  data_config.seq_len = c.sequence_len;
  data_config.vocab_size = model_config.vocab_size;
  data_config.val_fraction = c.val_fraction;
  data_config.seed = c.seed;
  data_config.use_loss_mask = !c.train_on_inputs;
  std::optional<data::DataLoader> loader_or;
  try {
    data_config.packing = data::resolve_packing_mode(c.packing, c.train_data);  // opens the shards
    loader_or.emplace(data_config);
  } catch (const Error& e) {
    fail_naming_train_data(c, e);
  }
  data::DataLoader& loader = *loader_or;
  check_data_tokenizer(c, data_dirs, log);
  const std::vector<CompanionFile> companions = companion_files(c, data_dirs);  // read and checked before anything runs
  // Packed / padded rows hold several documents: attention must stay inside each one.
  const bool by_document = loader.packing() != data::PackingMode::stream;

  check_output_dir(c, options, data_dirs);
  const DirectoryLock lock(c.output_dir);
  if (!lock.warning().empty()) log << "warning: " << lock.warning() << "\n";
  // Before the checks that may refuse the run: the note tells where an older run went.
  for (const fs::path& aside : orphaned_replaced_runs(c.output_dir))
    log << "note: " << aside.string() << " holds a run that an `--overwrite` run, killed or stopped before its first checkpoint, had moved aside; "
        << "to restore it, remove the files of the run that replaced it (checkpoint-*, metrics.jsonl, loss.svg) and move "
        << "its contents back; or delete it\n";
  const std::unique_ptr<ReplacedRun> replaced = prepare_output_dir(c, options, lock.held());
  for (const std::string& dir : remove_stale_partial_checkpoints(c.output_dir, lock.held()))
    log << "note: removed " << dir << ", a partial checkpoint of a run killed while saving\n";
  for (const std::string& file : remove_stale_partial_plots(c.output_dir, lock.held()))
    log << "note: removed " << file << ", the half-written plot of a run killed while writing it\n";

  // Memory plan, printed and checked before anything is allocated.
  const int64_t B = c.micro_batch_size, T = c.sequence_len, accum = c.gradient_accumulation_steps;
  const Recompute recompute = parse_recompute(c.recompute);
  TrainingMemory memory =
      estimate_training_memory(model_config, recipe, ctx.device, B, T, c.logits_chunk_tokens, recompute, by_document);
  const std::string workspace_note = fit_attention_workspace(memory, ctx);
  log << "ingot train: " << model_config.model_type << ", " << count_parameters(model_config) << " parameters, "
      << "device " << device->description() << ", precision " << describe(recipe) << "\n"
      << loader.summary() << "\n"
      << "memory plan: " << memory.summary() << "\n";
  if (!workspace_note.empty()) log << "note: " << workspace_note << "\n";
  if (!eos_note.empty()) log << "note: " << eos_note << "\n";
  if (!eos_warning.empty()) log << "warning: " << eos_warning << "\n";
  // Fewer training rows than one step reads: every step sees the same few rows again (a
  // val_fraction near 1 left one window, which every row of every batch repeated).
  if (loader.num_train_windows() < B * accum)
    log << "warning: " << c.source_of({"val_fraction", "micro_batch_size"}) << ": the training split holds "
        << counted(loader.num_train_windows(), "row") << ", fewer than the " << B * accum
        << " a step reads (micro_batch_size x gradient_accumulation_steps): each step repeats them"
        << (c.val_fraction > 0 ? "; lower val_fraction, or train on more data" : "; train on more data") << "\n";
  for (const std::string& warning : AdamW::bf16_rounding_warnings(recipe, c.adam_beta1, c.adam_beta2, c.learning_rate))
    log << "warning: " << c.source << ": " << warning << "\n";
  if (c.warmup_steps >= c.max_steps)
    log << "warning: " << c.source_of({"warmup_steps", "max_steps"}) << ": warmup_steps " << c.warmup_steps
        << " is not below max_steps " << c.max_steps << ": the learning rate never reaches learning_rate " << c.learning_rate
        << " (at most " << c.learning_rate * static_cast<double>(c.max_steps - 1) / static_cast<double>(c.warmup_steps)
        << ")\n";
  if (c.eval_steps > 0 && loader.num_val_windows() == 0)
    log << "note: " << c.source_of({"eval_steps", "val_fraction"}) << ": no validation data (val_fraction "
        << c.val_fraction << "), so eval_steps " << c.eval_steps << " evaluates nothing\n";
  if (T > model_config.max_position_embeddings)
    log << "warning: " << c.source_of({"sequence_len"}) << ": sequence_len " << T << " is above max_position_embeddings "
        << model_config.max_position_embeddings << " ("
        << (c.model.empty() ? std::string("model_config") : (fs::path(c.model) / "config.json").string())
        << "): RoPE reaches past it, but a pretrained model has not seen those positions, and an export's "
           "config.json still says "
        << model_config.max_position_embeddings << "\n";
  if (!c.model.empty()) io::check_hf_weights(c.model, plan_parameters(model_config));  // before anything is allocated
  check_memory_fits(memory, ctx, device->description(),
                    recipe.name == "bf16"
                        ? "reduce micro_batch_size or sequence_len, or set recompute: elementwise or block, "
                          "master_weights: false, grad_dtype: bf16 or optimizer_state_dtype: bf16"
                        : "reduce micro_batch_size or sequence_len, or set recompute: elementwise or block",
                    parameter_state_hint(recipe, false));

  Transformer model(model_config, recipe, ctx, B, T, c.logits_chunk_tokens, recompute);
  if (!c.model.empty()) io::load_hf_weights(ctx, c.model, model.entries(), model.weights());
  else model.init_random(c.seed);
  AdamW optimizer(model.entries(), recipe, ctx, adamw_config(c), model.weights());

  LrSchedule schedule;
  schedule.type = c.lr_scheduler_type;
  schedule.peak = c.learning_rate;
  schedule.warmup_steps = c.warmup_steps;
  schedule.total_steps = c.max_steps;
  schedule.min_lr_ratio = c.min_lr_ratio;
  schedule.decay_ratio = c.wsd_decay_ratio;
  if (c.lr_scheduler_type == "wsd" && c.warmup_steps < c.max_steps) {
    // The decay's start, as LrSchedule::at computes it: a warm-up past it ends with an abrupt change.
    const double decay_start = static_cast<double>(c.max_steps) -
                               std::max(1.0, c.wsd_decay_ratio * static_cast<double>(c.max_steps));
    if (static_cast<double>(c.warmup_steps) > decay_start) {
      const double before = schedule.at(c.warmup_steps - 1), after = schedule.at(c.warmup_steps);
      log << "warning: " << c.source_of({"warmup_steps", "wsd_decay_ratio", "max_steps"}) << ": warmup_steps "
          << c.warmup_steps << " runs into the wsd decay (the last " << c.wsd_decay_ratio << " of max_steps "
          << c.max_steps << ", from step " << static_cast<int64_t>(std::ceil(decay_start))
          << "): the learning rate never holds at learning_rate, and " << (after < before ? "drops" : "jumps")
          << " from " << before << " to " << after << " after the warm-up\n";
    }
  }

  int64_t start_step = 0;
  std::string resumed_from;  // the checkpoint --resume loaded, for the advice of a diverged step
  // Updates made so far: AdamW's t, whose bias correction starts over at the first update, not at
  // the first step (a step without trained targets makes none), as torch's AdamW counts step() calls.
  int64_t updates_done = 0;
  if (options.resume) {
    // Listed again under output_dir's lock: a run that held the folder may have saved since.
    const std::vector<std::string> checkpoints = list_checkpoints(c.output_dir);
    const std::string dir = checkpoints.back();
    // model: naming an older checkpoint of this run reads as "resume from there", which --resume
    // does not do: it took the newest without a word.
    std::error_code ec;
    for (size_t i = 0; !c.model.empty() && i + 1 < checkpoints.size(); ++i)
      if (fs::weakly_canonical(checkpoints[i], ec) == fs::weakly_canonical(c.model, ec))
        fail(c.source_of({"model"}), ": --resume continues from the run's newest checkpoint, ", dir, ", not from model ",
             c.model, "; to go back to ", checkpoints[i], ", move the checkpoints after it out of ", c.output_dir);
    // The architecture before the weights: a changed hidden_size would otherwise fail as a shape
    // mismatch that blames the checkpoint and points at the one before it.
    const ModelConfig saved_config =
        read_newest_checkpoint(checkpoints, c.output_dir, [&] { return load_model_config(dir); });
    check_same_architecture(dir, saved_config, model_config, c);
    const nlohmann::json state = read_newest_checkpoint(
        checkpoints, c.output_dir, [&] { return load_resume_checkpoint(dir, ctx, model, optimizer, compared_settings(c)); });
    // A cursor that disagrees with the config (seed, sequence_len, packing, val_fraction, the data)
    // names the config and the checkpoint; a damaged one is named by restore_state.
    using Setting = data::DataLoader::StateSetting;
    Setting setting = Setting::none;
    if (const std::string mismatch = loader.state_mismatch(state["data"], &setting); !mismatch.empty()) {
      // Named by the key that differs: a --set of another (say sequence_len, unchanged) was blamed.
      const std::string& source = setting == Setting::packing ? c.source_of({"packing"})
                                  : setting == Setting::seed   ? c.source_of({"seed"})
                                  : setting == Setting::seq_len ? c.source_of({"sequence_len"})
                                  : setting == Setting::split   ? c.source_of({"val_fraction"})
                                                                : c.source_of({"train_data"});
      fail(source, ": --resume from ", dir, ": ", mismatch,
           "; a resumed run keeps its data settings (to change them, start a new run with model: ", dir, ")");
    }
    read_newest_checkpoint(checkpoints, c.output_dir, [&] {
      try {
        loader.restore_state(state["data"]);
      } catch (const Error& e) {  // a cursor past the data, an unknown stride: said with the file that holds it
        std::string why = e.what();
        if (why.rfind("data: ", 0) == 0) why.erase(0, 6);
        fail((fs::path(dir) / "trainer_state.json").string(), ": key \"data\" (the data loader's cursor): ", why,
             ": the checkpoint is damaged");
      }
    });
    start_step = state["step"].get<int64_t>();
    // Checkpoints before 2026-12-02 do not record it: their runs counted updates by step.
    updates_done = state.value("updates", start_step);
    // Below the checkpoint's step, max_steps is a typo or the wrong run: "nothing to do" and exit 0
    // would hide it (at the step itself, a finished run resumed again, it is nothing to do).
    if (start_step > c.max_steps)
      fail(c.source_of({"max_steps"}), ": max_steps ", c.max_steps, " is below the step of the checkpoint --resume continues, ",
           dir, " (step ", start_step, "); raise max_steps to train on, or start a new run from it with model: ", dir);
    log << "resumed from " << dir << " at step " << start_step << "\n";
    resumed_from = dir;
    for (const std::string& change : resume_changes(state, c, recipe, workspace_note, attention_switches(ctx)))
      log << "note: resume: " << change << "\n";
  }
  MetricsLog metrics(c.output_dir, options.resume ? start_step : -1);

  // Training batches go through the step runner's pinned staging; evaluation uses its own.
  TrainStep runner(ctx, model, optimizer, accum, by_document, c.cuda_graph);
  const int64_t rows = B * T;
  std::vector<int32_t> inputs(rows), targets(rows), positions(rows), segments(rows);
  auto eval_buffers = [&]() {
    data::BatchBuffers b;
    b.input_ids = inputs.data();
    b.targets = targets.data();
    b.positions = positions.data();
    b.segment_ids = segments.data();
    return b;
  };
  auto eval_batch = [&]() {
    HostBatch hb;
    hb.input_ids = inputs.data();
    hb.targets = targets.data();
    hb.positions = positions.data();
    hb.segment_ids = by_document ? segments.data() : nullptr;
    return hb;
  };

  data::ValIterator val = loader.validation();
  bool eval_cut_short = false;  // by a stop signal: that step has no val_loss
  int64_t eval_batches_without_targets = 0;  // the last evaluation's batches, when none held a trained target
  auto evaluate = [&]() -> double {
    eval_batches_without_targets = 0;
    if (loader.num_val_windows() == 0) return -1;
    val.reset();
    double loss_sum = 0;
    int64_t count = 0, batches = 0;
    while (!val.done() && (c.eval_max_batches == 0 || batches < c.eval_max_batches)) {
      // A scheduler's grace period after SIGTERM is short: the checkpoint comes first.
      if (stop.received()) {
        eval_cut_short = true;
        return -1;
      }
      if (val.next_batch(B, eval_buffers()) == 0) break;
      for (int64_t i = 0; i < rows; ++i) count += targets[i] != ops::kIgnoreIndex;
      model.load_batch(eval_batch());
      loss_sum += model.forward_loss();
      ++batches;
    }
    if (count == 0) eval_batches_without_targets = batches;
    return count ? loss_sum / static_cast<double>(count) : -1;
  };

  int64_t updates_finished = 0;  // by this process
  // What a step that went numerically wrong says to look at, given the updates this process made
  // before it: none, the weights it started from; one after a resume, also the checkpoint's
  // optimizer state, which that update applied (damaged moments broke the weights there, and the
  // error blamed the learning rate); else the learning rate and clipping.
  auto divergence_advice = [&](int64_t updates_before) -> std::string {
    if (updates_before == 0 && resumed_from.empty())
      return "check the starting weights (" + (c.model.empty() ? std::string("init_std") : c.model) + ") and the data";
    if (updates_before == 0) return "check the checkpoint this run resumed from, " + resumed_from + ", and the data";
    const std::string rate = c.max_grad_norm > 0 ? "lower learning_rate or max_grad_norm, or check the data"
                                                 : "lower learning_rate, turn clipping on (max_grad_norm), or check the data";
    if (updates_before == 1 && !resumed_from.empty())
      return rate + ", or the optimizer state (optimizer.safetensors) of the checkpoint this run resumed from, " +
             resumed_from + ", which the run's first update applied";
    return rate;
  };
  // Weights that give a non-finite loss stop the run unsaved, with every older checkpoint kept.
  auto fail_unsaved = [&](int64_t step, const std::string& what) {
    const auto kept = list_checkpoints(c.output_dir);
    fail(what, " after step ", step, ": not saved, and no older checkpoint deleted",
         kept.empty() ? std::string() : "; the newest good checkpoint is " + kept.back(), "; ", divergence_advice(updates_finished));
  };
  // An update can leave every weight finite (1e20, say) and still make the forward overflow: before a
  // save the first validation batch goes through the weights, unless this step's evaluation has just
  // run them all. Without validation data, a copy of the step's first training micro-batch does
  // (kept in the evaluation buffers, which then serve nothing else).
  int64_t evaluated_step = -1;  // the step whose evaluation gave a finite val_loss
  const bool check_on_training_batch = loader.num_val_windows() == 0;
  bool training_batch_kept = false;
  auto keep_training_batch = [&](const data::BatchBuffers& b) {
    std::copy_n(b.input_ids, rows, inputs.data());
    std::copy_n(b.targets, rows, targets.data());
    std::copy_n(b.positions, rows, positions.data());
    if (b.segment_ids) std::copy_n(b.segment_ids, rows, segments.data());
    training_batch_kept = true;
  };
  auto check_weights_before_saving = [&](int64_t step) {
    if (evaluated_step == step) return;
    if (check_on_training_batch) {
      if (!training_batch_kept) return;
    } else {
      val.reset();
      if (val.next_batch(B, eval_buffers()) == 0) return;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < rows; ++i) count += targets[i] != ops::kIgnoreIndex;
    if (count == 0) return;
    model.load_batch(eval_batch());
    const double loss = model.forward_loss() / static_cast<double>(count);
    const std::string batch = check_on_training_batch ? "a training batch of the step" : "the first validation batch";
    if (!std::isfinite(loss)) fail_unsaved(step, "the loss on " + batch + " is " + number_text(loss));
  };
  // Rotation (save_total_limit) waits until a later step has trained on the newest checkpoint's
  // weights and found its loss and gradient norm sound: weights whose forward is finite can still be
  // dead (activations overflowed: every gradient 0), and deleting the checkpoint before them lost the
  // run's last good one. Until then one checkpoint more is kept.
  std::string unchecked_checkpoint;  // the newest checkpoint, until a step has trained on it soundly
  auto rotate_now = [&] {
    if (unchecked_checkpoint.empty()) return;
    for (const std::string& kept : rotate_checkpoints(c.output_dir, c.save_total_limit)) log << "warning: " << kept << "\n";
    unchecked_checkpoint.clear();
  };
  // A step that diverged right after a save started from the checkpoint just saved, which --resume
  // would load: the error says so, and names the one before it.
  auto diverged_from = [&]() -> std::string {
    if (unchecked_checkpoint.empty()) return "";
    const auto all = list_checkpoints(c.output_dir);
    return "; " + unchecked_checkpoint + " holds the weights this step started from, and --resume would load it" +
           (all.size() >= 2 ? ": to resume from " + all[all.size() - 2] + ", move it out of " + c.output_dir : std::string());
  };

  int64_t last_saved = -1;
  auto save = [&](int64_t step, bool commit = true) {
    CheckpointContents contents;
    contents.step = step;
    // A checkpoint is saved with no later step in flight, so updates_done counts this step's.
    contents.trainer_state = {{"step", step}, {"updates", updates_done}, {"data", loader.save_state()}, {"seed", c.seed},
                              {"max_steps", c.max_steps}, {"learning_rate", c.learning_rate},
                              {"lr_scheduler_type", c.lr_scheduler_type}, {"precision", recipe.name},
                              {"recipe", describe(recipe)}, {"micro_batch_size", c.micro_batch_size},
                              {"gradient_accumulation_steps", c.gradient_accumulation_steps},
                              {"config_source", c.source}};
    contents.trainer_state.update(step_settings(c));
    contents.trainer_state["attention_plan"] = workspace_note;
    contents.trainer_state["attention_switches"] = attention_switches(ctx);
    // (Saturated: save_total_limit may be any int64, and INT64_MAX + 1 overflowed.)
    const int64_t keep_one_more =
        c.save_total_limit > 0 ? c.save_total_limit + (c.save_total_limit < std::numeric_limits<int64_t>::max()) : 0;
    for (const std::string& kept : save_checkpoint(c.output_dir, ctx, model, optimizer, contents, companions, keep_one_more,
                                                   [&] { check_weights_before_saving(step); }))
      log << "warning: " << kept << "\n";
    if (c.save_total_limit > 0) unchecked_checkpoint = (fs::path(c.output_dir) / ("checkpoint-" + std::to_string(step))).string();
    metrics.write_plot();
    last_saved = step;
    if (replaced && commit) replaced->commit();
  };

  // Set-up's lines reach a redirected log now, not with the first step's (a scheduler's log file,
  // nohup): graph capture and GEMM timing can make that step a long one.
  log.flush();
  TrainResult result;
  const auto t_start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto t_window = t_start;
  int64_t window_steps = 0;
  double window_saving_s = 0;  // time the window spent saving or evaluating: not training, not in tokens/s
  const double elapsed_before = metrics.records().empty() ? 0.0 : metrics.records().back().elapsed_s;

  // A step is launched, then the previous one is finished (its loss read, logged): the GPU
  // always has the next step queued while the host logs and loads data. A step that evaluates or
  // saves is finished before the next launch, since both need its weights.
  struct Launched {
    int64_t step;    // 1-based
    int64_t update;  // 1-based count of updates, AdamW's t
    double lr;
    int64_t count;  // targets that are not ignored
  };
  std::deque<Launched> in_flight;
  auto evaluates = [&](int64_t done) { return done == c.max_steps || (c.eval_steps > 0 && done % c.eval_steps == 0); };
  auto saves = [&](int64_t done) { return done == c.max_steps || (c.save_steps > 0 && done % c.save_steps == 0); };
  // Logs step `done` (when due or when stopping), evaluates and saves as scheduled. No loss: the
  // step had no trained targets, and no update.
  auto finish_step = [&](int64_t done, double lr, std::optional<double> loss, std::optional<double> grad_norm) {
    if (loss) {
      ++window_steps;
      result.final_loss = *loss;
      result.final_loss_step = done;
    }
    const bool last = done == c.max_steps;
    const bool do_eval = evaluates(done);
    const bool do_log = last || done % c.logging_steps == 0 || do_eval || stop.received() || !loss;
    if (do_log) {
      const double window_s = seconds_since(t_window) - window_saving_s;
      const double elapsed = elapsed_before + seconds_since(t_start);
      MetricsRecord r;
      r.step = done;
      r.loss = loss;
      r.lr = lr;
      r.grad_norm = grad_norm;
      // A step without a loss trained nothing: 0, whatever the open window holds (it goes on).
      r.tokens_per_s = loss ? static_cast<double>(window_steps * accum * rows) / std::max(window_s, 1e-9) : 0.0;
      r.elapsed_s = elapsed;
      if (do_eval) {
        const auto t_eval = std::chrono::steady_clock::now();
        const double v = evaluate();
        if (!loss) window_saving_s += seconds_since(t_eval);  // the window goes on: leave it out
        // A NaN failed `v >= 0` and was dropped without a word, and the step's checkpoint saved.
        if (!std::isfinite(v)) fail_unsaved(done, "the validation loss is " + number_text(v));
        if (v >= 0) r.val_loss = v, result.final_val_loss = v, evaluated_step = done;
      }
      const double per_step = seconds_since(t_start) / static_cast<double>(done - start_step);
      char line[320];
      if (loss)
        std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | elapsed %s | eta %s",
                      static_cast<long long>(done), static_cast<long long>(c.max_steps), *loss, lr, *grad_norm,
                      r.tokens_per_s, format_duration(elapsed).c_str(),
                      format_duration(per_step * static_cast<double>(c.max_steps - done)).c_str());
      else
        std::snprintf(line, sizeof line, "step %lld/%lld | no trained targets in its batches (all masked or padding): no update",
                      static_cast<long long>(done), static_cast<long long>(c.max_steps));
      log << line;
      if (r.val_loss) log << " | val_loss " << *r.val_loss;
      if (do_eval && eval_cut_short)
        log << " | no val_loss: " << signal_name(stop.received()) << " came before the evaluation ended";
      if (do_eval && eval_batches_without_targets > 0) {
        log << " | no val_loss: no trained target in the " << eval_batches_without_targets << " validation batch(es) "
            << "evaluated (all masked or padding";
        if (c.eval_max_batches > 0) log << "; eval_max_batches " << c.eval_max_batches << ", 0 evaluates them all";
        log << ")";
      }
      log << std::endl;
      metrics.append(r);
      if (loss) {
        t_window = std::chrono::steady_clock::now();  // after the evaluation: it is not counted either
        window_steps = 0;
        window_saving_s = 0;
      }
    }
    if (saves(done)) {
      const auto t_save = std::chrono::steady_clock::now();
      save(done);
      window_saving_s += seconds_since(t_save);
    }
    result.steps = done;
  };
  auto finish_oldest = [&]() {
    const StepResult res = runner.collect();
    const Launched info = in_flight.front();
    in_flight.pop_front();
    const double loss = res.loss_sum / static_cast<double>(info.count);
    // Before this process's first update (steps without trained targets make none) the weights are
    // the starting ones, or the resumed checkpoint's.
    const bool first = updates_finished == 0;
    if (!std::isfinite(loss))
      fail("the loss is ", number_text(loss), " at step ", info.step, first ? ", before any update of this run" : "",
           "; ", divergence_advice(updates_finished), diverged_from());
    // A finite loss with a non-finite gradient norm: the clip scale is nan, so this step's update has
    // made the weights non-finite, and the next loss would blame the learning rate.
    if (!std::isfinite(res.grad_norm))
      fail("the gradient norm is ", number_text(res.grad_norm), " at step ", info.step, " (loss ", loss, ")",
           first ? ", at the first update of this run (values near the float range overflow in the backward)" : "",
           "; ", divergence_advice(updates_finished), diverged_from());
    // Exactly 0 with trained targets and a loss well above 0 (a memorised batch has both at 0): no
    // parameter gets any gradient, as when activations have overflowed and every output is the same
    // (RMSNorm's f32 sum of squares reaches infinity). Such a run went on "training" at a constant
    // loss, saving dead checkpoints over good ones.
    if (res.grad_norm == 0.0 && loss > 1e-3)
      fail("the gradient norm is 0 at step ", info.step, " (loss ", loss, "): no parameter gets any gradient, as when the "
           "activations have overflowed and every output is the same; ", divergence_advice(updates_finished), diverged_from());
    ++updates_finished;
    rotate_now();  // this step trained on the newest checkpoint's weights, soundly
    updates_done = info.update;
    finish_step(info.step, info.lr, loss, res.grad_norm);
  };

  for (int64_t step = start_step; step < c.max_steps && !stop.received(); ++step) {
    // The loss is the mean over all unmasked targets of the whole accumulated batch: the
    // gradients sum over the targets and the optimizer divides by their count.
    int64_t count = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const data::BatchBuffers b = runner.host_batch(micro);
      loader.next_batch(B, b);
      if (micro == 0 && check_on_training_batch && saves(step + 1)) keep_training_batch(b);
      for (int64_t i = 0; i < rows; ++i) count += b.targets[i] != ops::kIgnoreIndex;
    }
    const double lr = schedule.at(step);
    if (count == 0) {
      // Every target of the step's batches is masked or padding (the middle of a long prompt, say):
      // the mean loss is undefined and the gradient zero, so nothing is launched. An update would
      // still move the weights by AdamW's momentum and weight decay. The batches are used up.
      while (!in_flight.empty()) finish_oldest();
      finish_step(step + 1, lr, std::nullopt, std::nullopt);
      continue;
    }
    const int64_t update = (in_flight.empty() ? updates_done : in_flight.back().update) + 1;
    runner.launch(step + 1, update, lr, count);
    in_flight.push_back({step + 1, update, lr, count});
    // On the CPU a launch runs the step to the end, so there is nothing to overlap: finishing it at
    // once keeps each logged window (tokens/s) to the steps it reports, the last one included.
    if (in_flight.size() == 2 || ctx.device != Device::cuda) finish_oldest();
    if (!in_flight.empty() && (evaluates(step + 1) || saves(step + 1))) finish_oldest();
  }
  while (!in_flight.empty()) finish_oldest();
  if (start_step >= c.max_steps) log << "nothing to do: the run already reached max_steps " << c.max_steps << "\n";
  const int64_t reached = std::max(result.steps, start_step);
  result.steps = reached;
  if (stop.received() && reached == c.max_steps && eval_cut_short) {
    // Training is complete and saved, but the last evaluation is not (the signal came during it or
    // the step before it): the run ends by the signal, as a scheduler expects, and says what is
    // missing (a --resume has nothing left to do). Without validation data nothing is missing.
    result.stopped_by = stop.received();
    log << "stopped by " << signal_name(result.stopped_by) << " before the last step's evaluation ended (step " << reached
        << "): training is complete and saved, but step " << reached << " has no val_loss\n";
  } else if (stop.received() && reached < c.max_steps) {
    result.stopped_by = stop.received();
    log << "stopped by " << signal_name(result.stopped_by) << " after step " << reached << " of " << c.max_steps;
    if (reached > start_step) {
      // Not a commit of --overwrite (a save in the run's own course has made it already, if any): a
      // run stopped before then may be one its user regrets, so the run it replaces stays set
      // aside (named below) until a later run deletes it.
      if (last_saved != reached) save(reached, /*commit=*/false);
      log << ": saved " << (fs::path(c.output_dir) / ("checkpoint-" + std::to_string(reached))).string()
          << "; --resume continues from it\n";
      if (replaced)
        if (const fs::path aside = replaced->keep_aside(); !aside.empty())
          log << "note: the run --overwrite replaces is kept in " << aside.string()
              << " (this run saved no checkpoint before the stop's); delete it, or, to restore it, remove this run's "
                 "files (checkpoint-*, metrics.jsonl, loss.svg) and move its contents back\n";
    } else {
      log << ": no step finished, nothing saved\n";
      // A fresh run leaves nothing behind, so the same command can start it again; an
      // --overwrite run puts the old run back (~ReplacedRun).
      if (!options.resume && !(replaced && replaced->holds_old_run())) {
        std::error_code ec;
        for (const fs::path& file : run_files(c.output_dir)) fs::remove_all(file, ec);
      }
    }
  }
  // The run's last checkpoint, which no step has trained on: its save ran a batch through the weights
  // (a finite loss), and rotation goes ahead. (Weights dead but finite at the very last step pass.)
  rotate_now();
  const auto checkpoints = list_checkpoints(c.output_dir);
  if (!checkpoints.empty()) result.checkpoint_dir = checkpoints.back();
  return result;
}

}  // namespace ingot
