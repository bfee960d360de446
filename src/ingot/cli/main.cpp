// `ingot`: the command-line front end. Each subcommand parses its flags and calls the library;
// every ingot::Error becomes one "error: ..." line on stderr and exit status 1.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <regex>
#include <string_view>
#include <unistd.h>

#include <yaml-cpp/exceptions.h>

#include "ingot/core/arena.h"
#include "ingot/core/dir_lock.h"
#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/core/paths.h"
#include "ingot/core/text.h"
#include "ingot/core/process.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/byte_tokenizer.h"
#include "ingot/data/prepare.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/json_util.h"
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"
#include "ingot/train/bench.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/generate.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/trainer.h"

namespace fs = std::filesystem;
using namespace ingot;

namespace {

// A command line that parses but cannot run as given (a missing config, flags that exclude each
// other or do not apply): exit 2, as for a line that does not parse.
template <typename... Parts>
[[noreturn]] void usage_error(const Parts&... parts) {
  fail_as<UsageError>(parts...);
}

// CLI11 reads an integer in the base its prefix names ("010" is 8, "0x10" 16), an empty value as
// 0, and clamps one that overflows: numeric flags take plain decimal text, checked first.
std::string plain_integer_error(const std::string& text) {
  const size_t first = !text.empty() && text[0] == '-' ? 1 : 0;
  const bool digits = text.size() > first && text.find_first_not_of("0123456789", first) == std::string::npos;
  if (!digits || (text[first] == '0' && text.size() > first + 1))
    return "must be a plain decimal integer (no leading 0, no base prefix), got \"" + text + "\"";
  errno = 0;
  (void)std::strtoll(text.c_str(), nullptr, 10);
  return errno == ERANGE ? "is out of range: \"" + text + "\"" : std::string();
}
// The validators' descriptions are empty: help then names the option's type once ("--seq INT").
const CLI::Validator kInteger([](std::string& text) { return plain_integer_error(text); }, "");
// Decimal notation only: strtod alone also reads hex floats ("0x10" is 16) and "010".
const CLI::Validator kReal(
    [](std::string& text) {
      static const std::regex decimal(R"([+-]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|[+-]?\.[0-9]+([eE][+-]?[0-9]+)?)");
      if (!std::regex_match(text, decimal))
        return "must be a finite number in plain decimal (no leading 0, no base prefix), got \"" + text + "\"";
      errno = 0;
      const double value = std::strtod(text.c_str(), nullptr);
      return errno != ERANGE && std::isfinite(value) ? std::string() : "is out of range: \"" + text + "\"";
    },
    "");

// A value below `least` (checked after kInteger or kReal): "must be 1 or more, got 0".
CLI::Validator at_least(double least) {
  return CLI::Validator(
      [least](std::string& text) {
        std::ostringstream message;
        message << "must be " << least << " or more, got " << text;
        return std::strtod(text.c_str(), nullptr) >= least ? std::string() : message.str();
      },
      "");
}
// A value outside [least, most] (after kInteger): "must lie in [1, 16777216], got 0". Every bound
// a library function checks again is checked here too, so that both ends of a range exit 2.
CLI::Validator in_range(int64_t least, int64_t most) {
  return CLI::Validator(
      [least, most](std::string& text) {
        const long long value = std::strtoll(text.c_str(), nullptr, 10);
        if (value >= least && value <= most) return std::string();
        std::ostringstream message;
        message << "must lie in [" << least << ", " << most << "], got " << text;
        return message.str();
      },
      "");
}
// One of a few words: "must be auto, cpu or cuda, got \"tpu\"".
CLI::Validator one_of(std::vector<std::string> words) {
  return CLI::Validator(
      [words](std::string& text) {
        if (std::find(words.begin(), words.end(), text) != words.end()) return std::string();
        std::string list;
        for (size_t i = 0; i < words.size(); ++i) list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
        return "must be " + list + ", got \"" + text + "\"";
      },
      "");
}
// Text one of Ingot's own readers takes (a dtype, a byte size): what it refuses is a value of the
// wrong form, exit 2, like any other; it was exit 1.
CLI::Validator read_by(std::function<void(const std::string&)> read) {
  return CLI::Validator(
      [read](std::string& text) {
        try {
          read(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      "");
}

int command_train(const std::string& config_path, const std::vector<std::string>& overrides, bool resume, bool overwrite) {
  if (resume && overwrite) usage_error("--resume and --overwrite exclude each other");
  const TrainConfig config = load_train_config(config_path, overrides);
  TrainOptions options;
  options.resume = resume;
  options.overwrite = overwrite;
  const TrainResult result = run_training(config, options, std::cout);
  if (result.stopped_by) {
    // End by the signal itself, as its default action would have: a shell running a loop of
    // commands stops the loop only when a child dies of SIGINT. (As PID 1 nothing happens.)
    std::cout.flush();
    std::signal(result.stopped_by, SIG_DFL);
    std::raise(result.stopped_by);
    return 128 + result.stopped_by;
  }
  std::cout << "done: step " << result.steps << " of " << config.max_steps;
  if (result.final_loss) {
    std::cout << ", final loss " << *result.final_loss;
    if (result.final_loss_step != result.steps) std::cout << " (step " << result.final_loss_step << ")";
  }
  if (result.final_val_loss) std::cout << ", val_loss " << *result.final_val_loss;
  std::cout << "\ncheckpoint: " << result.checkpoint_dir << "\nmetrics: " << (fs::path(config.output_dir) / "metrics.jsonl").string()
            << "\nplot: " << (fs::path(config.output_dir) / "loss.svg").string() << "\n";
  return 0;
}

void command_info(const std::string& model_dir, int64_t seq, bool seq_given, int64_t micro_batch,
                  const std::string& precision, const RecipeOptions& recipe_options, const std::string& recompute) {
  INGOT_CHECK(seq >= 1 && micro_batch >= 1, "info: --seq and --micro-batch must be positive, got ", seq, " and ",
              micro_batch);
  if (seq > kMaxTokensPerStep || micro_batch > kMaxTokensPerStep / seq)
    usage_error("info: --micro-batch x --seq = ", micro_batch, " x ", seq, " tokens is above the limit of ",
                kMaxTokensPerStep);
  const std::string dir = resolve_model_dir(model_dir);
  const ModelConfig c = load_model_config(dir);
  const Device device = precision == "bf16" ? Device::cuda : Device::cpu;
  const Recipe recipe = make_recipe(precision, device, recipe_options);
  const TrainingMemory m = estimate_training_memory(c, recipe, device, micro_batch, seq, 0, parse_recompute(recompute));
  // As train and bench warn: the estimate holds, a pretrained model's quality there would not.
  // (Not for the default --seq, which no one asked of this model.)
  if (seq_given && seq > c.max_position_embeddings)
    std::cerr << "warning: --seq " << seq << " is above max_position_embeddings " << c.max_position_embeddings << " of "
              << dir << ": a pretrained model has not seen those positions\n";
  std::cout << "model:            " << dir << "\n"
            << "architecture:     " << c.model_type << " (" << c.num_hidden_layers << " layers, hidden " << c.hidden_size
            << ", MLP " << c.intermediate_size << ", heads " << c.num_attention_heads << "/" << c.num_key_value_heads
            << " of dim " << c.head_dim << ", vocab " << c.vocab_size << ")\n"
            << "options:          tied embeddings " << (c.tie_word_embeddings ? "yes" : "no") << ", qkv bias "
            << (c.attention_bias ? "yes" : "no") << ", qk-norm " << (c.qk_norm ? "yes" : "no") << ", rope_theta "
            << c.rope_theta << (c.rope_scaling.enabled ? ", llama3 rope scaling" : "") << "\n"
            << "parameters:       " << count_parameters(c) << " (matmul weights " << count_matmul_parameters(c) << ")\n"
            << "training memory at micro-batch " << micro_batch << " x seq " << seq << ", precision " << describe(recipe)
            << ", recompute " << recompute << ":\n"
            << "  params " << format_bytes(m.params) << ", grads " << format_bytes(m.grads) << ", master "
            << format_bytes(m.master) << ", optimizer " << format_bytes(m.optimizer) << ", activations "
            << format_bytes(m.activations) << ", scratch " << format_bytes(m.scratch) << "\n"
            << "  total " << format_bytes(m.total()) << "\n";
  // On a GPU whose free memory is smaller, the run shrinks this workspace (fit_attention_workspace).
  const AttentionWorkspaceRange attention = attention_workspace_range(m);
  if (attention.one_call > 0)
    std::cout << "  of the scratch, cuDNN's attention backward takes " << format_bytes(attention.one_call)
              << " in one call; where that does not fit, it runs in slices down to "
              << format_bytes(attention.smallest_slice) << " (total " << format_bytes(m.total() - attention.one_call + attention.smallest_slice)
              << "), else on Ingot's kernels (total " << format_bytes(m.total() - attention.one_call)
              << "); this is for whole rows: packed rows (SFT data with loss masks) run the backward on Ingot's "
                 "kernels, without it\n";
}

// CLI11's message for an option given without its value ("--max-new-tokens=", or last on the
// line) counts what is missing: "--max-new-tokens: 1 required INT missing", or with a range,
// "--seed: 1 required UINT:0 to 2^64-1 missing". Said plainly instead, with the type's name.
std::string plain_cli_message(const std::string& message) {
  static const std::regex missing_value(R"(^(-[^ :]+): 1 required ([^ :]+)(:.*?)? missing)");
  std::smatch m;
  if (!std::regex_search(message, m, missing_value)) return message;
  return m[1].str() + " needs a value (" + m[2].str() + "), and none was given" + m.suffix().str();
}

// An option that takes a value, followed by another option's name (`prepare in -o --overwrite`):
// CLI11 takes the next word as the value, so -o's folder became "--overwrite" and overwrite stayed
// off; `generate m --prompt --seed 3` then found 3 "not expected", and `--seq --micro-batch 2` a bad
// number. Checked on the words before parsing; returns the message for the first, or "".
std::string option_missing_its_value(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  const CLI::App* command = nullptr;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name() == argv[1]) command = sub;
  if (command == nullptr) return "";
  auto option_named = [&](std::string word) -> const CLI::Option* {
    if (word.size() < 2 || word[0] != '-') return nullptr;
    word = word.substr(0, word.find('='));
    if (const CLI::Option* o = command->get_option_no_throw(word)) return o;
    return app.get_option_no_throw(word);
  };
  for (int i = 2; i + 1 < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;  // what follows is positional
    const CLI::Option* option = word.find('=') == std::string::npos ? option_named(word) : nullptr;
    if (option != nullptr && option->get_expected_min() > 0 && option_named(argv[i + 1]) != nullptr)
      return option->get_name() + " needs a value, and none was given (" + argv[i + 1] + " followed it)";
  }
  return "";
}

// An error message as the terminal should show it: control bytes of a path or value the user gave
// (an escape sequence, a carriage return) written as \xNN, so they can neither rewrite the screen
// nor hide the message; newlines and tabs stay, as messages use them. The C1 controls are escaped
// too, in UTF-8 (C2 80 to C2 9F; C2 9B is a terminal's CSI) and as single bytes (9B, read by
// terminals that are not UTF-8), and so is every byte that is not part of valid UTF-8.
std::string printable(std::string_view message) {
  static const char kHex[] = "0123456789abcdef";
  std::string shown;
  auto escape = [&](unsigned char byte) {
    shown += "\\x";
    shown += kHex[byte >> 4];
    shown += kHex[byte & 15];
  };
  auto at = [&](size_t i) { return i < message.size() ? static_cast<unsigned char>(message[i]) : 0u; };
  for (size_t i = 0; i < message.size();) {
    const unsigned char byte = at(i);
    if (byte < 0x80) {
      if ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7F) escape(byte);
      else shown += char(byte);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes 80-BF.
    const size_t length = byte >= 0xC2 && byte <= 0xDF ? 2 : byte >= 0xE0 && byte <= 0xEF ? 3 : byte >= 0xF0 && byte <= 0xF4 ? 4 : 0;
    bool valid = length > 0 && i + length <= message.size();
    for (size_t k = 1; valid && k < length; ++k) valid = (at(i + k) & 0xC0) == 0x80;
    const bool c1 = valid && byte == 0xC2 && at(i + 1) <= 0x9F;
    if (!valid || c1) {
      for (size_t k = 0; k < (valid ? length : 1); ++k) escape(at(i + k));
      i += valid ? length : 1;
    } else {
      shown.append(message.substr(i, length));
      i += length;
    }
  }
  return shown;
}

// Fills a new directory: built as TARGET.tmp-<pid> beside it and renamed into place, so a failed
// export leaves no half directory.
void create_directory_whole(const fs::path& target, const std::function<void(const fs::path&)>& write) {
  // The name is shortened (at a UTF-8 boundary) where the suffix would pass the file system's
  // 255-byte limit: an output name that fits must not fail for its temporary name.
  const std::string suffix = ".tmp-" + std::to_string(::getpid()), name = target.filename().string();
  size_t keep = std::min(name.size(), size_t{255} - suffix.size());
  while (keep > 0 && keep < name.size() && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  const fs::path tmp = target.parent_path() / (name.substr(0, keep) + suffix);
  fs::remove_all(tmp);
  try {
    write(tmp);
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

// What an earlier export wrote that --overwrite must clear even where this export writes no file of
// that name: the weights and config, whose leftovers would mix two models (an older export's extra
// shards), and a killed export's folders. Everything else stays, as save_pretrained keeps it (a hub
// clone's .git and README.md, a user's own files); a companion file (tokenizer.json, ...) is
// replaced only by this export's own copy. --overwrite used to delete every entry, then every
// companion the source lacked.
bool is_stale_export_entry(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
         (name.starts_with("model-") && name.ends_with(".safetensors")) || name.starts_with(".export-new-") ||
         name.starts_with(".export-old-");
}

// Replaces an export in an existing directory, without renaming the directory itself, which may be
// a mount point (a container's volume): the new files are built in a hidden folder inside it, the
// old export's entries are moved into another, the new ones moved in, and only then are the old
// ones deleted. An error on the way puts the old entries back.
void replace_directory_contents(const fs::path& target, const std::function<void(const fs::path&)>& write) {
  // Folders of a killed export (one may hold the export it had set aside) are old entries like any
  // other, restored if this export fails.
  const fs::path staged = fresh_pid_path(target, ".export-new-"), aside = fresh_pid_path(target, ".export-old-");
  std::error_code ec;
  std::vector<fs::path> old_names, new_names, moved_old, moved_new;
  try {
    write(staged);
    for (const auto& entry : fs::directory_iterator(staged)) new_names.push_back(entry.path().filename());
    for (const auto& entry : fs::directory_iterator(target)) {
      const fs::path name = entry.path().filename();
      if (entry.path() != staged && entry.path() != aside &&
          (is_stale_export_entry(name.string()) || std::find(new_names.begin(), new_names.end(), name) != new_names.end()))
        old_names.push_back(name);
    }
    fs::create_directory(aside);
    for (const fs::path& name : old_names) fs::rename(target / name, aside / name), moved_old.push_back(name);
    for (const fs::path& name : new_names) fs::rename(staged / name, target / name), moved_new.push_back(name);
  } catch (...) {
    for (const fs::path& name : moved_new) fs::remove_all(target / name, ec);
    for (const fs::path& name : moved_old) fs::rename(aside / name, target / name, ec);
    fs::remove_all(staged, ec);
    fs::remove(aside, ec);
    throw;
  }
  fs::remove(staged, ec);
  fs::remove_all(aside, ec);
}

void export_model(const std::string& source, const std::string& out_dir, const std::string& dtype_name,
                  const std::string& max_shard, bool overwrite);

// The file system's refusals (a symbolic link loop, a name too long, a read-only folder) name the
// export and the path; they were a bare "filesystem error" line.
int command_export(const std::string& source, const std::string& out_dir, const std::string& dtype_name,
                   const std::string& max_shard, bool overwrite) {
  try {
    export_model(source, out_dir, dtype_name, max_shard, overwrite);
  } catch (const fs::filesystem_error& e) {
    // copy_file and rename name two paths, and the one at fault may be the second.
    const std::string paths = e.path1().empty()   ? ""
                              : e.path2().empty() ? " (" + e.path1().string() + ")"
                                                  : " (" + e.path1().string() + " -> " + e.path2().string() + ")";
    fail("export ", source, " -> ", out_dir, ": ", e.code().message(), paths);
  }
  return 0;
}

void export_model(const std::string& source, const std::string& out_dir, const std::string& dtype_name,
                  const std::string& max_shard, bool overwrite) {
  INGOT_CHECK(!out_dir.empty(), "export: the output directory must not be empty");
  // As `ingot train` and `prepare` refuse it: with --overwrite the model's files went into /.
  if (is_filesystem_root(out_dir))
    fail("export: output ", out_dir, " is the file system's root; give the model a folder of its own");
  const std::string dir = resolve_model_dir(source);
  const ModelConfig config = load_model_config(dir);
  const DType dtype = io::parse_disk_dtype(dtype_name);
  const int64_t max_shard_bytes = io::parse_byte_size(max_shard);
  // Replacing the output deletes it: never when the checkpoint being read is it or lies inside it.
  if (is_same_or_inside(dir, out_dir))
    fail("export: output ", out_dir, " is the checkpoint ", dir, " or a directory holding it; choose another output");
  // An export inside the checkpoint would be deleted with it when the run's rotation drops it.
  if (is_same_or_inside(out_dir, dir))
    fail("export: output ", out_dir, " lies inside the checkpoint ", dir,
         ", and would be deleted with it when checkpoints rotate; choose a directory outside it");
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    fail("export: output ", out_dir, " exists and is not a directory");
  if (fs::exists(out_dir) && !fs::is_empty(out_dir) && !overwrite)
    fail("export: ", out_dir, " exists and is not empty; pass --overwrite to replace it");
  if (directory_in_use(out_dir))
    fail("export: ", out_dir, " is the output_dir of an ingot run in progress; choose another output");
  // A training run's folder or a dataset's: an export beside them would make `model:` and
  // `train_data:` naming that folder mean something else.
  if (fs::is_directory(out_dir)) {
    std::string held = training_output_marker(out_dir);
    if (held.empty() && fs::exists(fs::path(out_dir) / "meta.json")) held = "meta.json";
    if (!held.empty())
      fail("export: ", out_dir, " holds a training run, a checkpoint or a dataset (", held, "); choose another output");
  }
  // "out/" and "out/." name out itself (a temporary folder named after them landed inside out).
  fs::path target = fs::absolute(out_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  // A folder under the name of a file the export replaces (config.json, a weights shard, a companion)
  // is the user's: --overwrite deleted it, with all it held.
  std::error_code iter_ec;
  for (const auto& entry : fs::directory_iterator(target, iter_ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code ec;
    const bool ours = is_stale_export_entry(name) || std::find(std::begin(kModelCompanionFiles),
                                                               std::end(kModelCompanionFiles), name) != std::end(kModelCompanionFiles);
    if (ours && !name.starts_with(".export-") && fs::is_directory(entry.symlink_status(ec)))
      fail("export: ", out_dir, " holds a folder named ", name, " where the export writes a file; move it out of ",
           out_dir, " (--overwrite replaces files only)");
  }
  // Nor as a checkpoint of a run: named checkpoint-<N> (or a partial one's name) in a run's folder,
  // it would become that run's newest checkpoint, which generate, info and --resume then read.
  std::error_code ec;
  if (target.filename().string().rfind("checkpoint-", 0) == 0 && fs::is_directory(target.parent_path(), ec) &&
      !training_output_marker(target.parent_path().string()).empty())
    fail("export: output ", out_dir, " would be a checkpoint of the training run in ", target.parent_path().string(),
         " (the run's newest, for generate, info and --resume); choose another output");
  for (fs::path up = fs::absolute(out_dir); !up.empty(); up = up.parent_path()) {
    // Creating a name that is a broken link fails; exists() calls it absent.
    if (const std::string link = broken_link_description(up); !link.empty())
      fail("export: cannot create output ", out_dir, ": ", up.string(), " is ", link);
    if (up != fs::absolute(out_dir) && fs::exists(up)) {
      if (!fs::is_directory(up)) fail("export: cannot create output ", out_dir, ": ", up.string(), " is not a directory");
      break;
    }
    if (up == up.root_path()) break;
  }
  // Checked before the weights are read and anything is written.
  const std::vector<CompanionFile> companions = model_companion_files(dir);
  auto writes = [&](const char* name) {
    return std::any_of(companions.begin(), companions.end(),
                       [&](const CompanionFile& file) { return fs::path(file.path).filename() == name; });
  };
  // tokenizer_config.json and chat_template.jinja go together (companion_files in trainer.cpp):
  // transformers reads a chat_template.jinja over the config's template, so one kept from an earlier
  // export would have been the template of the config this export writes.
  if (const fs::path jinja = target / "chat_template.jinja";
      fs::is_directory(target) && writes("tokenizer_config.json") && !writes("chat_template.jinja") && fs::exists(jinja))
    fail("export: ", jinja.string(), " would be the chat template of the tokenizer_config.json this export writes "
         "(transformers reads the .jinja over the config's own), and ", dir, " has no chat_template.jinja; delete or move "
         "it (an earlier export's, or your own), then export again");
  Context ctx;
  const auto entries = plan_parameters(config);
  // Before the host buffer of config.json's size.
  if (io::check_hf_weights(dir, entries))
    std::cerr << "note: " << dir << " stores weights as F64; Ingot reads them as f32, so the export holds them "
              << "rounded to f32 precision\n";
  // f32 on the host, whatever the dtype on disk; config.json's sizes set how much.
  std::vector<float> host;
  try {
    host.assign(static_cast<size_t>(total_numel(entries)), 0.0f);
  } catch (const std::bad_alloc&) {
    fail("export: out of host memory allocating ", format_bytes(total_numel(entries) * 4), " for the ",
         count_parameters(config), " parameters that ", (fs::path(dir) / "config.json").string(), " describes");
  }
  Tensor flat(host.data(), DType::f32, Device::cpu, {static_cast<int64_t>(host.size())});
  io::load_hf_weights(ctx, dir, entries, flat);
  auto write_export = [&](const fs::path& folder) {
    io::save_hf_model(folder.string(), config, entries, flat, dtype, max_shard_bytes);
    for (const CompanionFile& file : companions)
      io::write_file_atomically((folder / fs::path(file.path).filename()).string(), file.bytes);
  };
  // A companion file this export does not write stays (it may be the user's); but one an earlier
  // export wrote would pair another model's tokenizer or chat template with these weights.
  std::vector<std::string> kept;
  if (fs::is_directory(target))
    for (const char* name : kModelCompanionFiles)
      if (fs::exists(target / name) && !writes(name)) kept.push_back((target / name).string());
  if (fs::is_directory(target)) replace_directory_contents(target, write_export);
  else create_directory_whole(target, write_export);
  std::cout << "exported " << dir << " -> " << out_dir << " (" << ingot::dtype_name(dtype) << ")\n";
  for (const std::string& file : kept)
    std::cout << "note: kept " << file << ", which " << dir << " has no copy of; delete it if an earlier export "
              << "wrote it, since it belongs to that model\n";
}

int command_prepare(data::PrepareOptions options, const std::string& tokenizer_path, const std::string& format,
                    const std::string& overflow) {
  options.log = &std::cout;
  options.progress_tty = ::isatty(STDOUT_FILENO);
  options.format = data::parse_prepare_format(format);
  options.overflow = data::parse_overflow_policy(overflow);
  if (options.format != data::PrepareFormat::text && options.chat_template.empty() && !tokenizer_path.empty() &&
      tokenizer_path != "byte")  // the template sits next to tokenizer.json
    options.chat_template = fs::is_directory(tokenizer_path) ? tokenizer_path : fs::path(tokenizer_path).parent_path().string();
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (tokenizer_path.empty() || tokenizer_path == "byte") tokenizer = std::make_unique<data::ByteTokenizer>();
  else tokenizer = std::make_unique<data::BpeTokenizer>(data::BpeTokenizer::from_file(tokenizer_path));
  if (!tokenizer_path.empty() && tokenizer_path != "byte")
    options.tokenizer_file = fs::is_directory(tokenizer_path) ? (fs::path(tokenizer_path) / "tokenizer.json").string() : tokenizer_path;
  // Text loses such bytes without a word otherwise (the dataset still matches `tokenizers`).
  if (const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(tokenizer.get())) {
    if (const std::vector<uint8_t> dropped = bpe->dropped_bytes(); !dropped.empty()) {
      std::string listed;
      for (size_t i = 0; i < std::min<size_t>(dropped.size(), 8); ++i) listed += (i ? ", " : "") + byte_hex(dropped[i]);
      std::cerr << "warning: " << options.tokenizer_file << " has no token for " << dropped.size()
                << " of the 256 bytes (" << listed << (dropped.size() > 8 ? ", ..." : "")
                << ") and no unk_token: text holding them loses them, as Hugging Face tokenizers drops them\n";
    }
  }
  data::prepare_dataset(options, *tokenizer);  // logs its own report
  return 0;
}

// A prepare flag that does nothing for the format given is refused by name; several were ignored
// without a word (--train-on-inputs on text, --text-field on chat, --overflow without a limit).
void check_prepare_flags(const CLI::App& prepare, const std::string& format) {
  if (format != "text" && format != "chat" && format != "alpaca") return;  // prepare names the bad format
  const bool text = format == "text";
  struct Rule {
    const char* flag;
    bool applies;
    const char* where;
  };
  for (const Rule& rule : {Rule{"--doc-separator", text, "--format text"}, Rule{"--text-field", text, "--format text"},
                           Rule{"--no-special-tokens", text, "--format text"}, Rule{"--eos-token", text, "--format text"},
                           Rule{"--chat-template", !text, "--format chat or alpaca"},
                           Rule{"--chat-format", !text, "--format chat or alpaca"},
                           Rule{"--chat-date-string", !text, "--format chat or alpaca"},
                           Rule{"--train-on-inputs", !text, "--format chat or alpaca"},
                           Rule{"--messages-field", format == "chat", "--format chat"}})
    if (prepare.count(rule.flag) > 0 && !rule.applies)
      usage_error("prepare: ", rule.flag, " applies to ", rule.where, ", not to --format ", format, "; leave it out");
  // An empty --chat-template (an unset shell variable) read as "not given": the template beside
  // --tokenizer served without a word.
  if (prepare.count("--chat-template") > 0 && prepare["--chat-template"]->as<std::string>().empty())
    usage_error("prepare: --chat-template is empty; give the tokenizer_config.json (or the folder holding it) whose "
                "template renders the data, or leave it out for the one beside --tokenizer");
  // "" is what leaves the template's date in place: given explicitly, it is a mistake, not a date.
  if (prepare.count("--chat-date-string") > 0 && prepare["--chat-date-string"]->as<std::string>().empty())
    usage_error("prepare: --chat-date-string is empty; give the date its system turns show (e.g. \"26 Jul 2024\") or "
                "leave it out");
  if (prepare.count("--overflow") > 0 && prepare.count("--max-seq-len") == 0)
    usage_error("prepare: --overflow applies to documents longer than --max-seq-len, which is not given");
}

// generate, info and bench print their result: output that could not be written (a full disk, or a
// closed pipe, since SIGPIPE is ignored) fails the command, where it exited 0 with the text lost.
int stdout_written(const char* command) {
  // errno from this flush, if it fails; one set by an earlier call would name another cause.
  errno = 0;
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int flush_errno = errno;
  if (!std::cout || !flushed || std::ferror(stdout))
    fail(command, ": cannot write to standard output",
         flush_errno != 0 ? std::string(" (") + std::strerror(flush_errno) + ")" : std::string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past `ulimit -f` then fails with EFBIG, which every writer reports with its file name,
  // instead of the process dying silently on SIGXFSZ. A closed stdout (`ingot train | head`) no
  // longer kills a run on SIGPIPE: it trains on and writes its files.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"Ingot: train Llama-family language models (see README.md)", "ingot"};
  // "error: " like every other failure's message, so a script or a reader finds it the same way.
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    return "error: " + printable(plain_cli_message(CLI::FailureMessage::simple(failed, e)));
  });
  app.require_subcommand(1);
  // What a bug report needs to say: the version and which backends this binary has.
#ifdef INGOT_HAVE_CUDA
#ifdef INGOT_HAVE_CUDNN
  app.set_version_flag("--version", "ingot " INGOT_VERSION " (CPU and CUDA backends, cuDNN attention)");
#else
  app.set_version_flag("--version", "ingot " INGOT_VERSION " (CPU and CUDA backends, no cuDNN)");
#endif
#else
  app.set_version_flag("--version", "ingot " INGOT_VERSION " (CPU backend only)");
#endif

  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  std::string config_path;
  std::vector<std::string> overrides;
  bool resume = false, overwrite = false, list_keys = false;
  train->add_option("config", config_path, "YAML config (keys: docs/config.md)");
  train->add_option("--set", overrides, "override a config key: --set key=value (repeatable)")
      ->check(CLI::Validator(
          [](std::string& text) {
            const size_t eq = text.find('=');
            return eq == std::string::npos || eq == 0 ? "expected key=value, got \"" + text + "\"" : std::string();
          },
          ""));
  train->add_flag("--resume", resume, "continue from the newest checkpoint in output_dir");
  train->add_flag("--overwrite", overwrite, "replace a run already in output_dir");
  train->add_flag("--list-keys", list_keys, "print every config key with its default and exit");

  auto* prepare = app.add_subcommand("prepare", "tokenize text or JSONL into token shards");
  data::PrepareOptions prep;
  std::string tokenizer_path = "byte";
  prepare->add_option("inputs", prep.inputs, "text files, JSONL files or directories")->required();
  prepare->add_option("-o,--output", prep.output_dir, "output directory for the shards")->required();
  prepare->add_option("--tokenizer", tokenizer_path, "\"byte\" (default), a tokenizer.json or the folder holding it");
  prepare->add_option("--doc-separator", prep.doc_separator, "plain text: a line that separates documents (e.g. %)");
  prepare->add_option("--eos-token", prep.eos_token,
                      "text: the token that ends each document (default: the tokenizer's eos_token)");
  prepare->add_option("--text-field", prep.text_field, "JSONL: the field holding the text (default: text)");
  bool prep_no_special_tokens = false;  // flags that turn a default off: plain bools, inverted after parsing
  prepare->add_flag("--no-special-tokens", prep_no_special_tokens,
                    "text: leave out the tokenizer's special tokens around each document (Llama 3's <|begin_of_text|>)");
  prepare->add_option("--shard-tokens", prep.shard_tokens, "tokens per shard (default 100M)")
      ->check(kInteger)->check(in_range(1, int64_t{1} << 40));
  prepare->add_flag("--skip-invalid-json", prep.skip_invalid_json, "skip and count malformed JSONL lines instead of failing");
  prepare->add_flag("--overwrite", prep.overwrite, "replace shards already in the output directory");
  std::string prep_format = "text", prep_overflow = "truncate";
  prepare->add_option("--format", prep_format, "text (default), chat (JSONL messages) or alpaca (JSONL instruction/input/output)")
      ->check(one_of({"text", "chat", "alpaca"}));
  prepare->add_option("--chat-template", prep.chat_template, "chat/alpaca: tokenizer_config.json holding the chat template (default: next to --tokenizer)");
  prepare->add_option("--chat-format", prep.chat_format,
                      "chat/alpaca: render a template Ingot has not checked with this built-in format (chatml, "
                      "chatml-qwen3, llama3, llama3.1)")
      ->check(one_of({"chatml", "chatml-qwen3", "llama3", "llama3.1"}));
  prepare->add_option("--chat-date-string", prep.chat_date_string,
                      "chat/alpaca, llama3.1 templates: the date their system turn gives, as apply_chat_template's "
                      "date_string (default: today's where the template calls strftime_now, else the template's)");
  prepare->add_option("--messages-field", prep.messages_field, "chat: the JSONL field holding the messages (default: messages)");
  prepare->add_flag("--train-on-inputs", prep.train_on_inputs, "chat/alpaca: loss on every token, not only the assistant's");
  prepare->add_option("--max-seq-len", prep.max_seq_len, "documents longer than this many tokens are truncated or dropped (default: no limit)")
      ->check(kInteger)->check(at_least(0));
  prepare->add_option("--overflow", prep_overflow, "truncate (default) or drop documents longer than --max-seq-len")
      ->check(one_of({"truncate", "drop"}));
  prepare->add_option("--threads", prep.num_threads, "tokenizer threads (default: all cores)")
      ->check(kInteger)->check(in_range(0, 1024));

  auto* generate = app.add_subcommand("generate", "sample text from a model or checkpoint");
  GenerateOptions gen;
  generate->add_option("model", gen.model_dir, "model or checkpoint directory, or a run's output_dir")->required();
  generate->add_option("--prompt", gen.prompt, "text to continue (with --chat: the user's message); empty (the default): "
                                               "the sample starts from the tokenizer's special prefix alone, or its end-of-text "
                                               "token where there is none (id 0 without either); with --chat, an empty user turn");
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to sample (default 200)")
      ->check(kInteger)->check(at_least(0));
  generate->add_option("--temperature", gen.temperature, "softmax temperature; 0 is greedy (default 0.8)")
      ->check(kReal)->check(at_least(0));
  generate->add_option("--top-k", gen.top_k, "sample among the k most likely tokens; 0: all (default 40)")
      ->check(kInteger)->check(at_least(0));
  // CLI11 reads "-1" into a uint64_t as 2^64 - 1 and clamps what overflows: check the text first.
  generate->add_option("--seed", gen.seed, "sampling seed (default 0)")
      ->check(
          [](const std::string& text) {
            const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos &&
                                (text[0] != '0' || text.size() == 1);  // "010" would read as octal
            errno = 0;
            if (digits) (void)std::strtoull(text.c_str(), nullptr, 10);
            return digits && errno != ERANGE ? std::string()
                                             : "must be an integer from 0 to 18446744073709551615, got \"" + text + "\"";
          },
          "0 to 2^64-1");
  generate->add_option("--device", gen.device, "auto | cpu | cuda (default auto)")->check(one_of({"auto", "cpu", "cuda"}));
  bool gen_no_special_tokens = false;
  generate->add_flag("--no-special-tokens", gen_no_special_tokens,
                     "do not start the prompt with the tokenizer's special prefix (Llama 3's <|begin_of_text|>)");
  generate->add_option("--tokenizer", gen.tokenizer, "tokenizer.json, or byte (default: the model's, else bytes)");
  generate->add_flag("--chat", gen.chat,
                     "the prompt is a user message: rendered with the model's chat template, the reply printed alone");
  generate->add_option("--chat-format", gen.chat_format,
                       "with --chat: render a template Ingot has not checked with this built-in format (chatml, "
                       "chatml-qwen3, llama3, llama3.1)")
      ->check(one_of({"chatml", "chatml-qwen3", "llama3", "llama3.1"}));
  generate->add_option("--system", gen.system, "with --chat: a system message before the prompt");
  generate->add_option("--chat-date-string", gen.chat_date_string,
                       "with --chat, llama3.1 templates: the date their system turn gives, as prepare's "
                       "--chat-date-string (default: today's where the template calls strftime_now, else the template's)");

  auto* export_cmd = app.add_subcommand("export", "write a checkpoint as a Hugging Face model directory");
  std::string export_source, export_out, export_dtype = "f32", max_shard = "5GB";
  bool export_overwrite = false;
  export_cmd->add_option("checkpoint", export_source, "checkpoint or model directory, or a run's output_dir")->required();
  export_cmd->add_option("output", export_out, "directory to write")->required();
  export_cmd->add_option("--dtype", export_dtype, "f32 (default; lossless for Ingot's checkpoints), bf16 or f16")
      ->check(read_by([](const std::string& text) { (void)io::parse_disk_dtype(text); }));
  export_cmd->add_option("--max-shard-size", max_shard, "shard above this size (default 5GB)")
      ->check(read_by([](const std::string& text) { (void)io::parse_byte_size(text); }));
  export_cmd->add_flag("--overwrite", export_overwrite, "write into a non-empty output directory, replacing an earlier export's files (other files stay)");

  auto* info = app.add_subcommand("info", "describe a model and its training memory");
  std::string info_dir, info_precision = "fp32";
  int64_t info_seq = 2048, info_batch = 1;
  info->add_option("model", info_dir, "model or checkpoint directory, or a run's output_dir")->required();
  // As train's sequence_len.
  info->add_option("--seq", info_seq, "sequence length for the estimate (default 2048)")
      ->check(kInteger)->check(in_range(1, int64_t{1} << 24));
  info->add_option("--micro-batch", info_batch, "micro-batch for the estimate (default 1)")
      ->check(kInteger)->check(at_least(1));
  info->add_option("--precision", info_precision, "fp32 (CPU) or bf16 (CUDA) (default fp32)")
      ->check(one_of({"fp32", "bf16"}));
  RecipeOptions info_recipe;
  std::string info_recompute = "none";
  bool info_no_master_weights = false;
  info->add_flag("--no-master-weights", info_no_master_weights, "bf16: no f32 master copy");
  info->add_option("--grad-dtype", info_recipe.grad_dtype, "bf16: f32 | bf16 parameter gradients (default f32)")
      ->check(one_of({"f32", "bf16"}));
  info->add_option("--optimizer-state-dtype", info_recipe.optimizer_state_dtype, "bf16: f32 | bf16 AdamW m and v (default f32)")
      ->check(one_of({"f32", "bf16"}));
  info->add_option("--recompute", info_recompute, "none | elementwise | block (default none)")
      ->check(one_of({"none", "elementwise", "block"}));

  auto* bench = app.add_subcommand("bench", "measure training throughput of a random-initialised model");
  BenchOptions bench_options;
  bench->add_option("--model", bench_options.model, "HF model or checkpoint directory, a run's output_dir, or a preset (llama-3.2-1b, qwen3-0.6b, qwen2.5-0.5b, llama-3-8b)")->required();
  bench->add_option("--seq", bench_options.seq, "sequence length (default 4096)")
      ->check(kInteger)->check(in_range(1, int64_t{1} << 24));
  bench->add_option("--micro-batch", bench_options.micro_batch, "sequences per step (default 4)")
      ->check(kInteger)->check(at_least(1));
  bench->add_option("--steps", bench_options.steps, "timed steps; the median is reported (default 20)")
      ->check(kInteger)->check(in_range(1, kMaxBenchSteps));
  bench->add_option("--warmup", bench_options.warmup, "untimed steps first (default 3)")
      ->check(kInteger)->check(in_range(0, kMaxBenchSteps));
  bench->add_option("--device", bench_options.device, "auto | cpu | cuda (default auto)")->check(one_of({"auto", "cpu", "cuda"}));
  bool bench_no_master_weights = false, bench_no_cuda_graph = false;
  bench->add_flag("--no-master-weights", bench_no_master_weights, "update bf16 weights directly");
  bench->add_option("--grad-dtype", bench_options.recipe.grad_dtype, "f32 | bf16: parameter gradients (default f32)")
      ->check(one_of({"f32", "bf16"}));
  bench->add_option("--optimizer-state-dtype", bench_options.recipe.optimizer_state_dtype,
                    "f32 | bf16: AdamW's m and v (default f32)")
      ->check(one_of({"f32", "bf16"}));
  bench->add_flag("--stochastic-rounding", bench_options.recipe.stochastic_rounding,
                  "round the optimizer's bf16 stores stochastically (weights without master, bf16 moments)");
  bench->add_flag("--no-cuda-graph", bench_no_cuda_graph, "launch every op of every step (no graph replay)");
  bench->add_option("--recompute", bench_options.recompute, "none | elementwise | block (default none)")
      ->check(one_of({"none", "elementwise", "block"}));
  bench->add_flag("--json", bench_options.json, "print one JSON line (notes and --profile's breakdown go to standard error)");
  bench->add_flag("--profile", bench_options.profile, "then time every op of one step: the step breakdown");
  bench->add_option("--packed-doc-len", bench_options.packed_doc_len,
                    "pack each row with documents of mean length N (segment ids, as SFT data trains); 0: whole rows")
      ->check(kInteger)->check(at_least(0));
  bench->add_option("--logits-chunk-tokens", bench_options.logits_chunk_tokens,
                    "tokens per LM-head + loss chunk, as the config key logits_chunk_tokens (default 0: automatic)")
      ->check(kInteger)->check(at_least(0));

  // A mistyped command would otherwise read as "A subcommand is required": name it and the choices.
  if (argc >= 2 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->get_name() == argv[1];
    }
    if (!known) {
      std::cerr << "error: unknown command \"" << printable(argv[1]) << "\"; the commands are " << names
                << " (ingot --help)\n";
      return 2;
    }
  }
  if (const std::string missing = option_missing_its_value(app, argc, argv); !missing.empty()) {
    std::cerr << "error: " << printable(missing) << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the message (or the help); a mistake exits with 2 like an unknown command,
    // not with CLI11's per-kind codes.
    if (app.exit(e) != 0) return 2;
    // --help and --version: text lost to a full disk or a closed pipe fails them, as it fails the
    // commands that print a result.
    try {
      return stdout_written(dynamic_cast<const CLI::CallForVersion*>(&e) ? "--version" : "--help");
    } catch (const Error& written) {
      std::cerr << "error: " << printable(written.what()) << "\n";
      return 1;
    }
  } catch (const std::exception& e) {  // a conversion CLI11 did not wrap: never an abort
    std::cerr << "error: " << printable(e.what()) << "\n";
    return 2;
  }
  prep.add_special_tokens = !prep_no_special_tokens;
  gen.add_special_tokens = !gen_no_special_tokens;
  info_recipe.master_weights = !info_no_master_weights;
  bench_options.recipe.master_weights = !bench_no_master_weights;
  bench_options.cuda_graph = !bench_no_cuda_graph;
  try {
    if (*train) {
      if (list_keys) {
        if (!config_path.empty() || !overrides.empty() || resume || overwrite)
          usage_error("train: --list-keys prints the keys and runs nothing; leave out the config, --set, --resume and "
                      "--overwrite");
        for (const ConfigKeyInfo& k : train_config_keys())
          std::cout << k.name << " (default " << k.default_value << "): " << k.help << "\n";
        return stdout_written("train --list-keys");
      }
      if (config_path.empty()) usage_error("train: a CONFIG.yaml is required");
      return command_train(config_path, overrides, resume, overwrite);
    }
    if (*prepare) {
      check_prepare_flags(*prepare, prep_format);
      // An empty value (an unset shell variable, say) read as the byte tokenizer, quietly.
      if (prepare->count("--tokenizer") > 0 && tokenizer_path.empty())
        usage_error("prepare: --tokenizer is empty; give a tokenizer.json, the folder holding it, or byte");
      if (prepare->count("--eos-token") > 0 && tokenizer_path == "byte")
        usage_error("prepare: --eos-token names a token of a tokenizer.json tokenizer; the byte tokenizer ends each "
                    "document with its own end-of-text id 256: leave it out");
      return command_prepare(prep, tokenizer_path, prep_format, prep_overflow);
    }
    if (*generate) {
      for (const char* flag : {"--chat-format", "--system", "--chat-date-string"})
        if (generate->count(flag) > 0 && !gen.chat) usage_error("generate: ", flag, " applies with --chat, which is not given");
      if (generate->count("--tokenizer") > 0 && gen.tokenizer.empty())
        usage_error("generate: --tokenizer is empty; give a tokenizer.json, the folder holding it, or byte (or leave it "
                    "out for the model's own)");
      if (generate->count("--chat-date-string") > 0 && gen.chat_date_string.empty())
        usage_error("generate: --chat-date-string is empty; give the date the system turn shows or leave it out");
      if (gen.chat && generate->count("--no-special-tokens") > 0)
        usage_error("generate: --no-special-tokens applies to a plain prompt; with --chat the chat template decides how "
                    "the prompt starts");
      generate_text(gen, &std::cout);
      return stdout_written("generate");
    }
    if (*export_cmd) return command_export(export_source, export_out, export_dtype, max_shard, export_overwrite);
    if (*info) {
      // A recipe flag for --precision bf16 does not apply to fp32: a usage error, as for prepare's.
      if (const RecipeOptionProblem problem = find_recipe_option_problem(info_recipe, info_precision); problem.key) {
        const std::string key = problem.key;
        const std::string flag = key == "master_weights" ? "--no-master-weights"
                                 : key == "grad_dtype"   ? "--grad-dtype bf16"
                                                         : "--optimizer-state-dtype bf16";
        usage_error("info: ", flag, " applies to --precision bf16 (the CUDA recipe), not to --precision ", info_precision,
                    "; leave it out");
      }
      command_info(info_dir, info_seq, info->count("--seq") > 0, info_batch, info_precision, info_recipe, info_recompute);
      return stdout_written("info");
    }
    if (*bench) {
      run_bench(bench_options, std::cout, bench_options.json ? std::cerr : std::cout);
      return stdout_written("bench");
    }
  } catch (const UsageError& e) {
    std::cerr << "error: " << printable(e.what()) << "\nRun with --help for more information.\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "error: " << printable(e.what()) << "\n";
    return 1;
  } catch (const YAML::Exception& e) {
    std::cerr << "error: YAML: " << printable(e.what()) << "\n";
    return 1;
  } catch (const fs::filesystem_error& e) {
    std::cerr << "error: " << printable(e.what()) << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of host memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << printable(e.what()) << "\n";
    return 1;
  }
  return 0;
}
