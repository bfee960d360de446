// The decoder-only transformer (Llama / Qwen2 / Qwen3), with a hand-written forward and backward.
// Invariants:
//   - Shapes are fixed at construction (micro_batch B, seq_len T); every buffer comes from the
//     arenas planned there. Shorter inputs (generation) run on views of the same buffers.
//   - forward_backward() ACCUMULATES parameter gradients; the caller zeroes them per optimizer step.
//   - The model never branches on the backend: it calls ops:: with tensors whose dtypes come
//     from the Recipe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ingot/core/arena.h"
#include "ingot/core/context.h"
#include "ingot/model/config.h"
#include "ingot/model/parameters.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

// One micro-batch on the host, each array (B*T) row-major. segment_ids may be null (plain causal).
struct HostBatch {
  const int32_t* input_ids = nullptr;
  const int32_t* targets = nullptr;     // ops::kIgnoreIndex where no loss is taken
  const int32_t* positions = nullptr;
  const int32_t* segment_ids = nullptr;
};

// Activation memory policy. none: every block keeps its activations for the backward.
// elementwise: every block keeps what the GEMMs and attention produce (qkv before qk-norm, the
// attention output and lse, gate_up) and the norm statistics; the outputs of the elementwise ops
// that feed a GEMM (both RMSNorms, SwiGLU, and for qk-norm models the normed and rotated qkv)
// live in one shared set of buffers and are recomputed in the backward: a few memory-bound
// passes save about a third of the activation memory. block: only each block's input (the
// residual stream) is kept; the backward re-runs the block's forward (without its two output
// projections) into one shared set of buffers, about a third more compute for a fraction of the
// activation memory. Every policy gives bitwise the same results (same ops on the same inputs).
enum class Recompute { none, elementwise, block };
Recompute parse_recompute(const std::string& name);  // "none" | "elementwise" | "block"

// Inverse RoPE frequencies (D/2) in float64, llama3 scaling applied when configured.
std::vector<double> rope_inverse_frequencies(const ModelConfig& config);

class Transformer {
 public:
  // logits_chunk_tokens: how many tokens' logits exist at once in the LM head + loss (0 = auto).
  Transformer(const ModelConfig& config, const Recipe& recipe, Context& ctx, int64_t micro_batch,
              int64_t seq_len, int64_t logits_chunk_tokens = 0, Recompute recompute = Recompute::none);
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_len() const { return T_; }

  Tensor weights() const { return weights_; }   // flat (P) in recipe.param
  Tensor grads() const { return grads_; }       // flat (P) in recipe.grad
  const ModelParams& params() const { return params_; }

  // Seeded init following the Hugging Face convention: normal(0, initializer_range) for matrices
  // and embeddings, ones for norms, zeros for biases.
  void init_random(uint64_t seed);

  // Copies a micro-batch (B*T each) to the device; tokens = B*T unless shorter (B must be 1 then).
  void load_batch(const HostBatch& batch, int64_t tokens = -1);
  // Forward and backward of the loaded micro-batch: grads += d(sum of losses * dloss_scale).
  // Returns the sum of per-token losses (host read).
  double forward_backward(double dloss_scale);
  // The same, with the loss sum written (accumulate: added) to loss_sum, a (1) f64 tensor on the
  // model's device; nothing is read back, so a CUDA graph can capture it. GradWrite::overwrite
  // (a step's first micro-batch) makes grads = d(...) instead of +=: the projection GEMMs write
  // their weight gradients directly (beta 0), and only the other gradients (norms, biases, an
  // untied embedding) are zeroed first, so the step needs no pass zeroing the whole buffer.
  enum class GradWrite { accumulate, overwrite };
  void forward_backward_into(double dloss_scale, Tensor loss_sum, bool accumulate,
                             GradWrite grads = GradWrite::accumulate);

  // Device-side inputs for whole optimizer steps: staging for `count` micro-batches, filled in
  // one upload, then selected one by one inside the (captured) step. Row layout of
  // staged_inputs(): (count, 4, B*T) i32 = input ids, targets, positions, segment ids.
  void reserve_staging(int64_t count, bool packed);
  Tensor staged_inputs() const { return staged_inputs_; }
  void use_staged(int64_t micro);  // device copy of micro-batch `micro` into the model's inputs
  void bind_full_batch();          // back to (B, T) after a shorter input (not during capture)
  // Changes whenever the activation buffers are re-planned (a shorter generation input): a
  // captured graph holding the old addresses must then be captured again.
  int64_t layout_version() const { return layout_version_; }
  // Forward only; returns the sum of per-token losses.
  double forward_loss();
  // Forward only; writes logits (tokens, V) of the loaded batch to the host, as doubles.
  std::vector<double> forward_logits();
  // Forward only; the logits (V) of loaded token `row` (generation: the last real token of a
  // window padded after it).
  std::vector<double> forward_logits_at(int64_t row);

  // Bytes per arena category, for the start-up budget (params, grads, activations).
  struct MemoryUse { int64_t params, grads, activations; };
  MemoryUse memory_use() const;
  static MemoryUse estimate_memory(const ModelConfig& config, const Recipe& recipe,
                                   int64_t micro_batch, int64_t seq_len, int64_t logits_chunk_tokens = 0,
                                   Recompute recompute = Recompute::none);

 private:
  struct Activations;
  static std::unique_ptr<Activations> plan_activations(const ModelConfig& config, const Recipe& recipe,
                                                       int64_t chunk, Recompute recompute, Arena& arena,
                                                       int64_t B, int64_t T);
  void bind_activations(int64_t B, int64_t T);
  void forward();
  // Block l up to its projections' inputs: ln1, qkv, attention (attn, lse); ln2, gate_up, hidden.
  void attention_inputs(int64_t l);
  void mlp_inputs(int64_t l);
  void backward(GradWrite grads);
  // LM head + cross-entropy over the loaded batch; the sum of per-token losses goes to loss_sum.
  // With backward, the LM head's weight gradient is overwritten by the first chunk under
  // GradWrite::overwrite.
  void head_loss(double dloss_scale, bool with_backward, Tensor loss_sum, bool accumulate,
                 GradWrite grads = GradWrite::accumulate);
  double read_loss_sum();

  ModelConfig config_;
  Recipe recipe_;
  Context& ctx_;
  int64_t B_, T_, chunk_;
  Recompute recompute_;
  int64_t active_tokens_;
  std::vector<ParamEntry> entries_;
  // Ranges [begin, end) of the flat gradient buffer that no GEMM writes (norms, biases, an untied
  // embedding, alignment padding): zeroed before a GradWrite::overwrite backward, adjacent ones merged.
  std::vector<std::pair<int64_t, int64_t>> accumulated_only_;
  std::unique_ptr<Arena> param_arena_, grad_arena_, activation_arena_, staging_arena_;
  Tensor staged_inputs_;
  bool staged_packed_ = false;
  int64_t layout_version_ = 0;
  Tensor weights_, grads_;
  ModelParams params_, param_grads_;
  std::unique_ptr<Activations> acts_;
};

}  // namespace ingot
