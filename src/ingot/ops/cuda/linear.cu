// Linear layer through cuBLASLt (matmul.h). Row-major tensors are column-major transposes, so:
//   out (N,O) = in (N,I) @ W (O,I)^T      -> C^T (O,N) = W_cm^T (O,I) * in_cm (I,N):  T,N  m=O n=N k=I
//   din (N,I) = dout (N,O) @ W (O,I)      -> C^T (I,N) = W_cm (I,O) * dout_cm (O,N):  N,N  m=I n=N k=O
//   dW (O,I) += dout^T (O,N) @ in (N,I)   -> C^T (I,O) = in_cm (I,N) * dout_cm^T (N,O): N,T m=I n=O k=N
// Bias is fused with the BIAS epilogue (one bias value per row of C^T = per output feature).
// dweight accumulates via beta = 1 (or is overwritten, beta = 0), into bf16 or f32 (fp32 gradient
// buffers); din overwrites.
// dbias accumulates column sums of dout: per-block partials over row chunks, then the ordered
// reduction shared with the norms (deterministic; cuBLASLt's BGRADB epilogue would overwrite).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/matmul.h"

namespace ingot::cuda {

namespace {

// partial (G, O): block (x: 256 columns, y: row chunk g) sums rows [g*rows_per, ...) of dout.
template <typename T>
__global__ void linear_dbias_partial_kernel(float* partial, const T* dout, int64_t N, int64_t O,
                                            int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= O) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f32(dout[r * O + c]);
  partial[blockIdx.y * O + c] = acc;
}

}  // namespace

void linear_forward(Context& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor residual) {
  constexpr const char* op = "linear_forward";
  CudaState& state = state_of(ctx, op);
  check_tensor(out, op, "out");
  check_tensor(in, op, "in");
  check_tensor(weight, op, "weight");
  check_float(in, op, "in");
  check_dtype(weight, in.dtype, op, "weight");
  check_float(out, op, "out");
  INGOT_CHECK(weight.ndim == 2, op, ": weight must be (O,I), got ", weight.shape_string());
  const int64_t O = weight.dim(0), I = weight.dim(1);
  INGOT_CHECK(in.dim(-1) == I, op, ": in ", in.shape_string(), " does not end in I = ", I);
  const int64_t N = in.numel() / I;
  check_numel(out, N * O, op, "out");
  if (bias.present()) {
    check_tensor(bias, op, "bias");
    check_dtype(bias, out.dtype, op, "bias");
    check_numel(bias, O, op, "bias");
  }
  MatmulArgs g;
  g.trans_a = true; g.trans_b = false;
  g.m = O; g.n = N; g.k = I;
  g.a = weight.data; g.lda = I; g.a_type = weight.dtype;
  g.b = in.data; g.ldb = I; g.b_type = in.dtype;
  g.c = out.data; g.ldc = O; g.c_type = out.dtype;
  g.alpha = 1.f; g.beta = 0.f;
  g.bias = bias.present() ? bias.data : nullptr;
  if (residual.present()) {
    check_tensor(residual, op, "residual");
    check_dtype(residual, out.dtype, op, "residual");
    check_numel(residual, N * O, op, "residual");
    g.c_in = residual.data;
    g.beta = 1.f;
  }
  matmul(state, g, op);
}

void linear_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                     Tensor in, Tensor weight, bool accumulate_dweight) {
  constexpr const char* op = "linear_backward";
  CudaState& state = state_of(ctx, op);
  check_tensor(dout, op, "dout");
  check_tensor(in, op, "in");
  check_tensor(weight, op, "weight");
  check_float(in, op, "in");
  check_dtype(weight, in.dtype, op, "weight");
  check_dtype(dout, in.dtype, op, "dout");
  INGOT_CHECK(weight.ndim == 2, op, ": weight must be (O,I), got ", weight.shape_string());
  const int64_t O = weight.dim(0), I = weight.dim(1);
  INGOT_CHECK(in.dim(-1) == I, op, ": in ", in.shape_string(), " does not end in I = ", I);
  const int64_t N = in.numel() / I;
  check_numel(dout, N * O, op, "dout");

  if (din.present()) {
    check_tensor(din, op, "din");
    check_float(din, op, "din");
    check_numel(din, N * I, op, "din");
    MatmulArgs g;
    g.trans_a = false; g.trans_b = false;
    g.m = I; g.n = N; g.k = O;
    g.a = weight.data; g.lda = I; g.a_type = weight.dtype;
    g.b = dout.data; g.ldb = O; g.b_type = dout.dtype;
    g.c = din.data; g.ldc = I; g.c_type = din.dtype;
    g.alpha = 1.f; g.beta = 0.f;
    if (N > 0 && I > 0 && O == 0) {
      zero(ctx, din);  // k = 0: the product is empty, din is zero
    } else {
      matmul(state, g, op);
    }
  }
  if (dweight.present()) {
    check_tensor(dweight, op, "dweight");
    check_float(dweight, op, "dweight");
    check_numel(dweight, O * I, op, "dweight");
    MatmulArgs g;
    g.trans_a = false; g.trans_b = true;
    g.m = I; g.n = O; g.k = N;
    g.a = in.data; g.lda = I; g.a_type = in.dtype;
    g.b = dout.data; g.ldb = O; g.b_type = dout.dtype;
    g.c = dweight.data; g.ldc = I; g.c_type = dweight.dtype;
    g.alpha = 1.f; g.beta = accumulate_dweight ? 1.f : 0.f;
    if (N == 0 && O > 0 && I > 0) {
      if (!accumulate_dweight) zero(ctx, dweight);  // k = 0: the product is empty
    } else {
      matmul(state, g, op);
    }
  }
  if (dbias.present()) {
    check_tensor(dbias, op, "dbias");
    check_float(dbias, op, "dbias");
    check_numel(dbias, O, op, "dbias");
    if (N == 0 || O == 0) return;
    constexpr int threads = 256;
    const int64_t col_blocks = ceil_div(O, threads);
    // Enough row chunks to give every SM about four blocks; at least 16 rows per chunk.
    int64_t chunks = std::max<int64_t>(1, int64_t(state.num_sms) * 4 / col_blocks);
    chunks = std::min<int64_t>(chunks, ceil_div(N, 16));
    const int64_t rows_per_chunk = ceil_div(N, chunks);
    chunks = ceil_div(N, rows_per_chunk);
    float* partial = static_cast<float*>(scratch_buffer(state, chunks * O * int64_t(sizeof(float)), op));
    dispatch_float(dout.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      linear_dbias_partial_kernel<T><<<dim3(unsigned(col_blocks), unsigned(chunks)), threads, 0, state.stream>>>(
          partial, dout.ptr<T>(), N, O, rows_per_chunk);
      INGOT_LAUNCH_CHECK("linear_dbias_partial_kernel");
    });
    column_partials_accumulate(state, dbias, partial, chunks, O, O, op);
  }
}

}  // namespace ingot::cuda
