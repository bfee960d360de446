#include "ingot/data/loader.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/core/text.h"
#include "ingot/data/prepare.h"
#include "ingot/data/shard.h"
#include "ingot/io/json_util.h"

namespace ingot::data {

namespace fs = std::filesystem;

namespace {

// Uniform integer in [0, bound) by rejection, so the result depends only on the mt19937_64
// stream (std::uniform_int_distribution's algorithm is implementation-defined).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound: values below it are biased
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

std::string describe_files(const std::vector<std::string>& files) {
  std::ostringstream s;
  const size_t shown = std::min<size_t>(files.size(), 4);
  for (size_t i = 0; i < shown; ++i) s << (i ? ", " : "") << files[i];
  if (files.size() > shown) s << " and " << files.size() - shown << " more";
  return s.str();
}

// A directory written by `ingot prepare` lists its shards in meta.json. A listed shard that is
// missing (a partial copy), one whose token count differs (cut short, or replaced), or a .bin file
// the list lacks (another dataset's shard copied in) would train on other data than prepared,
// without a word: each is an error naming the file. meta.json is optional; without it, or when it
// is not prepare's ("format": "ingot-token-shards"), the directory's *.bin files are taken as they are.
// The shards of dir in the order its prepare meta.json lists them, which is the order prepare wrote
// them (train-99999.bin, then train-100000.bin: sorted as names, the 100,000th would come between
// train-10000 and train-10001); nullopt where dir has no such meta.json.
std::optional<std::vector<std::string>> check_against_meta(const std::string& dir, const std::vector<std::string>& found) {
  const fs::path meta_path = fs::path(dir) / "meta.json";
  std::error_code ec;
  // A prepare --overwrite killed while swapping datasets leaves the old one in .prepare-<pid>/old
  // and a mix of old and new shards here, with meta.json moved aside or not yet moved in; one killed
  // while moving its dataset in leaves part of it here and the rest, with meta.json, there.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(".prepare-", 0) != 0) continue;
    if (holds_set_aside_dataset(entry.path().string()))
      fail("data: ", dir, " holds ", (entry.path() / "old").string(), ", a dataset that an `ingot prepare --overwrite` "
           "killed while replacing it had set aside: the shards here may mix two datasets (re-run that prepare, or "
           "move the files of that folder back)");
    if (holds_staged_dataset(entry.path().string()))
      fail("data: ", dir, " holds ", (entry.path() / "meta.json").string(), ", the rest of a dataset that an `ingot "
           "prepare` was moving in when it was killed (or is still running): the shards here may be part of it (re-run "
           "that prepare with --overwrite)");
  }
  if (!fs::exists(meta_path, ec)) return std::nullopt;
  const std::string meta_file = meta_path.string();
  const std::string fix = " (re-run ingot prepare, or delete meta.json to train on the directory's shards as they are)";
  const nlohmann::json meta = io::parse_json(io::read_text_file(meta_file, "dataset meta"), meta_file, "dataset meta");
  if (!meta.is_object() || !meta.contains("format") || meta["format"] != "ingot-token-shards")
    return std::nullopt;  // not prepare's
  if (!meta.contains("shards") || !meta["shards"].is_array())
    fail("data: ", meta_file, " has no \"shards\" list", fix);
  // Sets, not list scans: 30000 shards took 14 s to check, 60000 over a minute.
  const std::set<std::string> present(found.begin(), found.end());
  std::set<std::string> listed;
  std::vector<std::string> in_order;
  for (const nlohmann::json& entry : meta["shards"]) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() || !entry.contains("num_tokens"))
      fail("data: ", meta_file, ": a \"shards\" entry lacks \"file\" or \"num_tokens\": ", io::json_brief(entry), fix);
    if (!entry["num_tokens"].is_number_integer())
      fail("data: ", meta_file, ": the \"num_tokens\" of shard ", entry["file"].get<std::string>(),
           " is not a whole number: ", entry["num_tokens"].dump(), fix);
    const std::string name = entry["file"].get<std::string>();
    const fs::path file = fs::path(dir) / name;
    if (!listed.insert(file.string()).second) fail("data: ", meta_file, " lists shard ", name, " twice", fix);
    if (!present.contains(file.string()))
      fail("data: ", meta_file, " lists shard ", name, ", which is missing from ", dir, fix);
    const int64_t tokens = read_shard_token_count(file.string());
    // Compared as written: a count past int64 read back as -1.
    if (entry["num_tokens"].is_number_unsigned() ? entry["num_tokens"].get<uint64_t>() != uint64_t(tokens)
                                                 : entry["num_tokens"].get<int64_t>() != tokens)
      fail("data: shard ", file.string(), " holds ", tokens, " tokens, but ", meta_file, " lists ",
           entry["num_tokens"].dump(), fix);
    in_order.push_back(file.string());
  }
  for (const std::string& file : found)
    if (!listed.contains(file)) fail("data: ", file, " is not one of the shards ", meta_file, " lists", fix);
  return in_order;
}

// What a train_data entry is when it is not a regular file, for the error that names it.
std::string what_is_not_a_file(const fs::path& path) {
  if (std::string link = broken_link_description(path); !link.empty()) return link;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) return "a directory";
  if (fs::is_fifo(status)) return "a FIFO";
  if (fs::is_socket(status)) return "a socket";
  if (fs::is_block_file(status) || fs::is_character_file(status)) return "a device";
  return "not a regular file";
}

}  // namespace

std::vector<std::string> resolve_shard_paths(const std::vector<std::string>& specs) {
  INGOT_CHECK(!specs.empty(), "data: no shard paths given");
  std::vector<std::string> files;
  for (const std::string& spec : specs) {
    std::vector<std::string> found;
    std::error_code ec;
    if (spec.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
      // A *.bin match that is no file (a dangling link, a folder) is named: it was passed over, and
      // the run trained on part of its data without a word. Other folders, and the files `ingot
      // prepare` writes beside its shards (`data/*` matches meta.json), are not shards and are passed
      // over; any other file is read as one (a shard may be named otherwise), its header checked.
      auto beside_shards = [](const fs::path& p) {
        return p.filename() == "meta.json" || is_tokenizer_file_name(p.filename().string());
      };
      std::string not_a_file;
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc && not_a_file.empty(); ++i) {
          const fs::path match = g.gl_pathv[i];
          if (fs::is_regular_file(match, ec)) {
            if (!beside_shards(match)) found.push_back(match.string());
          } else if (match.extension() == ".bin") {
            not_a_file = match.string() + " is " + what_is_not_a_file(match);
          }
        }
      ::globfree(&g);
      if (!not_a_file.empty()) fail("data: ", spec, " matches ", not_a_file, ", not a shard file");
      INGOT_CHECK(!found.empty(), "data: no shard files match ", spec);
      std::sort(found.begin(), found.end());
    } else if (fs::is_directory(spec, ec)) {
      // Without throwing: an unreadable folder is named here, not as a bare filesystem error.
      fs::directory_iterator it(spec, ec);
      for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
        if (it->path().extension() != ".bin") continue;
        std::error_code file_ec;
        if (!fs::is_regular_file(it->path(), file_ec))  // passed over, it silently shrank the data
          fail("data: directory ", spec, " holds ", it->path().string(), ", which is ", what_is_not_a_file(it->path()),
               ", not a shard file");
        found.push_back(it->path().string());
      }
      if (ec) fail("data: cannot list directory ", spec, ": ", ec.message());
      std::sort(found.begin(), found.end());
      // First: a listed shard is named, also when none is left.
      if (std::optional<std::vector<std::string>> listed = check_against_meta(spec, found)) found = std::move(*listed);
      INGOT_CHECK(!found.empty(), "data: directory ", spec, " holds no *.bin shards");
    } else {
      if (!fs::exists(spec, ec)) {
        const bool link = fs::is_symlink(fs::symlink_status(spec, ec));
        fail("data: shard path ", spec, link ? " is " + what_is_not_a_file(spec) : std::string(" does not exist"));
      }
      found.push_back(spec);
    }
    files.insert(files.end(), found.begin(), found.end());
  }
  // A shard reached twice (a directory and one of its files, two globs, a symlink) would be trained
  // twice, and validation (the stream's tail) would hold training text.
  std::map<fs::path, std::string> seen;
  for (const std::string& file : files) {
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(file, ec);
    const auto [it, inserted] = seen.emplace(ec ? fs::path(file) : real, file);
    if (!inserted)
      fail("data: shard ", file, " is listed twice in train_data", it->second == file ? "" : " (also as " + it->second + ")",
           "; each shard may be named once (a run that trained on it twice cannot be resumed: start a new run "
           "from its checkpoint with model:)");
  }
  return files;
}

PackingMode resolve_packing_mode(const std::string& name, const std::vector<std::string>& paths) {
  if (name != "auto") {
    INGOT_CHECK(name == "stream" || name == "packed" || name == "padded", "data: packing \"", name,
                "\" is not one of auto, stream, packed, padded");
    return parse_packing_mode(name);
  }
  for (const std::string& file : resolve_shard_paths(paths))
    if (Shard(file).has_loss_mask()) return PackingMode::packed;
  return PackingMode::stream;
}

DataLoader::DataLoader(const DataLoaderConfig& config)
    : use_loss_mask_(config.use_loss_mask), seq_len_(config.seq_len), seed_(config.seed),
      mode_(config.packing) {
  INGOT_CHECK(config.seq_len > 0, "data: seq_len must be positive, got ", config.seq_len);
  INGOT_CHECK(config.vocab_size > 0, "data: vocab_size must be positive, got ", config.vocab_size);
  INGOT_CHECK(config.val_fraction >= 0 && config.val_fraction < 1,
              "data: val_fraction must be in [0, 1), got ", config.val_fraction);
  files_ = resolve_shard_paths(config.paths);
  const int64_t T = seq_len_;

  shard_begin_.push_back(0);
  bool any_target = false;  // a token the loss counts
  std::string first_vocab_file;  // the first shard that records its tokenizer's vocabulary size
  uint32_t first_vocab = 0;
  for (const std::string& file : files_) {
    Shard shard(file);
    // The same id means different text under two tokenizers: mixing them trains on noise.
    if (shard.vocab_size() != 0 && first_vocab == 0) {
      first_vocab = shard.vocab_size();
      first_vocab_file = file;
    } else if (shard.vocab_size() != 0 && shard.vocab_size() != first_vocab) {
      fail("data: shard ", file, " was written by a tokenizer of vocabulary ", shard.vocab_size(), ", shard ",
           first_vocab_file, " by one of vocabulary ", first_vocab, ": train_data must come from one tokenizer");
    }
    // One pass for both bounds: the model's vocabulary, and the one the shard records (an id past
    // that is a damaged shard, even where the model's embedding would take it).
    const bool shard_bound = shard.vocab_size() != 0 && shard.vocab_size() < config.vocab_size;
    const int64_t bound = shard_bound ? int64_t(shard.vocab_size()) : config.vocab_size;
    const int64_t bad = shard.find_token_at_least(static_cast<uint64_t>(bound));
    if (bad >= 0 && shard.token(bad) < uint64_t(config.vocab_size))
      fail("data: shard ", file, ": token id ", shard.token(bad), " at token index ", bad,
           " is not below the vocabulary of ", shard.vocab_size(), " its header records: the shard is damaged, "
           "or was not written by ingot prepare; prepare it again");
    if (bad >= 0) {
      std::ostringstream note;
      if (shard.vocab_size())
        note << "; the shard was written for a vocabulary of " << shard.vocab_size();
      fail("data: shard ", file, ": token id ", shard.token(bad), " at token index ", bad,
           " is not below the model's vocab size ", config.vocab_size, note.str());
    }
    const auto mask = shard.loss_mask();
    bool mask_has_target = false;
    for (size_t i = 0; i < mask.size(); ++i) {
      INGOT_CHECK(mask[i] <= 1, "data: shard ", file, ": loss mask value ", int(mask[i]),
                  " at token index ", i, " is not 0 or 1");
      mask_has_target = mask_has_target || mask[i] == 1;
    }
    if (shard.num_tokens() == 0) continue;
    any_loss_mask_ = any_loss_mask_ || (use_loss_mask_ && shard.has_loss_mask());
    any_target = any_target || !use_loss_mask_ || !shard.has_loss_mask() || mask_has_target;
    num_tokens_ += shard.num_tokens();
    shard_begin_.push_back(num_tokens_);
    shards_.push_back(std::move(shard));
  }

  if (num_tokens_ > 0 && !any_target)
    fail("data: no token of ", describe_files(files_), " is a training target (every loss-mask byte is 0); "
         "check how the data was prepared, or set train_on_inputs: true to train on every token");
  fingerprint_ = token_fingerprint();
  window_tokens_.resize(T + 1);
  window_mask_.resize(T + 1);
  if (by_document()) {
    plan_documents(config.val_fraction);
    return;
  }

  // Split: see the header. One token separates the last train window from the first val window.
  const int64_t N = num_tokens_;
  const int64_t all_windows = N >= 1 ? (N - 1) / T : 0;
  if (config.val_fraction > 0) {
    num_val_ = std::max<int64_t>(1, static_cast<int64_t>(all_windows * config.val_fraction));
    const int64_t room = N - 2 - num_val_ * T;  // tokens left for train windows' starts
    num_train_ = room >= 0 ? room / T : 0;
    if (num_train_ < 1)
      fail("data: dataset too short: ", N, " tokens in ", describe_files(files_), "; seq_len ", T,
           " with val_fraction ", config.val_fraction, " needs at least ", (num_val_ + 1) * T + 2,
           " tokens (one training window of ", T + 1, " tokens, ", counted(num_val_, "validation window"), " of ", T + 1,
           ", one separating token)");
    val_begin_ = num_train_ * T + 1;
  } else {
    num_train_ = all_windows;
    if (num_train_ < 1)
      fail("data: dataset too short: ", N, " tokens in ", describe_files(files_), "; seq_len ", T,
           " needs at least ", T + 1, " tokens for one training window");
    val_begin_ = N;
  }
  // Targets of the training windows: tokens 1 .. num_train_ * T of the stream. Masked data whose
  // targets all lie in the validation tail trained nothing, every step, and exited 0.
  if (any_loss_mask_) {
    const int64_t first = 1, last = num_train_ * T;  // inclusive
    bool trained = false;
    for (size_t s = 0; s < shards_.size() && !trained; ++s) {
      const int64_t begin = std::max(first, shard_begin_[s]), end = std::min(last + 1, shard_begin_[s + 1]);
      const auto mask = shards_[s].loss_mask();
      if (mask.empty()) trained = begin < end;  // an unmasked shard: every token is a target
      for (int64_t i = begin; i < end && !trained && !mask.empty(); ++i) trained = mask[size_t(i - shard_begin_[s])] == 1;
    }
    if (!trained) {
      std::ostringstream tail;
      if (config.val_fraction > 0) tail << " before the validation tail (val_fraction " << config.val_fraction << ")";
      fail("data: no target of ", describe_files(files_), " falls in the training windows (tokens 1 to ", last,
           " of the stream)", tail.str(), ": the loss would count no token of any step; check the data's loss masks, "
           "use packing: packed, or set train_on_inputs: true");
    }
  }
}

void DataLoader::plan_documents(double val_fraction) {
  // Whether each document has a target: a token after its first (no token predicts a document's
  // first) that the loss counts. Rows never cross documents, so data without one trains nothing.
  std::vector<char> has_target;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const auto starts = shards_[s].document_starts();
    const auto mask = shards_[s].loss_mask();
    const bool masked = use_loss_mask_ && shards_[s].has_loss_mask();
    for (size_t d = 0; d < starts.size(); ++d) {
      const int64_t end = d + 1 < starts.size() ? static_cast<int64_t>(starts[d + 1])
                                                : shards_[s].num_tokens();
      documents_.push_back({shard_begin_[s] + static_cast<int64_t>(starts[d]),
                            end - static_cast<int64_t>(starts[d])});
      bool target = end - static_cast<int64_t>(starts[d]) >= 2 && !masked;
      for (int64_t i = static_cast<int64_t>(starts[d]) + 1; masked && !target && i < end; ++i) target = mask[size_t(i)] == 1;
      has_target.push_back(target);
    }
  }
  const int64_t D = static_cast<int64_t>(documents_.size());
  const int64_t num_val_docs =
      val_fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(D * val_fraction)) : 0;
  num_train_docs_ = D - num_val_docs;
  if (num_train_docs_ < 1)
    fail("data: dataset too short for ", packing_mode_name(mode_), " batches: ", D,
         " documents in ", describe_files(files_), "; val_fraction ", val_fraction,
         " leaves none for training (needs at least ", num_val_docs + 1, " documents)");
  if (std::none_of(has_target.begin(), has_target.begin() + num_train_docs_, [](char t) { return t != 0; }))
    fail("data: no training document of ", describe_files(files_), " has a target for ", packing_mode_name(mode_),
         " rows: each is one token long, or its loss mask marks only its first token, which no token predicts "
         "(rows hold whole documents, so nothing would train); check how the data was prepared");
  const bool packed = mode_ == PackingMode::packed;
  val_plan_ = plan_rows(std::span(documents_).subspan(num_train_docs_), seq_len_, packed);
  num_val_ = val_plan_.num_rows();
  num_train_ = train_plan(0).num_rows();
}

const PackingPlan& DataLoader::train_plan(int64_t epoch) {
  INGOT_CHECK(by_document(), "data: train_plan needs the packed or padded mode");
  if (plan_epoch_ != epoch) {
    ensure_permutation(epoch);  // over documents in these modes
    std::vector<DocumentSpan> order(num_train_docs_);
    for (int64_t i = 0; i < num_train_docs_; ++i) order[i] = documents_[permutation_[i]];
    train_plan_ = plan_rows(order, seq_len_, mode_ == PackingMode::packed);
    plan_epoch_ = epoch;
  }
  return train_plan_;
}

void DataLoader::fill_plan_row(std::span<const PackedPiece> pieces, int64_t row,
                               const BatchBuffers& out) const {
  const int64_t T = seq_len_;
  auto read = [this](int64_t begin, int64_t count, int32_t* tokens, uint8_t* mask) {
    gather(begin, count, tokens, mask);
  };
  data::fill_row(pieces, T, read, out.input_ids + row * T, out.targets + row * T,
                 out.positions ? out.positions + row * T : nullptr,
                 out.segment_ids ? out.segment_ids + row * T : nullptr);
}

void DataLoader::fill_val_row(int64_t j, int64_t row, const BatchBuffers& out) const {
  if (by_document())
    fill_plan_row(val_plan_.row(j), row, out);
  else
    fill_row(val_window_start(j), row, out);
}

void DataLoader::gather(int64_t start, int64_t count, int32_t* tokens, uint8_t* mask) const {
  // Shard holding `start`: the last one whose begin is <= start.
  size_t s =
      std::upper_bound(shard_begin_.begin(), shard_begin_.end(), start) - shard_begin_.begin() - 1;
  while (count > 0) {
    const Shard& shard = shards_[s];
    const int64_t local = start - shard_begin_[s];
    const int64_t n = std::min(count, shard.num_tokens() - local);
    shard.read_tokens(local, n, tokens);
    if (mask) {
      if (use_loss_mask_ && shard.has_loss_mask())
        std::copy_n(shard.loss_mask().data() + local, n, mask);
      else
        std::fill_n(mask, n, uint8_t{1});
      mask += n;
    }
    tokens += n;
    start += n;
    count -= n;
    ++s;
  }
}

void DataLoader::fill_row(int64_t start, int64_t row, const BatchBuffers& out) const {
  const int64_t T = seq_len_;
  uint8_t* mask = any_loss_mask_ ? window_mask_.data() : nullptr;
  gather(start, T + 1, window_tokens_.data(), mask);
  int32_t* inputs = out.input_ids + row * T;
  int32_t* targets = out.targets + row * T;
  std::copy_n(window_tokens_.data(), T, inputs);
  for (int64_t t = 0; t < T; ++t)
    targets[t] = (!mask || mask[t + 1]) ? window_tokens_[t + 1] : kIgnoreIndex;
  if (out.positions)
    for (int64_t t = 0; t < T; ++t) out.positions[row * T + t] = static_cast<int32_t>(t);
  if (out.segment_ids) std::fill_n(out.segment_ids + row * T, T, 0);
}

void DataLoader::ensure_permutation(int64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  const int64_t n = by_document() ? num_train_docs_ : num_train_;
  permutation_.resize(n);
  for (int64_t i = 0; i < n; ++i) permutation_[i] = static_cast<uint64_t>(i);
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch) * epoch_seed_stride_);
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t j = uniform_below(rng, static_cast<uint64_t>(i) + 1);
    std::swap(permutation_[i], permutation_[j]);
  }
  permutation_epoch_ = epoch;
}

int64_t DataLoader::train_window_at(int64_t epoch, int64_t index) {
  INGOT_CHECK(!by_document(), "data: train_window_at is for the stream mode");
  INGOT_CHECK(index >= 0 && index < num_train_, "data: window index ", index, " outside [0, ",
              num_train_, ")");
  ensure_permutation(epoch);
  return static_cast<int64_t>(permutation_[index]);
}

void DataLoader::next_batch(int64_t batch_size, const BatchBuffers& out) {
  INGOT_CHECK(batch_size > 0, "data: batch size must be positive, got ", batch_size);
  INGOT_CHECK(out.input_ids && out.targets, "data: next_batch needs input_ids and targets buffers");
  if (by_document()) {
    for (int64_t row = 0; row < batch_size; ++row) {
      if (cursor_.index >= train_plan(cursor_.epoch).num_rows()) {
        ++cursor_.epoch;
        cursor_.index = 0;
      }
      fill_plan_row(train_plan(cursor_.epoch).row(cursor_.index++), row, out);
    }
    return;
  }
  for (int64_t row = 0; row < batch_size; ++row) {
    if (cursor_.index == num_train_) {
      ++cursor_.epoch;
      cursor_.index = 0;
    }
    ensure_permutation(cursor_.epoch);
    const int64_t window = static_cast<int64_t>(permutation_[cursor_.index++]);
    fill_row(train_window_start(window), row, out);
  }
}

// The token count and the tokens at up to 4096 evenly spaced places, hashed: data prepared again
// from other text to the same counts (which the cursor's other checks pass) gets another value.
uint64_t DataLoader::token_fingerprint() const {
  constexpr int64_t kSamples = 4096;
  uint64_t hash = splitmix64(static_cast<uint64_t>(num_tokens_));
  const int64_t samples = std::min(num_tokens_, kSamples);
  for (int64_t i = 0; i < samples; ++i) {
    int32_t token = 0;
    gather(static_cast<int64_t>((static_cast<__int128>(i) * num_tokens_) / samples), 1, &token, nullptr);
    hash = splitmix64(hash ^ static_cast<uint32_t>(token));
  }
  return hash;
}

nlohmann::json DataLoader::save_state() const {
  nlohmann::json state = {{"epoch", cursor_.epoch}, {"index", cursor_.index},          {"seed", seed_},
                          {"seq_len", seq_len_},    {"num_train_windows", num_train_}, {"num_tokens", num_tokens_},
                          {"packing", packing_mode_name(mode_)}, {"epoch_seed_stride", epoch_seed_stride_},
                          {"token_fingerprint", fingerprint_},     {"num_val_windows", num_val_}};
  // The split, where the row count alone misses it: short documents moved by val_fraction between
  // training and validation often leave epoch 0 with as many packed rows.
  if (by_document()) state["num_train_documents"] = num_train_docs_;
  return state;
}

std::string DataLoader::malformed_state(const nlohmann::json& state) {
  if (!state.is_object()) return "not an object";
  // Whole numbers only: a fractional index was cut to an integer and training went on elsewhere.
  // seed and epoch_seed_stride are 64-bit unsigned; the counts fit int64.
  auto count = [&](const char* key, bool required) -> std::string {
    if (!state.contains(key)) return required ? std::string("key \"") + key + "\" is missing" : "";
    const nlohmann::json& v = state[key];
    const bool full_range = std::string_view(key) == "seed" || std::string_view(key) == "epoch_seed_stride" ||
                            std::string_view(key) == "token_fingerprint";
    const bool fits = v.is_number_unsigned() ? full_range || v.get<uint64_t>() <= uint64_t(INT64_MAX)
                                             : v.is_number_integer() && v.get<int64_t>() >= 0;
    return fits ? "" : std::string("key \"") + key + "\" must be a non-negative integer, got " + io::json_brief(v);
  };
  for (const char* key : {"epoch", "index", "seed", "seq_len", "num_train_windows", "num_tokens"})
    if (std::string problem = count(key, true); !problem.empty()) return problem;
  for (const char* key : {"epoch_seed_stride", "token_fingerprint", "num_val_windows", "num_train_documents"})
    if (std::string problem = count(key, false); !problem.empty()) return problem;
  if (state.contains("packing") && !state["packing"].is_string())
    return "key \"packing\" must be a string, got " + io::json_brief(state["packing"]);
  return "";
}

std::string DataLoader::state_mismatch(const nlohmann::json& state, StateSetting* setting) const {
  std::ostringstream s;
  StateSetting differs = StateSetting::none;
  try {
    const auto seed = state.at("seed").get<uint64_t>();
    const auto seq_len = state.at("seq_len").get<int64_t>();
    const auto num_train = state.at("num_train_windows").get<int64_t>();
    const auto num_tokens = state.at("num_tokens").get<int64_t>();
    const std::string packing = state.value("packing", std::string("stream"));
    // A count the state records (states before 2026-12-02 lack the split's), against this run's.
    auto recorded_differs = [&](const char* key, int64_t now) {
      return state.contains(key) && state[key].get<int64_t>() != now;
    };
    if (packing != packing_mode_name(mode_)) {
      differs = StateSetting::packing;
      s << "data: saved loader state is for " << packing << " batches but this run uses " << packing_mode_name(mode_)
        << " (the packing key)";
    } else if (seed != seed_) {
      differs = StateSetting::seed;
      s << "data: saved loader state has seed " << seed << " but this run uses seed " << seed_;
    } else if (seq_len != seq_len_) {
      differs = StateSetting::seq_len;
      s << "data: saved loader state has seq_len " << seq_len << " but this run uses seq_len " << seq_len_;
    } else if (num_tokens != num_tokens_) {
      differs = StateSetting::data;
      s << "data: saved loader state is for a dataset of " << num_tokens << " tokens but " << describe_files(files_)
        << " hold " << num_tokens_ << " tokens";
    } else if (state.contains("token_fingerprint") && state["token_fingerprint"].get<uint64_t>() != fingerprint_) {
      differs = StateSetting::data;
      s << "data: " << describe_files(files_) << " hold other tokens than the dataset the checkpoint trained on (the "
        << "same " << num_tokens_ << " tokens in count, but not those sampled at 4096 places): the data was prepared "
        << "again or changed";
    } else if (num_train != num_train_ || recorded_differs("num_val_windows", num_val_) ||
               (by_document() && recorded_differs("num_train_documents", num_train_docs_))) {
      // The same tokens split otherwise: val_fraction moves the split.
      differs = StateSetting::split;
      const char* unit = by_document() ? "rows" : "windows";
      s << "data: saved loader state has " << num_train << " train";
      if (state.contains("num_val_windows")) s << " and " << state["num_val_windows"].get<int64_t>() << " validation";
      s << " " << unit;
      if (state.contains("num_train_documents"))
        s << " (" << state["num_train_documents"].get<int64_t>() << " train documents)";
      s << " but this run has " << num_train_ << " and " << num_val_;
      if (by_document()) s << " (" << num_train_docs_ << " train documents)";
      s << ", from the same " << num_tokens_ << " tokens in " << describe_files(files_)
        << ": the training/validation split differs (was val_fraction changed?)";
    }
  } catch (const nlohmann::json::exception&) {
    return "";
  }
  if (setting) *setting = differs;
  return s.str();
}

void DataLoader::restore_state(const nlohmann::json& state) {
  try {
    // state_mismatch passes over a malformed state: this names what is wrong.
    if (const std::string problem = malformed_state(state); !problem.empty()) fail("data: malformed loader state: ", problem);
    if (const std::string mismatch = state_mismatch(state); !mismatch.empty()) fail(mismatch);
    const auto epoch = state.at("epoch").get<int64_t>();
    const auto index = state.at("index").get<int64_t>();
    // A state without the key was saved when epoch e's seed was seed + e: the run keeps that order.
    const auto stride = state.value("epoch_seed_stride", uint64_t{1});
    INGOT_CHECK(stride == 1 || stride == kEpochSeedStride, "data: saved loader state has epoch_seed_stride ", stride,
                ", which this version does not know (", kEpochSeedStride, " or 1)");
    if (stride != epoch_seed_stride_) {
      epoch_seed_stride_ = stride;
      permutation_epoch_ = -1;  // made with the other stride; epochs can differ in rows
      plan_epoch_ = -1;
    }
    const int64_t rows = by_document() && epoch >= 0 ? train_plan(epoch).num_rows() : num_train_;
    // Far past any run, and room to count on: epoch 2^63 - 1 overflowed at the next pass.
    constexpr int64_t kMaxEpoch = int64_t{1} << 62;
    INGOT_CHECK(epoch >= 0 && epoch < kMaxEpoch && index >= 0 && index <= rows,
                "data: saved loader cursor (epoch ", epoch, ", index ", index, ") is out of range");
    cursor_ = {epoch, index};
  } catch (const nlohmann::json::exception& e) {
    fail("data: malformed loader state ", state.dump(), ": ", e.what());
  }
}

std::string DataLoader::summary() const {
  std::ostringstream s;
  s << "data: " << counted(int64_t(files_.size()), "shard file") << ", " << num_tokens_ << " tokens; ";
  if (by_document()) {
    const PackingPlan& val = val_plan_;
    s << packing_mode_name(mode_) << ": " << num_train_docs_ << " train + " << num_val_documents()
      << " val documents in " << num_train_ << " train (epoch 0) + " << num_val_ << " val rows of "
      << seq_len_ << " tokens";
    if (val.num_rows() > 0) {
      char full[32];
      std::snprintf(full, sizeof full, "%.1f%%",
                    100.0 * static_cast<double>(val.num_tokens()) / static_cast<double>(val.num_rows() * seq_len_));
      s << " (val rows " << full << " full)";
    }
    // A document longer than a row trains as pieces that cannot attend to one another (an answer
    // apart from its question): said, not left to be found.
    int64_t longer = 0, longest = 0;
    for (const DocumentSpan& d : documents_)
      if (d.length > seq_len_) ++longer, longest = std::max(longest, d.length);
    if (longer > 0)
      s << "; " << counted(longer, "document") << " longer than " << seq_len_ << " tokens (the longest " << longest
        << ") split into pieces that do not attend to one another: raise sequence_len, or prepare with --max-seq-len";
    // val_fraction counts documents, the last ones: where those are long, validation takes far more
    // of the tokens than the fraction says (89% in a reviewer's mix of short and long sets).
    const double doc_share = static_cast<double>(num_val_documents()) / static_cast<double>(documents_.size());
    const double token_share = static_cast<double>(val.num_tokens()) / static_cast<double>(num_tokens_);
    if (token_share > 0.05 && token_share > 2 * doc_share) {
      char share[32];
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * token_share);
      s << "; the " << counted(num_val_documents(), "val document") << ", the data's last, hold " << share
        << " of its tokens (val_fraction counts documents)";
    }
  } else {
    s << num_train_ << " train + " << num_val_ << " val windows of " << seq_len_ << "+1 tokens";
  }
  s << (any_loss_mask_ ? "; loss mask" : "");
  return s.str();
}

bool ValIterator::done() const {
  return next_ >= loader_->num_val_;
}
int64_t ValIterator::num_windows() const {
  return loader_->num_val_;
}

int64_t ValIterator::next_batch(int64_t batch_size, const BatchBuffers& out) {
  INGOT_CHECK(batch_size > 0, "data: batch size must be positive, got ", batch_size);
  INGOT_CHECK(out.input_ids && out.targets, "data: next_batch needs input_ids and targets buffers");
  const int64_t T = loader_->seq_len_;
  int64_t real = 0;
  for (int64_t row = 0; row < batch_size; ++row) {
    if (next_ < loader_->num_val_) {
      loader_->fill_val_row(next_++, row, out);
      ++real;
      continue;
    }
    std::fill_n(out.input_ids + row * T, T, 0);
    std::fill_n(out.targets + row * T, T, kIgnoreIndex);
    if (out.positions)
      for (int64_t t = 0; t < T; ++t) out.positions[row * T + t] = static_cast<int32_t>(t);
    if (out.segment_ids) std::fill_n(out.segment_ids + row * T, T, loader_->by_document() ? -1 : 0);
  }
  return real;
}

}  // namespace ingot::data
