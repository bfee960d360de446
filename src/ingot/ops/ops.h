// Every op Ingot's model code calls, declared once and device-agnostic. Each call dispatches on
// ctx.device to ops/cpu/<op>.cpp or ops/cuda/<op>.cu; model code never branches on the backend.
//
// Conventions (invariants every backend keeps):
//   - Shapes are in the comments. N = tokens (B*T), C = hidden, V = vocab, F = MLP width,
//     Hq/Hkv = query/key-value heads, D = head dim, Htot = Hq + 2*Hkv, R = rows.
//   - Float tensors: f32 or f64 on the CPU (all operands of one call share a dtype); on CUDA,
//     activations and weights are bf16 unless a comment says otherwise.
//   - "Statistics" tensors (rstd, lse, per-token losses) use compute_dtype(x.dtype): f32 for
//     bf16/f16 inputs, otherwise the input dtype.
//   - Parameter gradients (dweight, dbias, dtable) ACCUMULATE (+=) so that gradient accumulation
//     over micro-batches needs no extra pass; the trainer zeroes them once per optimizer step.
//   - Activation gradients OVERWRITE, except where marked "accumulates" (residual-stream grads).
//   - Ids, targets, positions and segment ids are i32. A target of kIgnoreIndex contributes no
//     loss and no gradient.
//   - An optional tensor is absent when its data is nullptr.
#pragma once
#include <cstdint>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::ops {

constexpr int32_t kIgnoreIndex = -100;

constexpr DType compute_dtype(DType t) {
  return (t == DType::bf16 || t == DType::f16) ? DType::f32 : t;
}

// ---- memory -------------------------------------------------------------------------------------
void zero(Context& ctx, Tensor x);                      // x = 0
void copy(Context& ctx, Tensor dst, Tensor src);        // same numel, same device; converts dtype
void add_inplace(Context& ctx, Tensor x, Tensor y);     // x (n) += y (n)

// ---- embedding ----------------------------------------------------------------------------------
// out (N,C) = table (V,C) [ids (N)]
void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table);
// dtable (V,C) += scatter of dout (N,C) by ids (N). Deterministic: rows summed in token order.
// Tokens of padding_id (>= 0) add nothing, as with nn.Embedding's padding_idx (config.json's
// pad_token_id in transformers' Llama and Qwen models); -1: every token adds.
void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id = -1);

// ---- RMSNorm ------------------------------------------------------------------------------------
// out (R,C) = in (R,C) * rstd * weight (C),  rstd (R) = 1/sqrt(mean(in^2) + eps)
void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps);
// din (R,C) accumulates; dweight (C) accumulates. rstd as saved by the forward.
void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd);

// ---- Qwen3 per-head q/k RMSNorm over packed qkv ----------------------------------------------
// in, out (N,Htot,D): heads [0,Hq) normed with q_weight (D), heads [Hq,Hq+Hkv) with k_weight (D),
// v heads copied through. rstd (N, Hq+Hkv).
void qk_norm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor q_weight,
                     Tensor k_weight, int n_q_heads, int n_kv_heads, double eps);
// din (N,Htot,D) overwrite (v heads: din = dout); dq_weight, dk_weight (D) accumulate.
void qk_norm_backward(Context& ctx, Tensor din, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                      Tensor in, Tensor q_weight, Tensor k_weight, Tensor rstd, int n_q_heads,
                      int n_kv_heads);

// ---- linear -------------------------------------------------------------------------------------
// out (N,O) = in (N,I) @ weight (O,I)^T + bias (O, optional) + residual (N,O, optional; may alias
// out). Weight layout is Hugging Face's. The residual add rides in the GEMM (cuBLASLt's C input),
// saving the separate copy and add of a residual connection.
void linear_forward(Context& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias,
                    Tensor residual = Tensor());
// din (N,I) = dout @ weight (overwrite; optional); dweight (O,I) += dout^T @ in, or = when
// accumulate_dweight is false (a step's first write needs no zeroed buffer to add to);
// dbias (O) += column sums of dout (optional; always accumulates).
void linear_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                     Tensor in, Tensor weight, bool accumulate_dweight = true);

// ---- rotary position embedding (Hugging Face "rotate half" layout) -----------------------------
// x (N,Htot,D) in place; heads [0, rotated_heads) rotated, the rest untouched.
// angle(n, i) = positions[n] * inv_freq[i], i < D/2; inv_freq (D/2) in compute dtype.
// (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin)
void rope_forward(Context& ctx, Tensor x, Tensor positions, Tensor inv_freq, int rotated_heads);
// The inverse rotation applied in place to dx (N,Htot,D).
void rope_backward(Context& ctx, Tensor dx, Tensor positions, Tensor inv_freq, int rotated_heads);

// ---- causal grouped-query attention ------------------------------------------------------------
// qkv (B,T,Htot,D): q heads [0,Hq), k heads [Hq,Hq+Hkv), v heads [Hq+Hkv,Htot); query head h
// uses kv head h / (Hq/Hkv). out (B,T,Hq,D); lse (B,Hq,T) log-sum-exp of the scaled scores.
// Token i attends to j iff j <= i and, when segment_ids (B,T) is present, segment_ids equal
// (document masking for packed sequences).
void attention_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                       int n_q_heads, int n_kv_heads, double scale);
// dqkv (B,T,Htot,D) overwrite.
void attention_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                        Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                        double scale);

// ---- SwiGLU -------------------------------------------------------------------------------------
// gate_up (N,2F) = [gate | up]; out (N,F) = silu(gate) * up
void swiglu_forward(Context& ctx, Tensor out, Tensor gate_up);
// dgate_up (N,2F) overwrite.
void swiglu_backward(Context& ctx, Tensor dgate_up, Tensor dout, Tensor gate_up);

// ---- cross-entropy ------------------------------------------------------------------------------
// losses (N) = logsumexp(logits[n]) - logits[n, targets[n]]  (0 where target is ignored).
// When dlogits (N,V) is present: dlogits = (softmax(logits) - onehot(target)) * dloss_scale,
// rows of ignored targets zeroed. dlogits may alias logits.
void cross_entropy(Context& ctx, Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                   double dloss_scale);

// ---- reductions ---------------------------------------------------------------------------------
// out (1) f64 = sum of x (n, any float dtype), or out += that sum when accumulate. The summation
// order is fixed (bitwise reproducible, independent of the thread count) and nothing is read back
// to the host, so it can sit inside a captured CUDA graph (the step's loss sum).
void sum_to(Context& ctx, Tensor out, Tensor x, bool accumulate);

// ---- optimizer ----------------------------------------------------------------------------------
// Slots of the AdamW scalars tensor (kAdamWSlots, f64, on the op's device). The host writes the
// per-step values before each step; the op reads them on the device, so a captured graph replays
// every step with new values.
enum AdamWSlot : int {
  kAdamWStepSize = 0,     // lr / (1 - b1^t)
  kAdamWBiasCorrection2,  // sqrt(1 - b2^t)
  kAdamWDecay,            // 1 - lr*wd, applied to elements inside decay_runs (others: 1)
  kAdamWGradDivisor,      // grads hold the gradient of a loss SUM over this many terms
  kAdamWMaxGradNorm,      // clip threshold on the mean-loss gradient's norm; <= 0: no clipping
  kAdamWUpdate,           // t, the 1-based update number: stochastic rounding's counter (read only then;
                          // the CPU refuses t < 1, CUDA, which cannot check without a sync, reads it as 1)
  kAdamWSumSquares,       // written by the op: sum(grad^2)
  kAdamWGradNorm,         // written by the op: sqrt(sum(grad^2)) / divisor, before clipping
  kAdamWSlots
};
struct AdamWConstants {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // Round the bf16 stores of the update stochastically (core/stochastic_rounding.h) instead of to
  // nearest: params without a master copy, and bf16 m and v. The draws are a function of
  // (rounding_seed, scalars[kAdamWUpdate], element index) only.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
};
// torch.optim.AdamW over whole flat buffers (P elements), with torch's clip_grad_norm_ folded in,
// in a fixed number of launches however many parameters there are (CUDA: three):
//   norm = sqrt(sum(grad^2)) / divisor;  clip = min(1, max_norm / (norm + 1e-6));
//   g = grad * (clip / divisor);  p *= decay (inside decay_runs);
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= step_size * m / (sqrt(v) / bc2 + eps)
// params (P) bf16/f32/f64; grads (P) any float; m, v (P) both f32 or both bf16 (f64 with f64
// params): read as f32, their new values stored rounded after the update has used them. When
// master (P, f32) is present the update runs on master and params receive its rounded copy.
// Rounding to bf16 is to nearest, or with constants.stochastic_rounding stochastic for the stores
// that carry the update (params without master, m, v); the copy of master stays to nearest.
// decay_runs (R,2) i64: sorted, disjoint [begin, end) element ranges that take weight decay
// (checked on the CPU; CUDA reads them on the device and also needs every boundary on a multiple
// of 8 elements, or inside zero padding, since it updates 8 elements at a time).
// The per-element arithmetic is in compute_dtype(params) (f32 for bf16), with the scalars rounded
// once from f64; clip and divisor are combined in f64 first.
void adamw_step(Context& ctx, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor master,
                Tensor decay_runs, Tensor scalars, const AdamWConstants& constants);

}  // namespace ingot::ops
