#include "ingot/io/hf_model.h"

#include <cctype>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "ingot/core/arena.h"
#include "ingot/core/error.h"
#include "ingot/core/text.h"
#include "ingot/io/json_util.h"
#include "ingot/io/safetensors.h"

namespace ingot::io {

namespace fs = std::filesystem;

// The dtype is resolved once, outside the loop: this runs over every weight a model loads.
int64_t first_invalid_element(const Tensor& t, bool require_non_negative) {
  auto scan = [n = t.numel(), require_non_negative](const auto* x, auto to_float) -> int64_t {
    for (int64_t i = 0; i < n; ++i) {
      const auto value = to_float(x[i]);
      if (!std::isfinite(value) || (require_non_negative && value < 0)) return i;
    }
    return -1;
  };
  const auto same = [](auto v) { return v; };
  switch (t.dtype) {
    case DType::f32: return scan(static_cast<const float*>(t.data), same);
    case DType::f64: return scan(static_cast<const double*>(t.data), same);
    case DType::bf16: return scan(static_cast<const uint16_t*>(t.data), bf16_to_f32);
    case DType::f16: return scan(static_cast<const uint16_t*>(t.data), f16_to_f32);
    default: return -1;
  }
}

namespace {

// Every tensor of the file must have a place in config.json's architecture: otherwise a layer past
// num_hidden_layers, or a separate LM head under tied embeddings, would drop out of training and
// of every export without a word. Two kinds are left out as Hugging Face leaves them out: RoPE's
// inv_freq buffers (computed, not trained), and an lm_head.weight equal to the tied embedding.
void check_every_tensor_is_used(const SafeTensorsReader& reader, const std::string& path,
                                const std::vector<ParamEntry>& entries) {
  std::set<std::string> used;
  for (const ParamEntry& e : entries)
    for (const HfPiece& piece : e.pieces) used.insert(piece.hf_name);
  std::vector<std::string> unused;
  for (const std::string& name : reader.names()) {
    if (used.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && used.count("model.embed_tokens.weight")) {
      const SafeTensorInfo& head = reader.get(name);
      const SafeTensorInfo& embed = reader.get("model.embed_tokens.weight");
      if (head.dtype == embed.dtype && head.shape == embed.shape && std::memcmp(head.data, embed.data, size_t(head.bytes)) == 0)
        continue;
      fail("tensor \"lm_head.weight\" in ", head.file, " differs from model.embed_tokens.weight, but config.json ties them "
           "(tie_word_embeddings: true): set tie_word_embeddings to false to keep the LM head");
    }
    unused.push_back(name);
  }
  if (unused.empty()) return;
  std::string listed;
  for (size_t i = 0; i < unused.size() && i < 3; ++i) listed += std::string(i ? ", " : "") + "\"" + unused[i] + "\"";
  if (unused.size() > 3) listed += " and " + std::to_string(unused.size() - 3) + " more";
  fail(path, " holds ", counted(int64_t(unused.size()), "tensor"), " that config.json's architecture has no place for (", listed,
       "): check num_hidden_layers, tie_word_embeddings and model_type against the weights");
}

}  // namespace

bool check_hf_weights(const std::string& path, const std::vector<ParamEntry>& entries) {
  const SafeTensorsReader reader = SafeTensorsReader::open(path);
  check_every_tensor_is_used(reader, path, entries);
  bool any_f64 = false;
  for (const ParamEntry& e : entries)
    for (const HfPiece& piece : e.pieces) {
      if (!reader.contains(piece.hf_name))
        fail("missing tensor \"", piece.hf_name, "\" in ", path, " (needed by config.json's architecture)");
      std::vector<int64_t> expected{piece.row_end - piece.row_begin};
      if (e.shape.size() > 1) expected.push_back(e.shape[1]);
      const SafeTensorInfo& info = reader.get(piece.hf_name);
      auto dims = [](const std::vector<int64_t>& shape) {
        std::string text = "(";  // "()" for a scalar
        for (const int64_t d : shape) {
          if (text.size() > 1) text += ',';
          text += std::to_string(d);
        }
        return text + ")";
      };
      if (info.shape != expected)
        fail("tensor \"", piece.hf_name, "\" in ", info.file, " has shape ", dims(info.shape), " but config.json of ",
             path, " gives it ", dims(expected));
      any_f64 |= info.dtype == DType::f64;
    }
  return any_f64;
}

void load_hf_weights(Context& ctx, const std::string& path, const std::vector<ParamEntry>& entries,
                     Tensor flat_weights) {
  const SafeTensorsReader reader = SafeTensorsReader::open(path);
  check_every_tensor_is_used(reader, path, entries);
  // Stage one parameter at a time on the host in the target dtype (bf16 weights are converted
  // straight from the file's dtype, never through a lossy intermediate).
  for (const ParamEntry& e : entries) {
    const Tensor device_view = param_view(flat_weights, e);
    std::vector<char> host(static_cast<size_t>(device_view.bytes()));
    Tensor host_view = device_view;
    host_view.data = host.data();
    host_view.device = Device::cpu;
    const int64_t cols = e.shape.size() > 1 ? e.shape[1] : 1;
    for (const HfPiece& piece : e.pieces) {
      Tensor rows = host_view.slice_rows(piece.row_begin, piece.row_end);
      if (e.shape.size() == 1) rows = rows.view({piece.row_end - piece.row_begin});
      else rows = rows.view({piece.row_end - piece.row_begin, cols});
      if (!reader.contains(piece.hf_name))
        fail("missing tensor \"", piece.hf_name, "\" in ", path, " (needed by config.json's architecture)");
      reader.read_into(piece.hf_name, rows);
      // A model that holds inf or nan trains to nan and samples garbage: refuse it by name.
      if (const int64_t bad = first_invalid_element(rows); bad >= 0) {
        const SafeTensorInfo& stored_as = reader.get(piece.hf_name);
        const DType stored = stored_as.dtype;
        // A finite f64 of 1e300 becomes inf in f32: say so, where "non-finite" misread the file.
        fail("tensor \"", piece.hf_name, "\" in ", stored_as.file, " holds a non-finite value (inf or nan)",
             stored != rows.dtype ? " or one beyond the range of " + std::string(dtype_name(rows.dtype)) + ", which the " +
                                        std::string(dtype_name(stored)) + " weights are read into," : std::string(),
             " at element ", bad);
      }
    }
    copy_from_host(ctx, device_view, host.data());
  }
}

void save_hf_model(const std::string& dir, const ModelConfig& config, const std::vector<ParamEntry>& entries,
                   Tensor host_flat_weights, DType dtype_on_disk, int64_t max_shard_bytes) {
  INGOT_CHECK(host_flat_weights.device == Device::cpu, "save_hf_model needs host weights");
  fs::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  for (const ParamEntry& e : entries) {
    const Tensor view = param_view(host_flat_weights, e);
    const int64_t cols = e.shape.size() > 1 ? e.shape[1] : 1;
    for (const HfPiece& piece : e.pieces) {
      Tensor rows = view.slice_rows(piece.row_begin, piece.row_end);
      rows = e.shape.size() == 1 ? rows.view({piece.row_end - piece.row_begin})
                                 : rows.view({piece.row_end - piece.row_begin, cols});
      tensors.push_back({piece.hf_name, rows, dtype_on_disk});
    }
  }
  write_safetensors_sharded(dir, tensors, max_shard_bytes);
  ModelConfig out = config;
  out.torch_dtype = dtype_on_disk == DType::bf16 ? "bfloat16" : dtype_on_disk == DType::f16 ? "float16" : "float32";
  write_file_atomically((fs::path(dir) / "config.json").string(), model_config_to_json(out));
}

int64_t parse_byte_size(const std::string& text) {
  // The number: digits with at most one point, and a digit on some side of it ("." and "1.5.5" are
  // not numbers; stod took "1.5.5" for 1.5 and threw a bare "stod" on ".").
  size_t i = 0, digits = 0, points = 0;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i)
    (text[i] == '.' ? points : digits) += 1;
  INGOT_CHECK(digits > 0 && points <= 1 && digits <= 30, "invalid size \"", text,
              "\" (expected e.g. 5GB, 1.5GB, 500MB or a byte count)");
  const double number = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double multiplier = 1;
  if (unit.empty() || unit == "B") multiplier = 1;
  else if (unit == "KB") multiplier = 1e3;
  else if (unit == "MB") multiplier = 1e6;
  else if (unit == "GB") multiplier = 1e9;
  else if (unit == "KIB") multiplier = 1024.0;
  else if (unit == "MIB") multiplier = 1024.0 * 1024;
  else if (unit == "GIB") multiplier = 1024.0 * 1024 * 1024;
  else fail("invalid size unit in \"", text, "\" (use B, KB, MB, GB, KiB, MiB or GiB)");
  const double bytes = number * multiplier;
  INGOT_CHECK(bytes >= 1 && bytes < 9.0e18, "size \"", text, "\" must be at least 1 byte and below 9 EB");
  return static_cast<int64_t>(bytes);
}

DType parse_disk_dtype(const std::string& text) {
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "f16" || text == "float16" || text == "fp16") return DType::f16;
  if (text == "f32" || text == "float32" || text == "fp32") return DType::f32;
  fail("unsupported dtype \"", text, "\" for export; use bf16, f16 or f32");
}

}  // namespace ingot::io
