#include "ingot/train/memory_plan.h"

#include "ingot/core/arena.h"
#include "ingot/model/parameters.h"
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"

namespace ingot {

std::string TrainingMemory::summary() const {
  return "params " + format_bytes(params) + " | grads " + format_bytes(grads) + " | master " + format_bytes(master) +
         " | optimizer " + format_bytes(optimizer) + " | activations " + format_bytes(activations) + " | scratch " +
         format_bytes(scratch) + " | total " + format_bytes(total());
}

TrainingMemory estimate_training_memory(const ModelConfig& config, const Recipe& recipe, Device device,
                                        int64_t micro_batch, int64_t seq_len, int64_t logits_chunk_tokens,
                                        Recompute recompute) {
  const auto model = Transformer::estimate_memory(config, recipe, micro_batch, seq_len, logits_chunk_tokens, recompute);
  const int64_t P = total_numel(plan_parameters(config));
  TrainingMemory m;
  m.params = model.params;
  m.grads = model.grads;
  m.activations = model.activations;
  m.master = AdamW::estimate_master_bytes(P, recipe);
  m.optimizer = AdamW::estimate_state_bytes(P, recipe);
  m.scratch = device == Device::cuda ? (int64_t{32} << 20) : 0;  // the cuBLASLt workspace
  return m;
}

}  // namespace ingot
