// Helpers for tests that read the Hugging Face fixtures (tests/fixtures/<arch>/).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ingot/io/safetensors.h"
#include "ingot/model/parameters.h"
#include "ingot/ops/ops.h"
#include "ingot/optim/adamw.h"

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

// The fixture's batch as Ingot's inputs: (B, T) ids, targets and positions. HF shifts labels inside
// the loss: position t predicts labels[t+1]; the last position has none. count: the kept targets.
struct FixtureBatch {
  int64_t B = 0, T = 0, count = 0;
  std::vector<int32_t> input_ids, targets, positions;
};

inline FixtureBatch fixture_batch(const io::SafeTensorsReader& expected) {
  const std::vector<double> ids = read_fixture_doubles(expected, "input_ids"), labels = read_fixture_doubles(expected, "labels");
  FixtureBatch f;
  f.B = expected.get("input_ids").shape[0];
  f.T = expected.get("input_ids").shape[1];
  f.input_ids.resize(f.B * f.T);
  f.targets.resize(f.B * f.T);
  f.positions.resize(f.B * f.T);
  for (int64_t b = 0; b < f.B; ++b)
    for (int64_t t = 0; t < f.T; ++t) {
      f.input_ids[b * f.T + t] = static_cast<int32_t>(ids[b * f.T + t]);
      f.targets[b * f.T + t] = t + 1 < f.T ? static_cast<int32_t>(labels[b * f.T + t + 1]) : ops::kIgnoreIndex;
      f.positions[b * f.T + t] = static_cast<int32_t>(t);
      f.count += f.targets[b * f.T + t] != ops::kIgnoreIndex;
    }
  return f;
}

// The fixture's torch.optim.AdamW (tools/make_hf_fixtures.py): decay on every parameter, no
// clipping; the step it took was lr 1e-2, step 1.
inline AdamWConfig fixture_adamw() {
  AdamWConfig adam;
  adam.beta1 = 0.9;
  adam.beta2 = 0.95;
  adam.eps = 1e-8;
  adam.weight_decay = 0.1;
  adam.max_grad_norm = 0;
  adam.decay_norms = adam.decay_biases = adam.decay_embeddings = true;
  return adam;
}

}  // namespace ingot::test
