// RMSNorm over rows of (R,C). rstd (R) f32.
// Invariants:
//   - One block per row (grid-stride); each thread keeps its P chunks of VEC elements in registers,
//     so the row is read once in the forward; reductions use a fixed tree (reproducible).
//   - Backward: din ACCUMULATES (residual-stream gradient). dweight accumulates deterministically:
//     a fixed grid of G blocks (G depends only on R and the SM count) each sums its rows' dout*x*rstd
//     into an f32 partial row; a second kernel adds the G partials to dweight in block order.
//   - Vector path (VEC = 8, 16-byte bf16 accesses) when C % 8 == 0 and pointers are aligned;
//     scalar path otherwise. C is limited to 256 threads * P_max * VEC (16384 vector, 4096 scalar).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 256;

template <int VEC, int P, typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const T* weight,
                                       int64_t R, int64_t C, float eps) {
  __shared__ float reduce[32];
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const T* x_row = in + row * C;
    float x[P][VEC];
    float sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        load_vec<VEC>(x_row + c, x[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum_sq += x[k][e] * x[k][e];
      }
    }
    sum_sq = block_sum(sum_sq, reduce);
    const float r = rsqrtf(sum_sq / float(C) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        float w[VEC], y[VEC];
        load_vec<VEC>(weight + c, w);
#pragma unroll
        for (int e = 0; e < VEC; ++e) y[e] = x[k][e] * r * w[e];
        store_vec<VEC>(out + row * C + c, y);
      }
    }
  }
}

// dweight_partial (G, C) f32: this block's sum over its rows of dout * x * rstd.
template <int VEC, int P, typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(T* din, float* dweight_partial, const T* dout,
                                        const T* in, const T* weight, const float* rstd, int64_t R,
                                        int64_t C) {
  __shared__ float reduce[32];
  float w[P][VEC], dw[P][VEC];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
#pragma unroll
    for (int e = 0; e < VEC; ++e) { w[k][e] = 0.f; dw[k][e] = 0.f; }
    if (c < C) load_vec<VEC>(weight + c, w[k]);
  }
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float r = rstd[row];
    float x[P][VEC], g[P][VEC];
    float dot = 0.f;  // sum_c dout * w * x
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        load_vec<VEC>(in + row * C + c, x[k]);
        load_vec<VEC>(dout + row * C + c, g[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          dot += g[k][e] * w[k][e] * x[k][e];
          dw[k][e] += g[k][e] * (x[k][e] * r);
        }
      }
    }
    if (din != nullptr) {
      dot = block_sum(dot, reduce);
      const float coef = dot * (r * r * r) / float(C);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
        if (c < C) {
          float d[VEC];
          load_vec<VEC>(din + row * C + c, d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) d[e] += r * w[k][e] * g[k][e] - coef * x[k][e];
          store_vec<VEC>(din + row * C + c, d);
        }
      }
    }
  }
  if (dweight_partial != nullptr) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) dweight_partial[int64_t(blockIdx.x) * C + c + e] = dw[k][e];
      }
    }
  }
}

}  // namespace

// dweight (C) += sum over g < G of partial (G, ld)[:, :C], in g order. Shared with qk_norm and
// linear.
template <typename TD>
__global__ void column_partials_accumulate_kernel(TD* dweight, const float* partial, int64_t G,
                                                  int64_t C, int64_t ld) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t g = 0; g < G; ++g) acc += partial[g * ld + c];
    dweight[c] = from_f32<TD>(to_f32(dweight[c]) + acc);
  }
}

void column_partials_accumulate(CudaState& state, Tensor dweight, const float* partial, int64_t G,
                                int64_t C, int64_t ld, const char* op) {
  dispatch_float(dweight.dtype, op, [&](auto tag) {
    using TD = decltype(tag);
    column_partials_accumulate_kernel<TD><<<grid_for(C, 256, state), 256, 0, state.stream>>>(
        dweight.ptr<TD>(), partial, G, C, ld);
    INGOT_LAUNCH_CHECK("column_partials_accumulate_kernel");
  });
}

namespace {

// Calls f(std::integral_constant<int, VEC>, std::integral_constant<int, P>) for the row length.
template <typename F>
void dispatch_row(int64_t C, bool vector_ok, const char* op, F&& f) {
  const int VEC_ = vector_ok ? 8 : 1;
  const int64_t per_thread = ceil_div(ceil_div(C, VEC_), kThreads);
  auto with_p = [&](auto vec) {
    if (per_thread <= 1) f(vec, std::integral_constant<int, 1>{});
    else if (per_thread <= 2) f(vec, std::integral_constant<int, 2>{});
    else if (per_thread <= 4) f(vec, std::integral_constant<int, 4>{});
    else if (per_thread <= 8) f(vec, std::integral_constant<int, 8>{});
    else fail(op, ": row length ", C, " too long for the RMSNorm kernels");
  };
  if (vector_ok) with_p(std::integral_constant<int, 8>{});
  else with_p(std::integral_constant<int, 1>{});
}

void check_rows(const char* op, const Tensor& in, const Tensor& weight, int64_t* R, int64_t* C) {
  check_tensor(in, op, "in");
  check_tensor(weight, op, "weight");
  check_float(in, op, "in");
  check_dtype(weight, in.dtype, op, "weight");
  *C = weight.numel();
  INGOT_CHECK(*C > 0 && in.dim(-1) == *C, op, ": in ", in.shape_string(), " does not end in C = ", *C);
  *R = in.numel() / *C;
}

}  // namespace

void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps) {
  constexpr const char* op = "rmsnorm_forward";
  CudaState& state = state_of(ctx, op);
  int64_t R = 0, C = 0;
  check_rows(op, in, weight, &R, &C);
  check_tensor(out, op, "out");
  check_tensor(rstd, op, "rstd");
  check_dtype(out, in.dtype, op, "out");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(out, R * C, op, "out");
  check_numel(rstd, R, op, "rstd");
  if (R == 0) return;
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(in.data) && aligned16(weight.data);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(R, int64_t(state.num_sms) * 16));
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_row(C, vec, op, [&](auto v, auto p) {
      rmsnorm_forward_kernel<decltype(v)::value, decltype(p)::value, T>
          <<<grid, kThreads, 0, state.stream>>>(out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(),
                                                weight.ptr<T>(), R, C, float(eps));
      INGOT_LAUNCH_CHECK("rmsnorm_forward_kernel");
    });
  });
}

void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward";
  CudaState& state = state_of(ctx, op);
  int64_t R = 0, C = 0;
  check_rows(op, in, weight, &R, &C);
  check_tensor(dout, op, "dout");
  check_tensor(rstd, op, "rstd");
  check_dtype(dout, in.dtype, op, "dout");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(dout, R * C, op, "dout");
  check_numel(rstd, R, op, "rstd");
  if (din.present()) {
    check_tensor(din, op, "din");
    check_dtype(din, in.dtype, op, "din");
    check_numel(din, R * C, op, "din");
  }
  if (dweight.present()) {
    check_tensor(dweight, op, "dweight");
    check_float(dweight, op, "dweight");
    check_numel(dweight, C, op, "dweight");
  }
  if (R == 0 || (!din.present() && !dweight.present())) return;
  const bool vec = C % 8 == 0 && aligned16(in.data) && aligned16(dout.data) &&
                   aligned16(weight.data) && (!din.present() || aligned16(din.data));
  // Two blocks per SM: enough rows in flight to hide latency, few partial rows to reduce.
  const int64_t G = std::min<int64_t>(R, int64_t(state.num_sms) * 2);
  float* partial = dweight.present()
                       ? static_cast<float*>(scratch_buffer(state, G * C * int64_t(sizeof(float)), op))
                       : nullptr;
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_row(C, vec, op, [&](auto v, auto p) {
      rmsnorm_backward_kernel<decltype(v)::value, decltype(p)::value, T>
          <<<unsigned(G), kThreads, 0, state.stream>>>(din.present() ? din.ptr<T>() : nullptr,
                                                       partial, dout.ptr<T>(), in.ptr<T>(),
                                                       weight.ptr<T>(), rstd.ptr<float>(), R, C);
      INGOT_LAUNCH_CHECK("rmsnorm_backward_kernel");
    });
  });
  if (dweight.present()) column_partials_accumulate(state, dweight, partial, G, C, C, op);
}

}  // namespace ingot::cuda
