// Window attention's softmax kernels for the CUDA path (cuBLAS products around them, in
// kernels/cuda/window_attention.py): S = q k^T comes in as fp32 (Z, H, N, N) rows, N <= 256.
//
// Forward: per row, x = S * scale + bias[h][i] + mask[z % nW][i]; P = softmax(x) in the input
// dtype, lse = logsumexp(x) in fp32 (+inf for a row whose x are all -inf: its P is 0; NaN for a
// row holding NaN or +inf, whose P is NaN as torch.softmax's).
// Backward: per row, P = exp(x - lse), dS = P * (dP - sum(P dP)); writes P and dS * scale (input
// dtype, for the dV / dQ / dK products) and, when asked, d_bias partials: warp (g, h, i) handles
// the windows z = g, g + G, ... of row i, head h, and writes its fp32 sum of dS for them to
// dbias_partial[g][h][i]; the G partials are summed in a fixed order afterwards. No atomics.
//
// One warp per row; lane l holds columns l, l + 32, ... (kCols of them, N <= 32 * kCols). Warps
// stride over the rows (grid_blocks caps the 1-D grid), so any Z * H * N fits CUDA's limits.
#include <cmath>
#include <cstdint>

#include "device.cuh"
#include "window_attention.h"

namespace fusedops {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = max_nan(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Row `row` of (Z, H, N, N) scores with bias and mask added: x[c] for column lane + 32 c
// (-inf past N).
template <int kCols>
__device__ __forceinline__ void load_logits(float (&x)[kCols], const float* __restrict__ scores,
                                            const float* __restrict__ bias,
                                            const float* __restrict__ mask, int64_t row,
                                            int64_t heads, int64_t n, int64_t windows,
                                            float scale, int lane) {
  const int64_t i = row % n;
  const int64_t zh = row / n;
  const float* s = scores + row * n;
  const float* b = bias != nullptr ? bias + ((zh % heads) * n + i) * n : nullptr;
  const float* m = mask != nullptr ? mask + (((zh / heads) % windows) * n + i) * n : nullptr;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t j = lane + 32 * c;
    float v = -INFINITY;
    if (j < n) {
      v = s[j] * scale;
      if (b != nullptr) v += b[j];
      if (m != nullptr) v += m[j];
    }
    x[c] = v;
  }
}

// The forward of one row (this warp's): P and lse.
template <typename T, int kCols>
__device__ __forceinline__ void forward_row(const float* __restrict__ scores,
                                            const float* __restrict__ bias,
                                            const float* __restrict__ mask, T* __restrict__ probs,
                                            float* __restrict__ lse, int64_t row, int64_t heads,
                                            int64_t n, int64_t windows, float scale, int lane) {
  float x[kCols];
  load_logits(x, scores, bias, mask, row, heads, n, windows, scale, lane);
  float row_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCols; ++c) row_max = max_nan(row_max, x[c]);
  row_max = warp_max(row_max);  // NaN for a row holding NaN: P and lse NaN (torch's softmax)
  const bool masked = row_max == -INFINITY;  // fully masked: P = 0, lse = +inf, no NaN
  const float shift = masked ? 0.0f : row_max;
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    x[c] = expf(x[c] - shift);
    total += x[c];
  }
  total = warp_sum(total);
  const float inverse = masked ? 0.0f : 1.0f / total;
  T* p = probs + row * n;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t j = lane + 32 * c;
    if (j < n) p[j] = from_float<T>(x[c] * inverse);
  }
  if (lane == 0) lse[row] = masked ? INFINITY : shift + logf(total);
}

// Warps stride over the rows (a whole warp per row, so every lane reaches the shuffles).
template <typename T, int kCols>
__global__ void softmax_forward_kernel(const float* __restrict__ scores,
                                       const float* __restrict__ bias,
                                       const float* __restrict__ mask, T* __restrict__ probs,
                                       float* __restrict__ lse, int64_t rows, int64_t heads,
                                       int64_t n, int64_t windows, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y; row < rows;
       row += stride) {
    forward_row<T, kCols>(scores, bias, mask, probs, lse, row, heads, n, windows, scale,
                          threadIdx.x);
  }
}

// The backward of row i, head h over the windows g, g + G, ... (this warp's item).
template <typename T, int kCols>
__device__ __forceinline__ void backward_item(
    const float* __restrict__ scores, const float* __restrict__ dprobs,
    const float* __restrict__ bias, const float* __restrict__ mask, const float* __restrict__ lse,
    T* __restrict__ probs, T* __restrict__ dscores, float* __restrict__ dbias_partial,
    int64_t item, int64_t groups, int64_t batch, int64_t heads, int64_t n, int64_t windows,
    float scale, int lane) {
  const int64_t i = item % n;
  const int64_t h = (item / n) % heads;
  const int64_t g = item / (n * heads);
  float dbias[kCols] = {};
  for (int64_t z = g; z < batch; z += groups) {
    const int64_t row = (z * heads + h) * n + i;
    float x[kCols];
    load_logits(x, scores, bias, mask, row, heads, n, windows, scale, lane);
    const float row_lse = lse[row];
    const float* dp = dprobs + row * n;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = lane + 32 * c;
      x[c] = expf(x[c] - row_lse);  // P; 0 past N (x = -inf) and on fully masked rows
      if (j < n) dot += x[c] * dp[j];
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = lane + 32 * c;
      if (j < n) {
        const float ds = x[c] * (dp[j] - dot);
        probs[row * n + j] = from_float<T>(x[c]);
        dscores[row * n + j] = from_float<T>(ds * scale);
        dbias[c] += ds;
      }
    }
  }
  if (dbias_partial == nullptr) return;
  float* out = dbias_partial + ((g * heads + h) * n + i) * n;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t j = lane + 32 * c;
    if (j < n) out[j] = dbias[c];
  }
}

// Warps stride over the G * H * N items (a whole warp per item).
template <typename T, int kCols>
__global__ void softmax_backward_kernel(const float* __restrict__ scores,
                                        const float* __restrict__ dprobs,
                                        const float* __restrict__ bias,
                                        const float* __restrict__ mask,
                                        const float* __restrict__ lse, T* __restrict__ probs,
                                        T* __restrict__ dscores, float* __restrict__ dbias_partial,
                                        int64_t groups, int64_t batch, int64_t heads, int64_t n,
                                        int64_t windows, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
       item < groups * heads * n; item += stride) {
    backward_item<T, kCols>(scores, dprobs, bias, mask, lse, probs, dscores, dbias_partial, item,
                            groups, batch, heads, n, windows, scale, threadIdx.x);
  }
}

// Blocks of kWarpsPerBlock warps for `warps` warp-sized items, capped (the kernels stride).
unsigned int blocks_for(int64_t warps) { return grid_blocks(warps, kWarpsPerBlock); }

// Runs BODY with kCols bound to the smallest of 1, 2, 4, 8 covering n columns (n <= 256).
#define WINDOW_ATTENTION_DISPATCH_COLS(N, ...)     \
  if ((N) <= 32) {                                 \
    constexpr int kCols = 1;                       \
    __VA_ARGS__;                                   \
  } else if ((N) <= 64) {                          \
    constexpr int kCols = 2;                       \
    __VA_ARGS__;                                   \
  } else if ((N) <= 128) {                         \
    constexpr int kCols = 4;                       \
    __VA_ARGS__;                                   \
  } else if ((N) <= 256) {                         \
    constexpr int kCols = 8;                       \
    __VA_ARGS__;                                   \
  } else {                                         \
    return cudaErrorInvalidValue;                  \
  }

template <typename T>
cudaError_t launch_forward(const float* scores, const float* bias, const float* mask, void* probs,
                           float* lse, int64_t rows, int64_t heads, int64_t n, int64_t windows,
                           float scale, cudaStream_t stream) {
  const dim3 block(32, kWarpsPerBlock);
  WINDOW_ATTENTION_DISPATCH_COLS(
      n, softmax_forward_kernel<T, kCols><<<blocks_for(rows), block, 0, stream>>>(
             scores, bias, mask, static_cast<T*>(probs), lse, rows, heads, n, windows, scale));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const float* scores, const float* dprobs, const float* bias,
                            const float* mask, const float* lse, void* probs, void* dscores,
                            float* dbias_partial, int64_t groups, int64_t batch, int64_t heads,
                            int64_t n, int64_t windows, float scale, cudaStream_t stream) {
  const dim3 block(32, kWarpsPerBlock);
  WINDOW_ATTENTION_DISPATCH_COLS(
      n, softmax_backward_kernel<T, kCols><<<blocks_for(groups * heads * n), block, 0, stream>>>(
             scores, dprobs, bias, mask, lse, static_cast<T*>(probs), static_cast<T*>(dscores),
             dbias_partial, groups, batch, heads, n, windows, scale));
  return cudaGetLastError();
}

}  // namespace

cudaError_t window_attention_softmax_forward(const float* scores, const float* bias,
                                             const float* mask, void* probs, float* lse,
                                             int64_t batch, int64_t heads, int64_t n,
                                             int64_t windows, float scale, DType dtype,
                                             cudaStream_t stream) {
  const int64_t rows = batch * heads * n;
  if (rows == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, return launch_forward<scalar_t>(scores, bias, mask, probs, lse,
                                                                 rows, heads, n, windows, scale,
                                                                 stream));
  return cudaSuccess;
}

cudaError_t window_attention_softmax_backward(const float* scores, const float* dprobs,
                                              const float* bias, const float* mask,
                                              const float* lse, void* probs, void* dscores,
                                              float* dbias_partial, int64_t groups,
                                              int64_t batch, int64_t heads, int64_t n,
                                              int64_t windows, float scale, DType dtype,
                                              cudaStream_t stream) {
  if (groups * heads * n == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(
      dtype, return launch_backward<scalar_t>(scores, dprobs, bias, mask, lse, probs, dscores,
                                              dbias_partial, groups, batch, heads, n, windows,
                                              scale, stream));
  return cudaSuccess;
}

}  // namespace fusedops
