// Bias-dropout-add, the same mask as every other backend (ops/bias_dropout_add.py): element i
// of a call takes word i % 4 of Philox4x32-10 counter (offset + i / 4) under key `key`, where
// seed = [key, offset] (int64, read from device memory: no host synchronisation), and is kept
// iff that word >= threshold; kept values are scaled by `scale`, dropped ones are 0. Math in
// fp32, 64-bit element indices, on the caller's stream.
//
// A thread takes groups of kGroup consecutive elements: one quad (4 elements, one Philox call)
// when both tensor types are fp32, two quads when either is 16-bit, so that a group of the
// narrower type is 16 bytes. Accesses (Access, chosen by the launcher from the pointers): a
// group as 16-byte vectors where every pointer is 16-byte aligned, else a quad per access where
// every pointer is aligned to a quad of its type, else one element per access; partial groups
// (the end of the data or of a row) take one element per access.
// Forward (also the backward without a bias, as out = dropout(grad)): groups p of elements
// kGroup * p .. kGroup * p + kGroup - 1 in a grid-stride loop; the bias column is carried from
// group to group (no division in the loop).
// Backward with a bias: grid (column blocks, row groups); a thread takes kGroup columns of the
// rows g, g + groups, ... of its row group g, writes grad_x and keeps fp32 column sums, stored
// as partial row g; column_total_kernel then adds the partial rows in order (no atomics: the
// same bits every run). When cols % 4 == 0 a thread's columns are whole quads (and its
// accesses as wide as cols % kGroup allows); otherwise each element runs its own Philox call
// (4x the arithmetic, same bits) with one element per access.
#include <cstdint>
#include <initializer_list>
#include <utility>

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

  // Keep flags keep[0 .. 3] of the quad 4q .. 4q + 3 (one Philox call).
  __device__ __forceinline__ void quad(int64_t q, bool* keep) const {
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

  // Keep flags of the kN elements i0 .. i0 + kN - 1 (i0 % 4 == 0 when by_quads): a Philox call
  // per quad when by_quads, else per element (false past count).
  template <int kN>
  __device__ __forceinline__ void group(int64_t i0, int count, bool by_quads,
                                        bool (&keep)[kN]) const {
#pragma unroll
    for (int u = 0; u < kN; u += kQuad) {
      if (by_quads) {
        quad(i0 / kQuad + u / kQuad, keep + u);
      } else {
#pragma unroll
        for (int j = u; j < u + kQuad; ++j) keep[j] = j < count && element(i0 + j);
      }
    }
  }

  __device__ __forceinline__ float apply(bool keep, float v) const { return keep ? v * scale : 0.0f; }
};

// Width of a thread's accesses to a full group (see the top of the file).
enum class Access : int { kElement = 0, kQuad = 1, kWide = 2 };

// Elements a thread takes at a time: 16 bytes of the narrower of two tensor types, whole quads.
template <typename A, typename B>
constexpr int kGroup = sizeof(A) < 4 || sizeof(B) < 4 ? 2 * kQuad : kQuad;

template <typename T, int kN>
struct alignas(sizeof(T) * kN) Packed {
  T v[kN];
};

// The kN elements p[i0 ..] as kN / kW accesses of kW elements (p + i0 aligned to kW elements).
template <int kW, typename T, int kN>
__device__ __forceinline__ void load_vectors(const T* p, int64_t i0, float (&out)[kN]) {
#pragma unroll
  for (int k = 0; k < kN; k += kW) {
    const Packed<T, kW> packed = *reinterpret_cast<const Packed<T, kW>*>(p + i0 + k);
#pragma unroll
    for (int e = 0; e < kW; ++e) out[k + e] = to_float(packed.v[e]);
  }
}

template <int kW, typename T, int kN>
__device__ __forceinline__ void store_vectors(T* p, int64_t i0, const float (&in)[kN]) {
#pragma unroll
  for (int k = 0; k < kN; k += kW) {
    Packed<T, kW> packed;
#pragma unroll
    for (int e = 0; e < kW; ++e) packed.v[e] = from_float<T>(in[k + e]);
    *reinterpret_cast<Packed<T, kW>*>(p + i0 + k) = packed;
  }
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kWide = 16 / static_cast<int>(sizeof(T));

// out[j] = p[i0 + j] for j < count (0 past it), with `access` wide accesses for a full group.
template <typename T, int kN>
__device__ __forceinline__ void load_group(const T* p, int64_t i0, int count, Access access,
                                           float (&out)[kN]) {
  static_assert(kN % kWide<T> == 0 && kN % kQuad == 0, "a group is whole accesses");
  if (count == kN && access == Access::kWide) {
    load_vectors<kWide<T>>(p, i0, out);
  } else if (count == kN && access == Access::kQuad) {
    load_vectors<kQuad>(p, i0, out);
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) out[j] = j < count ? to_float(p[i0 + j]) : 0.0f;
  }
}

// p[i0 + j] = in[j] for j < count, with `access` wide accesses for a full group.
template <typename T, int kN>
__device__ __forceinline__ void store_group(T* p, int64_t i0, int count, Access access,
                                            const float (&in)[kN]) {
  static_assert(kN % kWide<T> == 0 && kN % kQuad == 0, "a group is whole accesses");
  if (count == kN && access == Access::kWide) {
    store_vectors<kWide<T>>(p, i0, in);
  } else if (count == kN && access == Access::kQuad) {
    store_vectors<kQuad>(p, i0, in);
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j < count) p[i0 + j] = from_float<T>(in[j]);
    }
  }
}

// out[i] = residual[i] + dropout(src[i] + bias[i % cols]) for i < n; bias, residual may be null.
template <typename TS, typename TO>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const TS* __restrict__ src, const float* __restrict__ bias,
                   const TO* __restrict__ residual, TO* __restrict__ out, int64_t n, int64_t cols,
                   Access access, DropoutParams params) {
  constexpr int kN = kGroup<TS, TO>;
  const Mask mask(params);
  const int64_t groups = (n + kN - 1) / kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // column of element kN * p, carried from group to group: + kN * stride (mod cols) per step
  int64_t col = bias != nullptr ? (kN * p) % cols : 0;
  const int64_t col_step = bias != nullptr ? (kN * stride) % cols : 0;
  for (; p < groups; p += stride) {
    const int64_t i0 = kN * p;
    const int count = n - i0 < kN ? static_cast<int>(n - i0) : kN;
    bool keep[kN];
    mask.group(i0, count, true, keep);
    float v[kN], r[kN];
    load_group(src, i0, count, access, v);
    if (residual != nullptr) {
      load_group(residual, i0, count, access, r);
    } else {
#pragma unroll
      for (int j = 0; j < kN; ++j) r[j] = 0.0f;
    }
    int64_t c = col;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (bias != nullptr) {
        v[j] += bias[c];
        c = c + 1 == cols ? 0 : c + 1;
      }
      r[j] += mask.apply(keep[j], v[j]);
    }
    store_group(out, i0, count, access, r);
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
                         float* __restrict__ partial, int64_t rows, int64_t cols, Access access,
                         DropoutParams params) {
  constexpr int kN = kGroup<TG, TX>;
  const Mask mask(params);
  const int64_t c0 = kN * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (c0 >= cols) return;
  const int count = cols - c0 < kN ? static_cast<int>(cols - c0) : kN;
  const bool by_quads = cols % kQuad == 0;  // then element r * cols + c0 starts a quad
  // every row start as aligned as the base pointers: as wide as cols allows
  const Access row_access = cols % kN == 0 ? access
                            : by_quads && access != Access::kElement ? Access::kQuad
                                                                     : Access::kElement;
  float acc[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j] = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i0 = r * cols + c0;
    bool keep[kN];
    mask.group(i0, count, by_quads, keep);
    float g[kN];
    load_group(grad, i0, count, row_access, g);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      g[j] = mask.apply(keep[j], g[j]);
      acc[j] += g[j];
    }
    store_group(grad_x, i0, count, row_access, g);
  }
  float* row = partial + static_cast<int64_t>(blockIdx.y) * cols + c0;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
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

// The widest access every tensor (pointer, element size; null: absent) allows.
Access access_of(std::initializer_list<std::pair<const void*, int>> tensors) {
  bool wide = true, quad = true;
  for (const auto& [p, size] : tensors) {
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(p);
    wide = wide && address % 16 == 0;
    quad = quad && address % (kQuad * size) == 0;
  }
  return wide ? Access::kWide : quad ? Access::kQuad : Access::kElement;
}

// Threads per block of the backward: enough for the row's groups, a multiple of a warp.
int backward_threads(int64_t cols, int group) {
  const int64_t groups = (cols + group - 1) / group;
  return groups >= kThreads ? kThreads : static_cast<int>((groups + 31) / 32 * 32);
}

template <typename TS, typename TO>
void launch_forward(const void* src, const float* bias, const void* residual, void* out,
                    int64_t n, int64_t cols, const DropoutParams& params, cudaStream_t stream) {
  const Access access = access_of({{src, sizeof(TS)}, {out, sizeof(TO)}, {residual, sizeof(TO)}});
  const int64_t groups = (n + kGroup<TS, TO> - 1) / kGroup<TS, TO>;
  forward_kernel<TS, TO><<<grid_blocks(groups, kThreads), kThreads, 0, stream>>>(
      static_cast<const TS*>(src), bias, static_cast<const TO*>(residual), static_cast<TO*>(out),
      n, cols, access, params);
}

template <typename TG, typename TX>
void launch_backward(const void* grad, void* grad_x, float* partial, float* grad_bias,
                     int64_t groups, int64_t rows, int64_t cols, const DropoutParams& params,
                     cudaStream_t stream) {
  constexpr int kN = kGroup<TG, TX>;
  const Access access = access_of({{grad, sizeof(TG)}, {grad_x, sizeof(TX)}});
  const int threads = backward_threads(cols, kN);
  const int64_t column_blocks = (cols + kN * threads - 1) / (kN * threads);
  const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(groups));
  backward_bias_kernel<TG, TX><<<grid, threads, 0, stream>>>(
      static_cast<const TG*>(grad), static_cast<TX*>(grad_x), partial, rows, cols, access,
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
