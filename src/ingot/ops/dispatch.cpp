// Routes each op to its backend by ctx.device. The only place that knows both backends exist.
#include "ingot/ops/ops.h"

#include <type_traits>

#include "ingot/ops/cpu/cpu_ops.h"
#include "ingot/ops/profile.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/cuda_ops.h"
#endif

namespace ingot::ops {

// Bytes an op moves at least: every tensor argument read or written once (profiler only).
template <typename... Args>
double tensor_bytes(const Args&... args) {
  double total = 0;
  auto add = [&](const auto& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, Tensor>) total += a.present() ? static_cast<double>(a.bytes()) : 0.0;
  };
  (add(args), ...);
  return total;
}

#ifdef INGOT_HAVE_CUDA
#define INGOT_CALL_BACKEND(op, ...) \
  return ctx.device == Device::cuda ? cuda::op(__VA_ARGS__) : cpu::op(__VA_ARGS__)
#else
#define INGOT_CALL_BACKEND(op, ...)                                                       \
  if (ctx.device == Device::cuda) fail(#op ": this build of Ingot has no CUDA backend"); \
  return cpu::op(__VA_ARGS__)
#endif
#define INGOT_DISPATCH(op, ...)                                                        \
  ProfileScope profile_scope(ctx, #op, 0.0,                                              \
                             profiling_enabled() ? tensor_bytes(__VA_ARGS__) : 0.0);     \
  INGOT_CALL_BACKEND(op, __VA_ARGS__)
#define INGOT_DISPATCH_FLOPS(op, flops, ...)                                           \
  ProfileScope profile_scope(ctx, #op, profiling_enabled() ? (flops) : 0.0, 0.0);        \
  INGOT_CALL_BACKEND(op, __VA_ARGS__)

void zero(Context& ctx, Tensor x) {
  INGOT_DISPATCH(zero, ctx, x);
}

void copy(Context& ctx, Tensor dst, Tensor src) {
  INGOT_DISPATCH(copy, ctx, dst, src);
}

void add_inplace(Context& ctx, Tensor x, Tensor y) {
  INGOT_DISPATCH(add_inplace, ctx, x, y);
}

void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table) {
  INGOT_DISPATCH(embedding_forward, ctx, out, ids, table);
}

void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id) {
  INGOT_DISPATCH(embedding_backward, ctx, dtable, dout, ids, padding_id);
}

void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps) {
  INGOT_DISPATCH(rmsnorm_forward, ctx, out, rstd, in, weight, eps);
}

void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd) {
  INGOT_DISPATCH(rmsnorm_backward, ctx, din, dweight, dout, in, weight, rstd);
}

void qk_norm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor q_weight,
                     Tensor k_weight, int n_q_heads, int n_kv_heads, double eps) {
  INGOT_DISPATCH(qk_norm_forward, ctx, out, rstd, in, q_weight, k_weight, n_q_heads, n_kv_heads, eps);
}

void qk_norm_backward(Context& ctx, Tensor din, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                      Tensor in, Tensor q_weight, Tensor k_weight, Tensor rstd, int n_q_heads,
                      int n_kv_heads) {
  INGOT_DISPATCH(qk_norm_backward, ctx, din, dq_weight, dk_weight, dout, in, q_weight, k_weight, rstd, n_q_heads, n_kv_heads);
}

void linear_forward(Context& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor residual) {
  INGOT_DISPATCH_FLOPS(linear_forward, 2.0 * in.numel() * weight.dim(0), ctx, out, in, weight, bias, residual);
}

void linear_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                     Tensor in, Tensor weight, bool accumulate_dweight) {
  INGOT_DISPATCH_FLOPS(linear_backward, (din.present() ? 4.0 : 2.0) * in.numel() * weight.dim(0), ctx, din, dweight,
                       dbias, dout, in, weight, accumulate_dweight);
}

void rope_forward(Context& ctx, Tensor x, Tensor positions, Tensor inv_freq, int rotated_heads) {
  INGOT_DISPATCH(rope_forward, ctx, x, positions, inv_freq, rotated_heads);
}

void rope_backward(Context& ctx, Tensor dx, Tensor positions, Tensor inv_freq, int rotated_heads) {
  INGOT_DISPATCH(rope_backward, ctx, dx, positions, inv_freq, rotated_heads);
}

void attention_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                       int n_q_heads, int n_kv_heads, double scale) {
  // causal: half of 4*B*Hq*T*T*D
  INGOT_DISPATCH_FLOPS(attention_forward, 2.0 * out.numel() * qkv.dim(1), ctx, out, lse, qkv, segment_ids, n_q_heads,
                       n_kv_heads, scale);
}

void attention_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                        Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                        double scale) {
  // causal: half of 10*B*Hq*T*T*D (the forward's S recomputed, then dP, dS, dQ, dK, dV)
  INGOT_DISPATCH_FLOPS(attention_backward, 5.0 * out.numel() * qkv.dim(1), ctx, dqkv, dout, out, lse, qkv, segment_ids,
                       n_q_heads, n_kv_heads, scale);
}

void swiglu_forward(Context& ctx, Tensor out, Tensor gate_up) {
  INGOT_DISPATCH(swiglu_forward, ctx, out, gate_up);
}

void swiglu_backward(Context& ctx, Tensor dgate_up, Tensor dout, Tensor gate_up) {
  INGOT_DISPATCH(swiglu_backward, ctx, dgate_up, dout, gate_up);
}

void cross_entropy(Context& ctx, Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                   double dloss_scale) {
  INGOT_DISPATCH(cross_entropy, ctx, losses, dlogits, logits, targets, dloss_scale);
}

void sum_to(Context& ctx, Tensor out, Tensor x, bool accumulate) {
  INGOT_DISPATCH(sum_to, ctx, out, x, accumulate);
}

void adamw_step(Context& ctx, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor master,
                Tensor decay_runs, Tensor scalars, const AdamWConstants& constants) {
  INGOT_DISPATCH(adamw_step, ctx, params, grads, m, v, master, decay_runs, scalars, constants);
}

}  // namespace ingot::ops
