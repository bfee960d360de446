// safetensors reading and writing (https://huggingface.co/docs/safetensors format: u64 little-endian
// header length, JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, data).
// Reading maps files read-only and validates every header before any tensor is used: offsets in
// bounds, contiguous and non-overlapping, sizes matching dtype x shape, known dtypes.
// Writing goes to a temporary name in the same directory and is renamed into place.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ingot/core/tensor.h"

namespace ingot::io {

struct SafeTensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;   // inside the mapped file
  int64_t bytes = 0;
  std::string file;             // which file holds it (for error messages)
  int64_t numel() const;
};

// One .safetensors file, a sharded directory (model.safetensors.index.json), or a directory holding
// model.safetensors. Supported dtypes: BF16, F16, F32, F64, I32, I64, U8.
class SafeTensorsReader {
 public:
  static SafeTensorsReader open(const std::string& path);
  SafeTensorsReader(SafeTensorsReader&&) noexcept;
  SafeTensorsReader& operator=(SafeTensorsReader&&) noexcept;
  ~SafeTensorsReader();

  bool contains(const std::string& name) const;
  const SafeTensorInfo& get(const std::string& name) const;  // error names tensor and path if missing
  std::vector<std::string> names() const;                    // sorted
  const std::map<std::string, std::string>& metadata() const;
  // Copies `name` into the host tensor dst, converting dtype (any float -> f32/f64/bf16, ints ->
  // i32/i64). The element count and shape must equal dst's; the error names tensor, file, both shapes.
  void read_into(const std::string& name, Tensor dst) const;

 private:
  SafeTensorsReader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TensorToWrite {
  std::string name;
  Tensor tensor;          // host tensor
  DType dtype_on_disk;    // converted on write (e.g. f32 in memory -> bf16 on disk)
};

// Writes one file atomically (temporary name, then rename).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Writes DIR/model.safetensors, or, above max_shard_bytes, DIR/model-0000i-of-0000n.safetensors
// plus DIR/model.safetensors.index.json, as transformers expects. Each file atomically.
void write_safetensors_sharded(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               int64_t max_shard_bytes,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace ingot::io
