// CPU backend: the numerical reference. Same signatures and contracts as ops/ops.h; each op lives
// in ops/cpu/<op>.cpp, templated on float and double and dispatched on the tensors' dtype.
#pragma once
#include "ingot/ops/ops.h"

namespace ingot::cpu {

using ops::AdamWConstants;

void zero(Context& ctx, Tensor x);
void copy(Context& ctx, Tensor dst, Tensor src);
void add_inplace(Context& ctx, Tensor x, Tensor y);
void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table);
void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id);
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

}  // namespace ingot::cpu
