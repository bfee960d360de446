// Helpers for tests that read the Hugging Face fixtures (tests/fixtures/<arch>/).
#pragma once
#include <string>
#include <vector>

#include "ingot/io/safetensors.h"
#include "ingot/model/parameters.h"

namespace ingot::test {

// A fixture tensor as doubles: F64 as stored, I64 ids and labels converted.
inline std::vector<double> read_fixture_doubles(const io::SafeTensorsReader& reader, const std::string& name) {
  const io::SafeTensorInfo& info = reader.get(name);
  std::vector<double> out(static_cast<size_t>(info.numel()));
  if (info.dtype == DType::i64) {
    const int64_t* p = static_cast<const int64_t*>(info.data);
    for (int64_t i = 0; i < info.numel(); ++i) out[i] = static_cast<double>(p[i]);
  } else {
    Tensor t(out.data(), DType::f64, Device::cpu, {info.numel()});
    t.ndim = static_cast<int>(info.shape.size());  // read_into wants the stored shape exactly
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = info.shape[i];
    reader.read_into(name, t);
  }
  return out;
}

// The Hugging Face tensor `hf_name` cut out of Ingot's flat parameter buffer (host doubles);
// empty when no parameter maps to it.
inline std::vector<double> hf_slice(const std::vector<ParamEntry>& entries, const std::vector<double>& flat,
                                    const std::string& hf_name) {
  for (const ParamEntry& e : entries)
    for (const HfPiece& piece : e.pieces)
      if (piece.hf_name == hf_name) {
        const int64_t cols = e.shape.size() > 1 ? e.shape[1] : 1;
        return std::vector<double>(flat.begin() + e.offset + piece.row_begin * cols,
                                   flat.begin() + e.offset + piece.row_end * cols);
      }
  return {};
}

}  // namespace ingot::test
