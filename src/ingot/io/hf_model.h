// Hugging Face model directories in and out: config.json + safetensors by HF tensor names, mapped
// onto Ingot's flat parameter buffer through ParamEntry::pieces.
#pragma once
#include <string>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/model/config.h"
#include "ingot/model/parameters.h"

namespace ingot::io {

// Reads every parameter of `entries` from the safetensors at `path` (file or directory) into the
// flat weights buffer (any device), converting dtype. A missing tensor, a shape that disagrees
// with config.json, a tensor the architecture has no place for, or a non-finite value is an error
// naming the tensor and the file.
void load_hf_weights(Context& ctx, const std::string& path, const std::vector<ParamEntry>& entries,
                     Tensor flat_weights);
// The checks of load_hf_weights that read only the headers: no tensor left over, every one needed
// there with the shape config.json gives it. Before the model is allocated, so that weights that
// disagree with config.json are named at once (a model of the config's size was allocated first:
// gigabytes and seconds, or an out-of-memory error naming no file).
// Returns whether any of them is stored as F64 (Ingot computes in f32: such a model is rounded).
bool check_hf_weights(const std::string& path, const std::vector<ParamEntry>& entries);

// Writes DIR/config.json and DIR/model*.safetensors (sharded above max_shard_bytes) from a host
// flat buffer (f32 or f64), stored on disk as `dtype_on_disk`. Files are written under temporary
// names and renamed; DIR is created if missing.
void save_hf_model(const std::string& dir, const ModelConfig& config, const std::vector<ParamEntry>& entries,
                   Tensor host_flat_weights, DType dtype_on_disk, int64_t max_shard_bytes);

// Index of the first inf or nan (or, with require_non_negative, negative value) among a host
// tensor's float elements, or -1. Loaded weights and optimizer moments go through it: a damaged
// file must be refused by name, not trained on.
int64_t first_invalid_element(const Tensor& host, bool require_non_negative = false);

// "5GB", "500MB", "2GiB", or a plain byte count.
int64_t parse_byte_size(const std::string& text);
DType parse_disk_dtype(const std::string& text);   // "bf16"|"bfloat16", "f16"|"float16", "f32"|"float32"

}  // namespace ingot::io
