// Softmax cross-entropy over logits (N,V), one row per token.
// Invariants: targets are validated before the parallel region; a row whose target is
// kIgnoreIndex (-100) has loss 0 and a zero gradient row; dlogits may alias logits: each row
// reads everything it needs (max, sum, target logit) before overwriting it elementwise. losses
// (N) are in the compute dtype. Rows are independent, so any thread split gives the same bits.
#include <algorithm>
#include <cmath>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {

// losses (N) = logsumexp(logits[n]) - logits[n, targets[n]];
// dlogits (N,V) = (softmax(logits) - onehot(target)) * dloss_scale (optional)
void cross_entropy(Context& ctx, Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                   double dloss_scale) {
  constexpr const char* op = "cross_entropy";
  detail::dispatch_float(op, logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "logits", logits, logits.dtype);
    detail::check_tensor(op, "targets", targets, DType::i32);
    detail::check_tensor(op, "losses", losses, ops::compute_dtype(logits.dtype));
    const int64_t V = logits.dim(-1), N = targets.numel();
    INGOT_CHECK(V > 0 && logits.numel() == N * V, op, ": logits ", logits.shape_string(),
                " is not (", N, ",V) for ", N, " targets");
    detail::check_numel(op, "losses", losses, N);
    const bool with_grad = dlogits.present();
    if (with_grad) {
      detail::check_tensor(op, "dlogits", dlogits, logits.dtype);
      detail::check_numel(op, "dlogits", dlogits, N * V);
    }
    const int32_t* tgt = targets.ptr<int32_t>();
    detail::check_ids(op, "targets", tgt, N, V, true);
    const T* x_all = logits.ptr<T>();
    T* loss = losses.ptr<T>();
    T* dx_all = with_grad ? dlogits.ptr<T>() : nullptr;
    const T scale = static_cast<T>(dloss_scale);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = x_all + n * V;
      const int32_t t = tgt[n];
      if (t == ops::kIgnoreIndex) {
        loss[n] = T(0);
        if (with_grad) std::fill_n(dx_all + n * V, V, T(0));
        continue;
      }
      const T max = *std::max_element(x, x + V);
      T sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - max);
      const T lse = max + std::log(sum);
      loss[n] = lse - x[t];
      if (with_grad) {
        T* dx = dx_all + n * V;
        const T inv_sum = T(1) / sum;
        for (int64_t v = 0; v < V; ++v) dx[v] = std::exp(x[v] - max) * inv_sum * scale;
        dx[t] -= scale;
      }
    }
  });
}

}  // namespace ingot::cpu
