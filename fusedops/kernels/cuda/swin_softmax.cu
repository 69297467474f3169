// Swin attention softmax: softmax(attn + bias[head, query] + mask[window % nW, query]) per row of
// n scores, one pass, statistics in fp32; and its backward, with the bias gradient reduced over
// windows into fp32 partial sums per chunk of windows (no atomics; the caller adds the chunks in
// a fixed order).
//
// A row is held in registers by a group of kLanes lanes (8, 16 or 32), kPerLane scores each
// (lane l holds columns l, l + kLanes, ...: coalesced), so short rows (n = 49 for 7x7 windows)
// share a warp instead of leaving most of it idle; max and sum are shuffle reductions within the
// group. A row whose max is -inf (every entry -inf) gives zeros; a NaN or +inf in a row makes
// it NaN, as torch.softmax (the max propagates NaN). 64-bit offsets; row indices are divided
// with multiply-high dividers while there are fewer than 2^31 rows.
#include <cstdint>

#include "device.cuh"
#include "swin_softmax.h"

namespace fusedops {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr float kNegInf = -__builtin_huge_valf();

template <int kLanes>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <int kLanes>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename Divider>
struct RowIndex {  // row -> (window, head * n + query, query)
  Divider by_heads_n, by_n, by_mask_windows;
  int64_t heads_n, n, mask_windows;
};

template <typename T, int kLanes, int kPerLane, typename Divider>
__global__ void forward_kernel(const T* __restrict__ attn, const float* __restrict__ bias,
                               const float* __restrict__ mask, T* __restrict__ out, int64_t rows,
                               RowIndex<Divider> index) {
  constexpr int kGroups = kThreads / kLanes;  // rows per block at a time
  const int lane = threadIdx.x % kLanes;
  const int64_t n = index.n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroups;
  // The loop runs while the warp's first row is in range, so every lane of a warp reaches the
  // shuffles; groups past the last row compute on -inf and store nothing.
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / kLanes;
  const int64_t warp_offset = (threadIdx.x % 32) / kLanes;
  for (int64_t row = first; row - warp_offset < rows; row += stride) {
    const bool active = row < rows;
    const int64_t window = index.by_heads_n.div(active ? row : 0);
    const int64_t head_row = (active ? row : 0) - window * index.heads_n;
    const float* bias_row = bias + head_row * n;
    const float* mask_row = nullptr;
    if (mask != nullptr) {
      const int64_t query = head_row - index.by_n.div(head_row) * n;
      const int64_t mask_window = window - index.by_mask_windows.div(window) * index.mask_windows;
      mask_row = mask + (mask_window * n + query) * n;
    }
    const T* in = attn + row * n;
    float z[kPerLane];
    float top = kNegInf;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t col = lane + k * kLanes;
      z[k] = kNegInf;
      if (active && col < n) {
        z[k] = to_float(in[col]) + bias_row[col] + (mask_row != nullptr ? mask_row[col] : 0.0f);
      }
      top = max_nan(top, z[k]);
    }
    top = group_max<kLanes>(top);  // NaN for a row holding NaN: its output is NaN (torch's)
    const bool masked = top == kNegInf;  // a fully -inf row: every exp is 0, the output 0
    if (masked) top = 0.0f;
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      z[k] = expf(z[k] - top);
      total += z[k];
    }
    total = group_sum<kLanes>(total);
    const float scale = masked ? 0.0f : 1.0f / total;
    T* dst = out + row * n;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t col = lane + k * kLanes;
      if (active && col < n) dst[col] = from_float<T>(z[k] * scale);
    }
  }
}

// Block (x, chunk): rows head_row of every window in the chunk; dz = p (g - sum(p g)) to d_attn,
// and the chunk's fp32 sum of dz over its windows to partial[chunk].
template <typename T, int kLanes, int kPerLane>
__global__ void backward_kernel(const T* __restrict__ grad, const T* __restrict__ probs,
                                T* __restrict__ d_attn, float* __restrict__ partial,
                                int64_t windows, int64_t per_chunk, int64_t heads_n, int64_t n) {
  constexpr int kGroups = kThreads / kLanes;
  const int lane = threadIdx.x % kLanes;
  const int64_t head_row = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / kLanes;
  const int64_t block = heads_n * n;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * per_chunk;
  const int64_t last = first + per_chunk < windows ? first + per_chunk : windows;
  // Groups past the last row keep running the (empty) loop so every lane reaches the shuffles.
  const bool active = head_row < heads_n;
  float acc[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) acc[k] = 0.0f;
  for (int64_t window = first; window < last; ++window) {
    const int64_t base = window * block + head_row * n;
    float p[kPerLane], g[kPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t col = lane + k * kLanes;
      const bool inside = active && col < n;
      p[k] = inside ? to_float(probs[base + col]) : 0.0f;
      g[k] = inside ? to_float(grad[base + col]) : 0.0f;
      dot += p[k] * g[k];
    }
    dot = group_sum<kLanes>(dot);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t col = lane + k * kLanes;
      const float dz = p[k] * (g[k] - dot);
      acc[k] += dz;
      if (active && col < n) d_attn[base + col] = from_float<T>(dz);
    }
  }
  if (!active) return;
  float* out = partial + static_cast<int64_t>(blockIdx.y) * block + head_row * n;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = lane + k * kLanes;
    if (col < n) out[col] = acc[k];
  }
}

template <typename Divider>
RowIndex<Divider> make_index(int64_t heads_n, int64_t n, int64_t mask_windows) {
  return {Divider(heads_n), Divider(n), Divider(mask_windows), heads_n, n, mask_windows};
}

// Calls BODY with kLanes and kPerLane fitting n (1 <= n <= 1024).
#define SWIN_SOFTMAX_DISPATCH_N(N, ...)                                                      \
  if ((N) <= 32) {                                                                             \
    constexpr int kLanes = 8, kPerLane = 4;                                                    \
    __VA_ARGS__;                                                                               \
  } else if ((N) <= 64) {                                                                      \
    constexpr int kLanes = 16, kPerLane = 4;                                                   \
    __VA_ARGS__;                                                                               \
  } else if ((N) <= 128) {                                                                     \
    constexpr int kLanes = 32, kPerLane = 4;                                                   \
    __VA_ARGS__;                                                                               \
  } else if ((N) <= 256) {                                                                     \
    constexpr int kLanes = 32, kPerLane = 8;                                                   \
    __VA_ARGS__;                                                                               \
  } else if ((N) <= 512) {                                                                     \
    constexpr int kLanes = 32, kPerLane = 16;                                                  \
    __VA_ARGS__;                                                                               \
  } else {                                                                                     \
    constexpr int kLanes = 32, kPerLane = 32;                                                  \
    __VA_ARGS__;                                                                               \
  }

template <typename T, int kLanes, int kPerLane>
void launch_forward(const void* attn, const float* bias, const float* mask, void* out,
                    int64_t rows, int64_t heads_n, int64_t n, int64_t mask_windows,
                    cudaStream_t stream) {
  constexpr int kGroups = kThreads / kLanes;
  const unsigned int blocks = grid_blocks(rows, kGroups);
  const T* in = static_cast<const T*>(attn);
  T* dst = static_cast<T*>(out);
  if (rows < (int64_t{1} << 31)) {
    forward_kernel<T, kLanes, kPerLane><<<blocks, kThreads, 0, stream>>>(
        in, bias, mask, dst, rows, make_index<FastDivider>(heads_n, n, mask_windows));
  } else {
    forward_kernel<T, kLanes, kPerLane><<<blocks, kThreads, 0, stream>>>(
        in, bias, mask, dst, rows, make_index<WideDivider>(heads_n, n, mask_windows));
  }
}

template <typename T, int kLanes, int kPerLane>
void launch_backward(const void* grad, const void* probs, void* d_attn, float* partial,
                     int64_t windows, int64_t heads_n, int64_t n, int64_t chunks,
                     cudaStream_t stream) {
  constexpr int kGroups = kThreads / kLanes;
  const dim3 grid(static_cast<unsigned int>((heads_n + kGroups - 1) / kGroups),
                  static_cast<unsigned int>(chunks));
  backward_kernel<T, kLanes, kPerLane><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(grad), static_cast<const T*>(probs), static_cast<T*>(d_attn), partial,
      windows, (windows + chunks - 1) / chunks, heads_n, n);
}

}  // namespace

cudaError_t swin_softmax_forward(const void* attn, const float* bias, const float* mask,
                                 void* out, int64_t windows, int64_t mask_windows, int64_t heads,
                                 int64_t n, DType dtype, cudaStream_t stream) {
  if (n < 1 || n > 1024 || (mask != nullptr && mask_windows < 1)) return cudaErrorInvalidValue;
  const int64_t rows = windows * heads * n;
  if (rows == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, SWIN_SOFTMAX_DISPATCH_N(
      n, launch_forward<scalar_t, kLanes, kPerLane>(attn, bias, mask, out, rows, heads * n, n,
                                                    mask != nullptr ? mask_windows : 1, stream)));
  return cudaGetLastError();
}

cudaError_t swin_softmax_backward(const void* grad, const void* probs, void* d_attn,
                                  float* partial, int64_t windows, int64_t heads, int64_t n,
                                  int64_t chunks, DType dtype, cudaStream_t stream) {
  if (n < 1 || n > 1024 || chunks < 1 || chunks > 65535 || chunks > windows) {
    return cudaErrorInvalidValue;
  }
  if (heads == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, SWIN_SOFTMAX_DISPATCH_N(
      n, launch_backward<scalar_t, kLanes, kPerLane>(grad, probs, d_attn, partial, windows,
                                                     heads * n, n, chunks, stream)));
  return cudaGetLastError();
}

}  // namespace fusedops
