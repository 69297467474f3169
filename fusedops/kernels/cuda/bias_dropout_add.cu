// Bias-dropout-add, the same mask as every other backend (ops/bias_dropout_add.py): element i
// of a call takes word i % 4 of Philox4x32-10 counter (offset + i / 4) under key `key`, where
// seed = [key, offset] (int64, read from device memory: no host synchronisation), and is kept
// iff that word >= threshold; kept values are scaled by `scale`, dropped ones are 0. Math in
// fp32, 64-bit element indices, on the caller's stream.
//
// Forward (also the backward without a bias, as out = dropout(grad)): a thread takes quads of
// four consecutive elements 4q .. 4q + 3 (one Philox call each) in a grid-stride loop, with
// vector loads when every pointer is aligned to a quad; the bias column is carried from quad to
// quad (no division in the loop).
// Backward with a bias: grid (column blocks, row groups); a thread takes four columns of the
// rows g, g + groups, ... of its row group g, writes grad_x and keeps fp32 column sums, stored
// as partial row g; column_total_kernel then adds the partial rows in order (no atomics: the
// same bits every run). When cols % 4 == 0 a thread's four columns are one quad; otherwise each
// element runs its own Philox call (4x the arithmetic, same bits).
#include <cstdint>

#include "device.cuh"
#include "bias_dropout_add.h"

namespace fusedops {
namespace {

constexpr uint32_t kRoundA = 0xD2511F53u;  // multiplies counter word 0
constexpr uint32_t kRoundB = 0xCD9E8D57u;  // multiplies counter word 2
constexpr uint32_t kKeyA = 0x9E3779B9u;
constexpr uint32_t kKeyB = 0xBB67AE85u;
constexpr int kThreads = 256;
constexpr int kQuad = 4;

__device__ __forceinline__ uint4 philox4x32_10(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t high_b = __umulhi(kRoundB, c2), low_b = kRoundB * c2;
    const uint32_t high_a = __umulhi(kRoundA, c0), low_a = kRoundA * c0;
    c0 = high_b ^ c1 ^ k0;
    c1 = low_b;
    c2 = high_a ^ c3 ^ k1;
    c3 = low_a;
    k0 += kKeyA;
    k1 += kKeyB;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ uint32_t word_of(const uint4& w, int64_t which) {
  switch (which & 3) {
    case 0:
      return w.x;
    case 1:
      return w.y;
    case 2:
      return w.z;
    default:
      return w.w;
  }
}

// The dropout of one call, with the seed read once per thread.
struct Mask {
  DropoutMode mode;
  uint64_t key = 0, offset = 0, threshold;
  float scale;

  __device__ Mask(const DropoutParams& d)
      : mode(d.mode), threshold(static_cast<uint64_t>(d.threshold)), scale(d.scale) {
    if (mode == DropoutMode::kRandom) {
      key = static_cast<uint64_t>(d.seed[0]);
      offset = static_cast<uint64_t>(d.seed[1]);
    }
  }

  // Keep flags of the quad 4q .. 4q + 3 (one Philox call).
  __device__ __forceinline__ void quad(int64_t q, bool (&keep)[kQuad]) const {
    if (mode != DropoutMode::kRandom) {
#pragma unroll
      for (int j = 0; j < kQuad; ++j) keep[j] = mode == DropoutMode::kKeep;
      return;
    }
    const uint4 w = philox4x32_10(offset + static_cast<uint64_t>(q), key);
    keep[0] = w.x >= threshold;
    keep[1] = w.y >= threshold;
    keep[2] = w.z >= threshold;
    keep[3] = w.w >= threshold;
  }

  // Keep flag of element i alone (a Philox call of its own).
  __device__ __forceinline__ bool element(int64_t i) const {
    if (mode != DropoutMode::kRandom) return mode == DropoutMode::kKeep;
    return word_of(philox4x32_10(offset + static_cast<uint64_t>(i / kQuad), key), i) >= threshold;
  }

  __device__ __forceinline__ float apply(bool keep, float v) const { return keep ? v * scale : 0.0f; }
};

template <typename T>
struct alignas(sizeof(T) * kQuad) Quad {
  T v[kQuad];
};

template <typename T>
__device__ __forceinline__ void load_quad(const T* p, int64_t i0, int count, bool vector,
                                          float (&out)[kQuad]) {
  if (vector) {
    const Quad<T> q = *reinterpret_cast<const Quad<T>*>(p + i0);
#pragma unroll
    for (int j = 0; j < kQuad; ++j) out[j] = to_float(q.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kQuad; ++j) out[j] = j < count ? to_float(p[i0 + j]) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ void store_quad(T* p, int64_t i0, int count, bool vector,
                                           const float (&in)[kQuad]) {
  if (vector) {
    Quad<T> q;
#pragma unroll
    for (int j = 0; j < kQuad; ++j) q.v[j] = from_float<T>(in[j]);
    *reinterpret_cast<Quad<T>*>(p + i0) = q;
  } else {
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      if (j < count) p[i0 + j] = from_float<T>(in[j]);
    }
  }
}

// out[i] = residual[i] + dropout(src[i] + bias[i % cols]) for i < n; bias, residual may be null.
template <typename TS, typename TO>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const TS* __restrict__ src, const float* __restrict__ bias,
                   const TO* __restrict__ residual, TO* __restrict__ out, int64_t n, int64_t cols,
                   bool vector, DropoutParams params) {
  const Mask mask(params);
  const int64_t quads = (n + kQuad - 1) / kQuad;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // column of element 4q, carried from quad to quad: + 4 * stride (mod cols) per step
  int64_t col = bias != nullptr ? (kQuad * q) % cols : 0;
  const int64_t col_step = bias != nullptr ? (kQuad * stride) % cols : 0;
  for (; q < quads; q += stride) {
    const int64_t i0 = kQuad * q;
    const int count = n - i0 < kQuad ? static_cast<int>(n - i0) : kQuad;
    const bool full = vector && count == kQuad;
    bool keep[kQuad];
    mask.quad(q, keep);
    float v[kQuad], r[kQuad] = {0.0f, 0.0f, 0.0f, 0.0f};
    load_quad(src, i0, count, full, v);
    if (residual != nullptr) load_quad(residual, i0, count, full, r);
    int64_t c = col;
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      if (bias != nullptr) {
        v[j] += bias[c];
        c = c + 1 == cols ? 0 : c + 1;
      }
      r[j] += mask.apply(keep[j], v[j]);
    }
    store_quad(out, i0, count, full, r);
    if (bias != nullptr) {
      col += col_step;
      if (col >= cols) col -= cols;
    }
  }
}

// grad_x = dropout(grad) over (rows, cols); partial[g, j] = sum over the rows of row group g of
// grad_x[., j] in fp32 (before rounding to TX).
template <typename TG, typename TX>
__global__ void __launch_bounds__(kThreads)
    backward_bias_kernel(const TG* __restrict__ grad, TX* __restrict__ grad_x,
                         float* __restrict__ partial, int64_t rows, int64_t cols, bool vector,
                         DropoutParams params) {
  const Mask mask(params);
  const int64_t c0 = kQuad * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (c0 >= cols) return;
  const int count = cols - c0 < kQuad ? static_cast<int>(cols - c0) : kQuad;
  const bool quad_aligned = cols % kQuad == 0;  // then element r * cols + c0 starts a quad
  const bool full = vector && quad_aligned && count == kQuad;
  float acc[kQuad] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i0 = r * cols + c0;
    bool keep[kQuad];
    if (quad_aligned) {
      mask.quad(i0 / kQuad, keep);
    } else {
#pragma unroll
      for (int j = 0; j < kQuad; ++j) keep[j] = j < count && mask.element(i0 + j);
    }
    float g[kQuad];
    load_quad(grad, i0, count, full, g);
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      g[j] = mask.apply(keep[j], g[j]);
      acc[j] += g[j];
    }
    store_quad(grad_x, i0, count, full, g);
  }
  float* row = partial + static_cast<int64_t>(blockIdx.y) * cols + c0;
#pragma unroll
  for (int j = 0; j < kQuad; ++j) {
    if (j < count) row[j] = acc[j];
  }
}

// total[j] = partial[0, j] + partial[1, j] + ... in this order (fp32).
__global__ void __launch_bounds__(kThreads)
    column_total_kernel(const float* __restrict__ partial, float* __restrict__ total,
                        int64_t groups, int64_t cols) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) sum += partial[g * cols + j];
  total[j] = sum;
}

bool quad_aligned(const void* p, int element_size) {
  return reinterpret_cast<std::uintptr_t>(p) % (kQuad * element_size) == 0;
}

// Threads per block of the backward: enough for the row's quads, a multiple of a warp.
int backward_threads(int64_t cols) {
  const int64_t quads = (cols + kQuad - 1) / kQuad;
  return quads >= kThreads ? kThreads : static_cast<int>((quads + 31) / 32 * 32);
}

template <typename TS, typename TO>
void launch_forward(const void* src, const float* bias, const void* residual, void* out,
                    int64_t n, int64_t cols, const DropoutParams& params, cudaStream_t stream) {
  const bool vector = quad_aligned(src, sizeof(TS)) && quad_aligned(out, sizeof(TO)) &&
                      (residual == nullptr || quad_aligned(residual, sizeof(TO)));
  const int64_t quads = (n + kQuad - 1) / kQuad;
  forward_kernel<TS, TO><<<grid_blocks(quads, kThreads), kThreads, 0, stream>>>(
      static_cast<const TS*>(src), bias, static_cast<const TO*>(residual), static_cast<TO*>(out),
      n, cols, vector, params);
}

template <typename TG, typename TX>
void launch_backward(const void* grad, void* grad_x, float* partial, float* grad_bias,
                     int64_t groups, int64_t rows, int64_t cols, const DropoutParams& params,
                     cudaStream_t stream) {
  const bool vector = quad_aligned(grad, sizeof(TG)) && quad_aligned(grad_x, sizeof(TX));
  const int threads = backward_threads(cols);
  const int64_t column_blocks = (cols + kQuad * threads - 1) / (kQuad * threads);
  const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(groups));
  backward_bias_kernel<TG, TX><<<grid, threads, 0, stream>>>(
      static_cast<const TG*>(grad), static_cast<TX*>(grad_x), partial, rows, cols, vector,
      params);
  column_total_kernel<<<grid_blocks(cols, kThreads), kThreads, 0, stream>>>(partial, grad_bias,
                                                                           groups, cols);
}

bool valid(const DropoutParams& params) {
  return params.mode != DropoutMode::kRandom || params.seed != nullptr;
}

}  // namespace

cudaError_t bias_dropout_add_forward(const void* src, DType src_dtype, const float* bias,
                                     int64_t cols, const void* residual, void* out,
                                     DType out_dtype, int64_t n, const DropoutParams& params,
                                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!valid(params) || (bias != nullptr && cols <= 0)) return cudaErrorInvalidValue;
  FUSEDOPS_DISPATCH_FLOAT(src_dtype, using src_t = scalar_t;
                          FUSEDOPS_DISPATCH_FLOAT(out_dtype, launch_forward<src_t, scalar_t>(
                                                                 src, bias, residual, out, n,
                                                                 cols, params, stream)));
  return cudaGetLastError();
}

cudaError_t bias_dropout_add_backward(const void* grad, DType grad_dtype, void* grad_x,
                                      DType x_dtype, float* partial, float* grad_bias,
                                      int64_t groups, int64_t rows, int64_t cols,
                                      const DropoutParams& params, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  if (!valid(params) || cols < 0 || groups < 1 || groups > 65535 || rows < 0) {
    return cudaErrorInvalidValue;
  }
  FUSEDOPS_DISPATCH_FLOAT(grad_dtype, using grad_t = scalar_t;
                          FUSEDOPS_DISPATCH_FLOAT(x_dtype, launch_backward<grad_t, scalar_t>(
                                                               grad, grad_x, partial, grad_bias,
                                                               groups, rows, cols, params,
                                                               stream)));
  return cudaGetLastError();
}

}  // namespace fusedops
