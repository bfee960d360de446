// CUDA backend entry points. Same signatures and contracts as ops/ops.h; each op lives in
// ops/cuda/<op>.cu (kernel -> launcher -> this entry point). Compiled only when INGOT_WITH_CUDA.
#pragma once
#include "ingot/ops/ops.h"

namespace ingot::cuda {

using ops::AdamWConstants;

void zero(Context& ctx, Tensor x);
void copy(Context& ctx, Tensor dst, Tensor src);
void add_inplace(Context& ctx, Tensor x, Tensor y);
void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table);
void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id);
// An upper bound on the scratch embedding_backward takes for N ids of rows of C, for the memory
// plan: computed on the host without a device (cub's sort storage bounded, not queried).
int64_t embedding_backward_scratch_bytes(int64_t N, int64_t C);
// The longest row the RMSNorm kernels take: 8 elements a thread of a 256-thread block, 8 at a time
// (16-byte loads) where the row is a multiple of 8 elements, else one at a time.
constexpr int64_t rmsnorm_max_row_length(int64_t C) { return C % 8 == 0 ? 16384 : 2048; }
void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps);
void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd);
void qk_norm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor q_weight,
                     Tensor k_weight, int n_q_heads, int n_kv_heads, double eps);
void qk_norm_backward(Context& ctx, Tensor din, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                      Tensor in, Tensor q_weight, Tensor k_weight, Tensor rstd, int n_q_heads,
                      int n_kv_heads);
void linear_forward(Context& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias,
                    Tensor residual = Tensor());
void linear_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                     Tensor in, Tensor weight, bool accumulate_dweight);
void rope_forward(Context& ctx, Tensor x, Tensor positions, Tensor inv_freq, int rotated_heads);
void rope_backward(Context& ctx, Tensor dx, Tensor positions, Tensor inv_freq, int rotated_heads);
void attention_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                       int n_q_heads, int n_kv_heads, double scale);
void attention_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                        Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                        double scale);
void swiglu_forward(Context& ctx, Tensor out, Tensor gate_up);
void swiglu_backward(Context& ctx, Tensor dgate_up, Tensor dout, Tensor gate_up);
void cross_entropy(Context& ctx, Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                   double dloss_scale);
void sum_to(Context& ctx, Tensor out, Tensor x, bool accumulate);
void adamw_step(Context& ctx, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor master,
                Tensor decay_runs, Tensor scalars, const AdamWConstants& constants);

}  // namespace ingot::cuda
