#include "ingot/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/core/process.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/json_util.h"
#include "ingot/io/safetensors.h"

namespace ingot {

namespace fs = std::filesystem;

std::vector<CompanionFile> model_companion_files(const std::string& dir) {
  std::vector<CompanionFile> files;
  for (const char* name : kModelCompanionFiles) {
    const fs::path file = fs::path(dir) / name;
    if (!optional_file_exists(file)) continue;
    std::string text = io::read_text_file(file.string(), "companion file");  // a folder or FIFO is named here
    // Validity only: accept() builds no document (a tokenizer.json is megabytes, parsed again by
    // whatever reads it); parse_json then names what is wrong.
    if (file.extension() == ".json" && !nlohmann::json::accept(text))
      (void)io::parse_json(text, file.string(), "companion file");
    files.push_back({file.string(), std::move(text)});
  }
  return files;
}

std::vector<char> host_trainable_weights(Context& ctx, Transformer& model, AdamW* optimizer, DType* dtype) {
  const Tensor source = optimizer && optimizer->master().present() ? optimizer->master() : model.weights();
  std::vector<char> host(static_cast<size_t>(source.bytes()));
  copy_to_host(ctx, host.data(), source);
  *dtype = source.dtype;
  return host;
}

// Whether a partial file or folder named after `pid` was left by a process that is gone: with the
// directory's lock held (`exclusive`) every other pid's is; without it, a live process's may be in use.
static bool left_by_a_gone_process(int64_t pid, bool exclusive) {
  return pid >= 0 && pid != ::getpid() && (exclusive || !process_exists(pid));
}

std::vector<std::string> remove_stale_partial_checkpoints(const std::string& output_dir, bool exclusive) {
  std::vector<std::string> removed;
  if (!fs::is_directory(output_dir)) return removed;
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.find(".tmp-");
    if (at == std::string::npos || checkpoint_step(name.substr(0, at)) < 0 || !entry.is_directory()) continue;
    const int64_t pid = pid_suffix(name, name.substr(0, at + 5));
    if (!left_by_a_gone_process(pid, exclusive)) continue;
    // save_checkpoint writes files only: a folder holding another folder is not one of its
    // partial checkpoints, whatever its name, and is left alone.
    std::error_code ec;
    bool files_only = true;
    for (fs::directory_iterator it(entry.path(), ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      files_only = files_only && it->is_regular_file(ec);
    if (ec || !files_only) continue;
    fs::remove_all(entry.path());
    removed.push_back(entry.path().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<std::string> remove_stale_partial_plots(const std::string& output_dir, bool exclusive) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(output_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t pid = pid_suffix(name, "loss.svg.tmp-");
    std::error_code file_ec;
    if (!left_by_a_gone_process(pid, exclusive) || !it->is_regular_file(file_ec)) continue;
    if (fs::remove(it->path(), file_ec)) removed.push_back(it->path().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::string resolve_model_dir(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory) fail("cannot read model or checkpoint ", path, ": ", ec.message());
    fail("no such model or checkpoint: ", path);
  }
  // A file (model.safetensors, config.json) was read as a folder's config.json or shard index.
  if (!fs::is_directory(status))
    fail(path, " is a file; give the directory that holds config.json and the weights (or a run's output_dir)");
  const fs::path config = fs::path(path) / "config.json";
  const bool has_config = fs::exists(config, ec);
  if (ec) fail("cannot read model or checkpoint ", path, ": ", ec.message(), " (", config.string(), ")");
  if (has_config) return path;
  const auto checkpoints = list_checkpoints(path);
  if (checkpoints.empty()) fail(path, " holds neither config.json nor checkpoint-* directories");
  return checkpoints.back();
}

bool is_same_or_inside(const std::string& path, const std::string& dir) {
  const fs::path inner = fs::weakly_canonical(path), outer = fs::weakly_canonical(dir);
  return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first == outer.end();
}

namespace {

// The files of a checkpoint, written into tmp_dir and renamed to final_dir. Throws on any failure,
// leaving no partial folder.
void write_checkpoint_files(const fs::path& tmp_dir, const fs::path& final_dir, const std::string& output_dir,
                            Context& ctx, Transformer& model, AdamW& optimizer, const Tensor& flat,
                            const CheckpointContents& contents, const std::vector<CompanionFile>& companions) {
  const DType dtype = flat.dtype;
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  // A save that fails part way (a full disk) leaves no partial folder behind.
  struct RemoveUnlessRenamed {
    const fs::path& dir;
    ~RemoveUnlessRenamed() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_partial{tmp_dir};

  io::save_hf_model(tmp_dir.string(), model.config(), model.entries(), flat, dtype, int64_t{1} << 62);

  std::vector<char> m(static_cast<size_t>(optimizer.exp_avg().bytes())), v(m.size());
  copy_to_host(ctx, m.data(), optimizer.exp_avg());
  copy_to_host(ctx, v.data(), optimizer.exp_avg_sq());
  const DType state = optimizer.exp_avg().dtype;
  const int64_t P = optimizer.exp_avg().numel();
  io::write_safetensors((tmp_dir / "optimizer.safetensors").string(),
                        {{"exp_avg", Tensor(m.data(), state, Device::cpu, {P}), state},
                         {"exp_avg_sq", Tensor(v.data(), state, Device::cpu, {P}), state}});
  io::write_file_atomically((tmp_dir / "trainer_state.json").string(), io::dump_json(contents.trainer_state, 2) + "\n");
  // In order: a dataset's tokenizer replaces the starting model's.
  for (const CompanionFile& file : companions)
    io::write_file_atomically((tmp_dir / fs::path(file.path).filename()).string(), file.bytes);

  // A checkpoint of the same step from an earlier, overwritten attempt is replaced; anything else
  // under its name (the trainer refuses such a file at the start) is not deleted.
  std::error_code status_ec;
  if (fs::exists(fs::symlink_status(final_dir, status_ec)) && !fs::is_directory(final_dir, status_ec))
    fail(final_dir.string(), " exists and is not a checkpoint folder, which is not saved over (move it out of ",
         output_dir, ")");
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
}

}  // namespace

std::vector<std::string> rotate_checkpoints(const std::string& output_dir, int64_t keep_last) {
  std::vector<std::string> kept;
  if (keep_last > 0) {
    const auto all = list_checkpoints(output_dir);
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
      // Renamed to a partial checkpoint's name first: a deletion that fails halfway then leaves
      // no half checkpoint under a checkpoint's name (the next run removes the rest).
      std::error_code ec;
      const fs::path doomed = all[i] + ".tmp-" + std::to_string(::getpid());
      fs::rename(all[i], doomed, ec);
      if (!ec) fs::remove_all(doomed, ec);
      if (ec) kept.push_back("cannot delete " + all[i] + " (" + ec.message() + ") to keep the newest " +
                             std::to_string(keep_last) + " checkpoints (save_total_limit); training goes on");
    }
  }
  return kept;
}

std::vector<std::string> save_checkpoint(const std::string& output_dir, Context& ctx, Transformer& model,
                                         AdamW& optimizer, const CheckpointContents& contents,
                                         const std::vector<CompanionFile>& companions, int64_t keep_last,
                                         const std::function<void()>& check_before_writing) {
  const fs::path final_dir = fs::path(output_dir) / ("checkpoint-" + std::to_string(contents.step));
  const fs::path tmp_dir = fs::path(output_dir) / ("checkpoint-" + std::to_string(contents.step) + ".tmp-" +
                                                   std::to_string(::getpid()));
  DType dtype;
  std::vector<char> weights = host_trainable_weights(ctx, model, &optimizer, &dtype);
  Tensor flat(weights.data(), dtype, Device::cpu, {model.weights().numel()});
  // Weights that an update sent to inf or nan must not become the newest checkpoint: rotation
  // would then delete the good ones before it, and --resume refuses such a file anyway.
  // Parameter by parameter: the padding between them is never read.
  for (const ParamEntry& e : model.entries()) {
    const Tensor values(weights.data() + e.offset * dtype_size(dtype), dtype, Device::cpu, {e.numel});
    if (const int64_t bad = io::first_invalid_element(values); bad >= 0) {
      const auto kept = list_checkpoints(output_dir);
      fail("the weights after step ", contents.step, " hold a non-finite value (parameter ", e.name, ", element ", bad,
           "): not saved, and no older checkpoint deleted",
           kept.empty() ? std::string() : "; the newest good checkpoint is " + kept.back(),
           ". Lower learning_rate or max_grad_norm, or check the data");
    }
  }
  if (check_before_writing) check_before_writing();
  // Whatever stops the writing (a full disk, a folder made read-only) is named with the step and
  // what is kept: a raw "filesystem error: cannot create directories" said neither.
  std::string why;
  try {
    write_checkpoint_files(tmp_dir, final_dir, output_dir, ctx, model, optimizer, flat, contents, companions);
  } catch (const fs::filesystem_error& e) {
    why = e.code().message() + " (" + e.path1().string() + ")";
  } catch (const Error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    const auto kept = list_checkpoints(output_dir);
    fail("the checkpoint of step ", contents.step, " could not be saved in ", output_dir, ": ", why,
         kept.empty() ? std::string() : "; the newest checkpoint is " + kept.back());
  }
  return rotate_checkpoints(output_dir, keep_last);
}

nlohmann::json load_checkpoint(const std::string& dir, Context& ctx, Transformer& model, AdamW& optimizer) {
  if (optimizer.master().present()) {
    io::load_hf_weights(ctx, dir, model.entries(), optimizer.master());
    ops::copy(ctx, model.weights(), optimizer.master());
  } else {
    io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  }
  const std::string optimizer_file = (fs::path(dir) / "optimizer.safetensors").string();
  const io::SafeTensorsReader reader = io::SafeTensorsReader::open(optimizer_file);
  for (const auto& [name, target] : {std::pair{"exp_avg", optimizer.exp_avg()}, std::pair{"exp_avg_sq", optimizer.exp_avg_sq()}}) {
    std::vector<char> host(static_cast<size_t>(target.bytes()));
    Tensor host_view = target;
    host_view.data = host.data();
    host_view.device = Device::cpu;
    reader.read_into(name, host_view);
    // A nan or negative second moment gives nan updates from the first step: refuse the file.
    const bool second_moment = std::string(name) == "exp_avg_sq";
    if (const int64_t bad = io::first_invalid_element(host_view, second_moment); bad >= 0)
      fail("tensor \"", name, "\" in ", optimizer_file, " holds ", second_moment ? "a negative or non-finite" : "a non-finite",
           " value at element ", bad, ": the optimizer state is damaged");
    copy_from_host(ctx, target, host.data());
  }
  const std::string state_file = (fs::path(dir) / "trainer_state.json").string();
  return io::parse_json(io::read_text_file(state_file, "trainer state"), state_file, "trainer state");
}

}  // namespace ingot
