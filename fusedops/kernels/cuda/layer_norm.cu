// LayerNorm and RMSNorm forward and backward, the same algorithm as kernels/triton/layer_norm.py.
//
// x is (rows, cols) contiguous; weight and bias (null when absent) are fp32 or x's dtype (one
// dtype for both), read as fp32; dweight/dbias are stored in that dtype. Statistics in fp32;
// lanes past the end of a row hold 0 before every reduction. mean (LayerNorm only) and rstd are
// saved in fp32.
//
// Register path (cols <= min(max_register_cols, kMaxRegisterCols)): a row is held in registers,
//   kVpt values per thread; a warp per row (8 rows per block) for cols <= 1024, otherwise the
//   whole 256-thread block per row. Mean and variance from the registers: a warp row in two
//   warp sums (mean, then squared deviations); a block row read 16 bytes at a time (LayerNorm)
//   in one block-wide exchange of each thread's count, mean and M2 (block_moments; two
//   exchanges and four barriers before, as the one-element block rows still do), RMSNorm's in
//   one sum of squares. Values are
//   read and written kVec at a time: thread t holds elements (k * row threads + t) * kVec + e.
//   kVec = 1 (one element per access), or with variant.vector_access 16 bytes per access
//   (kVec = 16 / sizeof(T)) where cols % kVec == 0, the row tensors are 16-byte aligned and y /
//   dy have x's dtype (vector_width); the register path's row layout is otherwise the same.
// Looped path: a block per row; pass 1 accumulates shifted sums (shift = the row's first element),
//   pass 2 normalises; rows read and written kVec elements at a time as on the register path
//   (vector_width), thread t taking elements (k * kThreads + t) * kVec + e.
// Backward: dx = (g - (xhat * c1 + c2)) * rstd, g = dy * w, c1 = mean(xhat * g), c2 = mean(g)
//   (RMSNorm: c2 = 0). dweight/dbias in two deterministic stages: each block writes one fp32
//   partial row (blocks = partial rows, chosen by the caller), then column_sum_kernel adds the
//   partial rows in a fixed order (runs of kSplitRows rows, then the runs' sums). No atomics:
//   the same bits on every run.
// RMSNorm variants (NormVariant, layer_norm.h): xhat rounded to fp16/bf16 before the weight
//   multiply, y (forward) / dy (backward) in fp32 instead of x's dtype; dweight sums dy times
//   the rounded xhat.
//   Register path: block b takes rows b, b + blocks, ... per row slot; the row slots of a block
//   are added in slot order through shared memory. Looped path: row_coeffs_kernel gives c1, c2
//   per row, then backward_columns_kernel (grid: column chunks x row groups) writes dx and the
//   partial rows.
#include <cstdint>
#include <initializer_list>

#include "device.cuh"
#include "layer_norm.h"

namespace fusedops {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int kMaxVpt = 32;
constexpr int kMaxRegisterCols = kThreads * kMaxVpt;  // 8192
constexpr int kWarpRowMaxCols = kWarp * kMaxVpt;      // 1024
// Partial rows of the dweight/dbias reduction a thread of column_sum_kernel's first stage adds.
constexpr int64_t kSplitRows = 16;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sum of v over the threads of one row: a warp (kRowWarps == 1) or the whole block
// (kRowWarps == kWarpsPerBlock; every thread of the block must call it).
template <int kRowWarps>
__device__ __forceinline__ float row_sum(float v, float* shared /* kWarpsPerBlock floats */) {
  v = warp_sum(v);
  if constexpr (kRowWarps == 1) {
    return v;
  } else {
    static_assert(kRowWarps == kWarpsPerBlock, "a row is a warp or the whole block");
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    __syncthreads();  // earlier readers of `shared` are done
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowWarps; ++w) total += shared[w];
    return total;
  }
}

// Count, mean and sum of squared deviations from the mean (M2) of a set of values.
struct Moments {
  float n, mean, m2;
};

// The moments of the union of two disjoint sets (Chan, Golub and LeVeque's pairwise rule).
// Not symmetric in its bits: callers fix which set is `a`. Empty sets (threads or warps past a
// short row's end) pass the other through (no 0 / 0).
__host__ __device__ __forceinline__ Moments merge_moments(Moments a, Moments b) {
  const float n = a.n + b.n;
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  const float delta = b.mean - a.mean;
  const float b_share = b.n / n;
  return {n, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.n * b_share};
}

// The moments of a row held by the whole block (kRowWarps == kWarpsPerBlock), every thread
// calling with its own values' moments: one block-wide exchange where a mean and then a sum of
// squared deviations took two. Butterfly over the warp (lane 0's result, the only one used,
// merges the lower lanes' sets first), then the warps' moments in warp order from shared
// memory (3 * kWarpsPerBlock floats): every thread gets the same result.
__device__ __forceinline__ Moments block_moments(Moments m, float* shared) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const Moments other{__shfl_xor_sync(0xffffffffu, m.n, offset),
                        __shfl_xor_sync(0xffffffffu, m.mean, offset),
                        __shfl_xor_sync(0xffffffffu, m.m2, offset)};
    m = merge_moments(m, other);
  }
  const int warp = threadIdx.x / kWarp;
  __syncthreads();  // earlier readers of `shared` are done
  if (threadIdx.x % kWarp == 0) {
    shared[warp] = m.n;
    shared[kWarpsPerBlock + warp] = m.mean;
    shared[2 * kWarpsPerBlock + warp] = m.m2;
  }
  __syncthreads();
  Moments total{shared[0], shared[kWarpsPerBlock], shared[2 * kWarpsPerBlock]};
#pragma unroll
  for (int w = 1; w < kWarpsPerBlock; ++w) {
    total = merge_moments(
        total, {shared[w], shared[kWarpsPerBlock + w], shared[2 * kWarpsPerBlock + w]});
  }
  return total;
}

// xhat rounded to `dtype` and back (kFloat32: unchanged), to nearest even as torch's casts.
__device__ __forceinline__ float round_xhat(float v, DType dtype) {
  if (dtype == DType::kFloat16) return __half2float(__float2half_rn(v));
  if (dtype == DType::kBFloat16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

// Element i of y (forward output) or dy (backward input): x's type T, or float when out_fp32.
template <typename T>
__device__ __forceinline__ void store_y(void* y, int64_t i, float v, bool out_fp32) {
  if (out_fp32) {
    static_cast<float*>(y)[i] = v;
  } else {
    static_cast<T*>(y)[i] = from_float<T>(v);
  }
}

template <typename T>
__device__ __forceinline__ float load_dy(const void* dy, int64_t i, bool out_fp32) {
  return out_fp32 ? static_cast<const float*>(dy)[i] : to_float(static_cast<const T*>(dy)[i]);
}

// Elements of T in one 16-byte access: the vector path's kVec.
template <typename T>
constexpr int kVectorWidth = 16 / static_cast<int>(sizeof(T));

// kVec elements of T in one access (16 bytes for kVec = kVectorWidth<T>).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Packed {
  T v[kVec];
};

// Elements j0 .. j0 + kVec - 1 of `row` as floats, 0 past the row's end. With kVec > 1 the
// launcher guarantees cols % kVec == 0 and 16-byte alignment: a vector is all in or all out.
template <int kVec, typename T>
__device__ __forceinline__ void load_values(const T* row, int j0, int cols, float* out) {
  if (j0 >= cols) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = 0.0f;
  } else if constexpr (kVec == 1) {
    out[0] = to_float(row[j0]);
  } else {
    const Packed<T, kVec> packed = *reinterpret_cast<const Packed<T, kVec>*>(row + j0);
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = to_float(packed.v[e]);
  }
}

// Stores elements j0 .. j0 + kVec - 1 of `row` (nothing past the row's end).
template <int kVec, typename T>
__device__ __forceinline__ void store_values(T* row, int j0, int cols, const float* in) {
  if (j0 >= cols) return;
  if constexpr (kVec == 1) {
    row[j0] = from_float<T>(in[0]);
  } else {
    Packed<T, kVec> packed;
#pragma unroll
    for (int e = 0; e < kVec; ++e) packed.v[e] = from_float<T>(in[e]);
    *reinterpret_cast<Packed<T, kVec>*>(row + j0) = packed;
  }
}

// y (forward output) / dy (backward input) rows: x's type T, or float when out_fp32 (kVec == 1
// only; vector_width never picks a vector for an fp32 y/dy beside a narrower x).
template <int kVec, typename T>
__device__ __forceinline__ void load_dy_values(const void* dy, int64_t row_start, int j0,
                                               int cols, bool out_fp32, float* out) {
  if (kVec == 1 && out_fp32) {
    out[0] = j0 < cols ? static_cast<const float*>(dy)[row_start + j0] : 0.0f;
  } else {
    load_values<kVec>(static_cast<const T*>(dy) + row_start, j0, cols, out);
  }
}

template <int kVec, typename T>
__device__ __forceinline__ void store_y_values(void* y, int64_t row_start, int j0, int cols,
                                               bool out_fp32, const float* in) {
  if (kVec == 1 && out_fp32) {
    if (j0 < cols) static_cast<float*>(y)[row_start + j0] = in[0];
  } else {
    store_values<kVec>(static_cast<T*>(y) + row_start, j0, cols, in);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

// CTAs per SM asked of ptxas (__launch_bounds__'s second argument) for a forward instantiation;
// 0 leaves the choice to ptxas. Left to itself, ptxas (nvcc 13.0) traded a few bytes of spills
// for occupancy in some one-element-access (kVec = 1) instantiations: a block per row of 32
// values per thread at 64 registers (4 CTAs; 8-24 B spills), fp32 16 values per thread at 40
// (6 CTAs). With these minimums every instantiation compiles without spills or local memory on
// sm_80 and sm_90: fp32 block rows of 32 values at 64 registers (4 CTAs); 16-bit ones need 80
// (3 CTAs; at 64 they spill 24-72 B); fp32 16 values at 40 with a warp per row (6 CTAs) and 48
// with a block per row (5 CTAs; at 40 they spill). The other instantiations are unchanged.
template <typename T, int kRowWarps, int kVpt, int kVec>
constexpr int forward_min_blocks() {
  if (kVec != 1) return 0;
  if (kVpt == 32 && kRowWarps == kWarpsPerBlock) return sizeof(T) == 4 ? 4 : 3;
  if (kVpt == 16 && sizeof(T) == 4) return kRowWarps == 1 ? 6 : 5;
  return 0;
}

// Subtracts `mean` from a forward thread's row values in place (0 past the row's end) and
// returns the sum of their squares (unused, and so not computed, where the variance came from
// block_moments).
template <int kRowThreads, int kVectors, int kVec>
__device__ __forceinline__ float center_values(float* v, float mean, int t, int cols) {
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kVectors; ++k) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = k * kVec + e;
      v[i] = (k * kRowThreads + t) * kVec + e < cols ? v[i] - mean : 0.0f;
      squares += v[i] * v[i];
    }
  }
  return squares;
}

template <typename T, typename W, int kRowWarps, int kVpt, int kVec>
__global__ void __launch_bounds__(kThreads, (forward_min_blocks<T, kRowWarps, kVpt, kVec>()))
    forward_register_kernel(const T* __restrict__ x, const W* __restrict__ weight,
                            const W* __restrict__ bias, void* __restrict__ y,
                            float* __restrict__ mean_out, float* __restrict__ rstd_out,
                            int64_t rows, int cols, float eps, bool rms, NormVariant variant) {
  static_assert(kVpt % kVec == 0, "a thread holds whole vectors");
  constexpr int kRowThreads = kRowWarps * kWarp;
  constexpr int kRowsPerBlock = kWarpsPerBlock / kRowWarps;
  constexpr int kVectors = kVpt / kVec;
  __shared__ float shared[3 * kWarpsPerBlock];
  const int slot = threadIdx.x / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; row < rows;
       row += step) {
    const T* x_row = x + row * cols;
    float v[kVpt];
    float sum = 0.0f;
    int count = 0;  // this thread's values in the row
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      load_values<kVec>(x_row, (k * kRowThreads + t) * kVec, cols, v + k * kVec);
      if ((k * kRowThreads + t) * kVec < cols) count += kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += v[k * kVec + e];
    }
    float mean = 0.0f, var;
    if (kRowWarps == kWarpsPerBlock && kVec > 1 && !rms) {
      // a block row read 16 bytes at a time: its mean and variance in one block-wide exchange
      // (block_moments) of this thread's count, mean and squared deviations (values past the
      // row end are 0, not counted). The one-element instantiations keep two exchanges: with
      // block_moments they needed 16-32 more registers (5 -> 3 CTAs/SM at 16 values of 16-bit
      // x) or spilled under their __launch_bounds__ minimums (forward_min_blocks).
      const float own_mean = count > 0 ? sum / count : 0.0f;
      float own_m2 = 0.0f;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float d = (k * kRowThreads + t) * kVec + e < cols ? v[k * kVec + e] - own_mean
                                                                  : 0.0f;
          own_m2 += d * d;
        }
      }
      const Moments row_moments =
          block_moments({static_cast<float>(count), own_mean, own_m2}, shared);
      mean = row_moments.mean;
      var = row_moments.m2 / cols;
      center_values<kRowThreads, kVectors, kVec>(v, mean, t, cols);
    } else {  // a warp row (two warp sums), a one-element block row, or RMSNorm (one sum)
      if (!rms) mean = row_sum<kRowWarps>(sum, shared) / cols;
      const float squares = center_values<kRowThreads, kVectors, kVec>(v, mean, t, cols);
      var = row_sum<kRowWarps>(squares, shared) / cols;
    }
    const float rstd = 1.0f / sqrtf(var + eps);
    if (t == 0) {
      if (!rms) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int j0 = (k * kRowThreads + t) * kVec;
      if (j0 >= cols) continue;
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out[e] = round_xhat(v[k * kVec + e] * rstd, variant.xhat_dtype);
        if (weight != nullptr) out[e] *= to_float(weight[j0 + e]);
        if (bias != nullptr) out[e] += to_float(bias[j0 + e]);
      }
      store_y_values<kVec, T>(y, row * cols, j0, cols, variant.out_fp32, out);
    }
  }
}

// Stores elements j0 .. j0 + kVec - 1 of `row` (16 bytes, aligned) as one 16-byte store
// (st.global.cg.v4: cached in L2 only, y is not read again here). In forward_loop_kernel nvcc
// 13.0 split store_values' Packed store into 2-byte stores, and a uint4 assignment into 4-byte
// ones (the register kernels get 16-byte stores from store_values).
template <int kVec, typename T>
__device__ __forceinline__ void store_vector(T* row, int j0, const float* in) {
  static_assert(sizeof(T) * kVec == sizeof(uint4), "one 16-byte vector");
  Packed<T, kVec> packed;
#pragma unroll
  for (int e = 0; e < kVec; ++e) packed.v[e] = from_float<T>(in[e]);
  __stcg(reinterpret_cast<uint4*>(row + j0), *reinterpret_cast<const uint4*>(&packed));
}

// Thread t of a looped-path block reads elements (k * kThreads + t) * kVec + e of its row
// (whole vectors: with kVec > 1 the launcher guarantees cols % kVec == 0 and aligned rows).
template <typename T, typename W, int kVec>
__global__ void __launch_bounds__(kThreads)
    forward_loop_kernel(const T* __restrict__ x, const W* __restrict__ weight,
                        const W* __restrict__ bias, void* __restrict__ y,
                        float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                        int cols, float eps, bool rms, NormVariant variant) {
  __shared__ float shared[kWarpsPerBlock];
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t step = static_cast<int64_t>(kThreads) * kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * cols;
    const float shift = rms ? 0.0f : to_float(x_row[0]);
    float s1 = 0.0f;
    float s2 = 0.0f;
    for (int64_t j0 = first; j0 < cols; j0 += step) {
      float v[kVec];
      load_values<kVec>(x_row, static_cast<int>(j0), cols, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float d = v[e] - shift;
        s1 += d;
        s2 += d * d;
      }
    }
    const float m1 = row_sum<kWarpsPerBlock>(s1, shared) / cols;
    const float m2 = row_sum<kWarpsPerBlock>(s2, shared) / cols;
    const float mean = rms ? 0.0f : shift + m1;
    const float var = rms ? m2 : fmaxf(m2 - m1 * m1, 0.0f);
    const float rstd = 1.0f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
      if (!rms) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    for (int64_t j0 = first; j0 < cols; j0 += step) {
      const int j = static_cast<int>(j0);
      float v[kVec];
      load_values<kVec>(x_row, j, cols, v);
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        out[e] = round_xhat((v[e] - mean) * rstd, variant.xhat_dtype);
        if (weight != nullptr) out[e] *= to_float(weight[j + e]);
        if (bias != nullptr) out[e] += to_float(bias[j + e]);
      }
      if constexpr (kVec == 1) {
        store_y_values<kVec, T>(y, row * cols, j, cols, variant.out_fp32, out);
      } else {  // a vector: y has x's type (vector_width)
        store_vector<kVec>(static_cast<T*>(y) + row * cols, j, out);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

// Writes partial[blockIdx.x, :] = the sum of the block's row slots' accumulators, slot by slot
// in order (through shared memory when the block holds several rows). Every thread calls it.
// acc[k * kVec + e] is column (k * row threads + t) * kVec + e.
template <int kRowWarps, int kVpt, int kVec>
__device__ __forceinline__ void write_partial(const float (&acc)[kVpt], float* partial,
                                              float* slot_partial, int slot, int t, int cols) {
  constexpr int kRowThreads = kRowWarps * kWarp;
  constexpr int kRowsPerBlock = kWarpsPerBlock / kRowWarps;
  constexpr int kRowValues = kRowThreads * kVpt;
  constexpr int kVectors = kVpt / kVec;
  float* partial_row = partial + static_cast<int64_t>(blockIdx.x) * cols;
  if constexpr (kRowsPerBlock == 1) {
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int j = (k * kRowThreads + t) * kVec + e;
        if (j < cols) partial_row[j] = acc[k * kVec + e];
      }
    }
  } else {
    __syncthreads();  // slot_partial is free (an earlier call is done reading it)
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        slot_partial[slot * kRowValues + (k * kRowThreads + t) * kVec + e] = acc[k * kVec + e];
      }
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      float total = 0.0f;
#pragma unroll
      for (int s = 0; s < kRowsPerBlock; ++s) total += slot_partial[s * kRowValues + j];
      partial_row[j] = total;
    }
  }
}

template <typename T, typename W, int kRowWarps, int kVpt, int kVec>
__global__ void __launch_bounds__(kThreads)
    backward_register_kernel(const void* __restrict__ dy, const T* __restrict__ x,
                             const W* __restrict__ weight, const float* __restrict__ mean,
                             const float* __restrict__ rstd, T* __restrict__ dx,
                             float* __restrict__ dw_partial, float* __restrict__ db_partial,
                             int64_t rows, int cols, bool rms, NormVariant variant) {
  static_assert(kVpt % kVec == 0, "a thread holds whole vectors");
  constexpr int kRowThreads = kRowWarps * kWarp;
  constexpr int kRowsPerBlock = kWarpsPerBlock / kRowWarps;
  constexpr int kRowValues = kRowThreads * kVpt;
  constexpr int kVectors = kVpt / kVec;
  __shared__ float shared[kWarpsPerBlock];
  // Per-slot partial rows of a block, added in slot order (only when a block holds several rows).
  __shared__ float slot_partial[kRowsPerBlock > 1 ? kRowsPerBlock * kRowValues : 1];
  const int slot = threadIdx.x / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  float dw_acc[kVpt];
  float db_acc[kVpt];
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    dw_acc[i] = 0.0f;
    db_acc[i] = 0.0f;
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; row < rows;
       row += step) {
    const float mu = rms ? 0.0f : mean[row];
    const float rs = rstd[row];
    const T* x_row = x + row * cols;
    float xhat[kVpt];
    float g[kVpt];
    float s1 = 0.0f;
    float s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int j0 = (k * kRowThreads + t) * kVec;
      float xv[kVec];
      float d[kVec];
      load_values<kVec>(x_row, j0, cols, xv);
      load_dy_values<kVec, T>(dy, row * cols, j0, cols, variant.out_fp32, d);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int i = k * kVec + e;
        xhat[i] = 0.0f;
        g[i] = 0.0f;
        if (j0 + e < cols) {
          xhat[i] = (xv[e] - mu) * rs;
          g[i] = weight != nullptr ? d[e] * to_float(weight[j0 + e]) : d[e];
          dw_acc[i] += d[e] * round_xhat(xhat[i], variant.xhat_dtype);
          db_acc[i] += d[e];
        }
        s1 += xhat[i] * g[i];
        s2 += g[i];
      }
    }
    const float c1 = row_sum<kRowWarps>(s1, shared) / cols;
    const float c2 = rms ? 0.0f : row_sum<kRowWarps>(s2, shared) / cols;
    T* dx_row = dx + row * cols;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int i = k * kVec + e;
        out[e] = (g[i] - (xhat[i] * c1 + c2)) * rs;
      }
      store_values<kVec>(dx_row, (k * kRowThreads + t) * kVec, cols, out);
    }
  }
  // One partial row per block: partial[blockIdx.x, :].
  if (dw_partial != nullptr) {  // uniform across the block
    write_partial<kRowWarps, kVpt, kVec>(dw_acc, dw_partial, slot_partial, slot, t, cols);
  }
  if (db_partial != nullptr) {
    write_partial<kRowWarps, kVpt, kVec>(db_acc, db_partial, slot_partial, slot, t, cols);
  }
}

// c[row] = mean(xhat * g), c[rows + row] = mean(g) (0 for RMSNorm): a block per row, read
// kVec elements at a time as forward_loop_kernel reads them.
template <typename T, typename W, int kVec>
__global__ void __launch_bounds__(kThreads)
    row_coeffs_kernel(const void* __restrict__ dy, const T* __restrict__ x,
                      const W* __restrict__ weight, const float* __restrict__ mean,
                      const float* __restrict__ rstd, float* __restrict__ coeffs, int64_t rows,
                      int cols, bool rms, NormVariant variant) {
  __shared__ float shared[kWarpsPerBlock];
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t step = static_cast<int64_t>(kThreads) * kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float mu = rms ? 0.0f : mean[row];
    const float rs = rstd[row];
    const T* x_row = x + row * cols;
    float s1 = 0.0f;
    float s2 = 0.0f;
    for (int64_t j0 = first; j0 < cols; j0 += step) {
      float d[kVec];
      float v[kVec];
      load_dy_values<kVec, T>(dy, row * cols, static_cast<int>(j0), cols, variant.out_fp32, d);
      load_values<kVec>(x_row, static_cast<int>(j0), cols, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float xhat = (v[e] - mu) * rs;
        const float g = weight != nullptr ? d[e] * to_float(weight[j0 + e]) : d[e];
        s1 += xhat * g;
        s2 += g;
      }
    }
    const float c1 = row_sum<kWarpsPerBlock>(s1, shared) / cols;
    const float c2 = rms ? 0.0f : row_sum<kWarpsPerBlock>(s2, shared) / cols;
    if (threadIdx.x == 0) {
      coeffs[row] = c1;
      coeffs[rows + row] = c2;
    }
  }
}

// Grid (column chunks of kThreads * kVec, row groups): thread j of group b handles columns
// j * kVec .. j * kVec + kVec - 1 of rows b, b + groups, ... (whole vectors, as in
// forward_loop_kernel); writes dx and those columns of partial[b, :].
template <typename T, typename W, int kVec>
__global__ void __launch_bounds__(kThreads)
    backward_columns_kernel(const void* __restrict__ dy, const T* __restrict__ x,
                            const W* __restrict__ weight, const float* __restrict__ mean,
                            const float* __restrict__ rstd, const float* __restrict__ coeffs,
                            T* __restrict__ dx, float* __restrict__ dw_partial,
                            float* __restrict__ db_partial, int64_t rows, int cols, bool rms,
                            NormVariant variant) {
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (j0 >= cols) return;
  const int j = static_cast<int>(j0);
  const int64_t group = blockIdx.y;
  const int64_t groups = gridDim.y;
  float w[kVec];
  float dw_acc[kVec];
  float db_acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    w[e] = weight != nullptr ? to_float(weight[j0 + e]) : 1.0f;
    dw_acc[e] = 0.0f;
    db_acc[e] = 0.0f;
  }
  for (int64_t row = group; row < rows; row += groups) {
    const int64_t row_start = row * cols;
    float d[kVec];
    float v[kVec];
    load_dy_values<kVec, T>(dy, row_start, j, cols, variant.out_fp32, d);
    load_values<kVec>(x + row_start, j, cols, v);
    const float rs = rstd[row];
    const float mu = rms ? 0.0f : mean[row];
    const float c1 = coeffs[row];
    const float c2 = coeffs[rows + row];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float xhat = (v[e] - mu) * rs;
      dw_acc[e] += d[e] * round_xhat(xhat, variant.xhat_dtype);
      db_acc[e] += d[e];
      v[e] = (d[e] * w[e] - (xhat * c1 + c2)) * rs;
    }
    store_values<kVec>(dx + row_start, j, cols, v);
  }
  // fp32 partial rows, one element at a time (no alignment asked of the partial buffer)
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    if (dw_partial != nullptr) dw_partial[group * cols + j0 + e] = dw_acc[e];
    if (db_partial != nullptr) db_partial[group * cols + j0 + e] = db_acc[e];
  }
}

// The fp32 partial rows of dweight and dbias and their outputs, one matrix or two
// (column_sum_kernel's blockIdx.z picks one).
template <typename W>
struct ColumnSums {
  float* partial[2];
  W* out[2];
};

// Thread j of block (c, s, m) adds column j of rows s * rows_per_block ... (at most
// rows_per_block, fewer in the last block) of matrix m's partial rows, row r being row
// r * row_step of the buffer, in order, and writes the sum to row s * out_row_step of matrix
// m's out. Two launches (launch_column_sums): the first adds runs of kSplitRows partial rows in
// place, into each run's first row (the thread that writes an element is the only one that
// reads it: partial and out may alias, hence no __restrict__), the second adds those first rows
// into out.
template <typename W>
__global__ void __launch_bounds__(kThreads)
    column_sum_kernel(ColumnSums<W> sums, int64_t rows, int64_t row_step, int cols,
                      int64_t rows_per_block, int64_t out_row_step) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= cols) return;
  // a select, not sums.partial[blockIdx.z]: a kernel-parameter array indexed at run time is
  // copied to local memory
  const bool second = blockIdx.z != 0;
  const float* partial = second ? sums.partial[1] : sums.partial[0];
  W* out = second ? sums.out[1] : sums.out[0];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t end = first + rows_per_block < rows ? first + rows_per_block : rows;
  float total = 0.0f;
  for (int64_t p = first; p < end; ++p) total += partial[p * row_step * cols + j];
  out[static_cast<int64_t>(blockIdx.y) * out_row_step * cols + j] = from_float<W>(total);
}

// ---------------------------------------------------------------------------------------------
// Launch helpers

bool use_register_path(int64_t cols, int64_t max_register_cols) {
  return cols <= max_register_cols && cols <= kMaxRegisterCols;
}

// Values per thread: the smallest power of two with kRowThreads * kVpt >= cols.
int values_per_thread(int64_t cols, int row_threads) {
  int vpt = 1;
  while (static_cast<int64_t>(vpt) * row_threads < cols) vpt *= 2;
  return vpt;
}

// Runs BODY with constexpr kRowWarps and kVpt bound for a register-path row of `cols`.
#define FUSEDOPS_LN_REGISTER_DISPATCH(COLS, ...)                                      \
  do {                                                                                \
    if ((COLS) <= kWarpRowMaxCols) {                                                  \
      constexpr int kRowWarps = 1;                                                    \
      switch (values_per_thread((COLS), kWarp)) {                                     \
        case 1: { constexpr int kVpt = 1; __VA_ARGS__; } break;                       \
        case 2: { constexpr int kVpt = 2; __VA_ARGS__; } break;                       \
        case 4: { constexpr int kVpt = 4; __VA_ARGS__; } break;                       \
        case 8: { constexpr int kVpt = 8; __VA_ARGS__; } break;                       \
        case 16: { constexpr int kVpt = 16; __VA_ARGS__; } break;                     \
        default: { constexpr int kVpt = 32; __VA_ARGS__; } break;                     \
      }                                                                               \
    } else {                                                                          \
      constexpr int kRowWarps = kWarpsPerBlock;                                       \
      switch (values_per_thread((COLS), kThreads)) {                                  \
        case 1:                                                                       \
        case 2:                                                                       \
        case 4:                                                                       \
        case 8: { constexpr int kVpt = 8; __VA_ARGS__; } break;                       \
        case 16: { constexpr int kVpt = 16; __VA_ARGS__; } break;                     \
        default: { constexpr int kVpt = 32; __VA_ARGS__; } break;                     \
      }                                                                               \
    }                                                                                 \
  } while (0)

// Runs BODY with constexpr kVec bound: 1, or kVectorWidth<T> when VEC is not 1 (vector_width).
#define FUSEDOPS_LN_VECTOR_DISPATCH(T, VEC, ...)                 \
  do {                                                          \
    if ((VEC) == 1) {                                           \
      constexpr int kVec = 1;                                   \
      __VA_ARGS__;                                              \
    } else {                                                    \
      constexpr int kVec = kVectorWidth<T>;                     \
      __VA_ARGS__;                                              \
    }                                                           \
  } while (0)

// Elements per access of the register path: kVectorWidth<T> with variant.vector_access where
// every row starts 16-byte aligned (cols % that == 0, aligned base pointers) and y / dy have x's
// dtype (not out_fp32); else 1.
template <typename T>
int vector_width(const NormVariant& variant, int cols, std::initializer_list<const void*> rows) {
  constexpr int kVec = kVectorWidth<T>;
  if (!variant.vector_access || variant.out_fp32 || cols % kVec != 0) return 1;
  for (const void* p : rows) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return 1;
  }
  return kVec;
}

unsigned int row_blocks(int64_t rows, int rows_per_block) {
  return grid_blocks(rows, rows_per_block);
}

template <typename T, typename W>
void launch_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                    float* rstd, int64_t rows, int cols, float eps, bool rms,
                    NormVariant variant, int64_t max_register_cols, cudaStream_t stream) {
  const T* tx = static_cast<const T*>(x);
  const W* tw = static_cast<const W*>(weight);
  const W* tb = static_cast<const W*>(bias);
  if (use_register_path(cols, max_register_cols)) {
    const int vec = vector_width<T>(variant, cols, {x, y});
    FUSEDOPS_LN_REGISTER_DISPATCH(cols, FUSEDOPS_LN_VECTOR_DISPATCH(T, vec, {
      constexpr int kValues = kVpt < kVec ? kVec : kVpt;
      const unsigned int blocks = row_blocks(rows, kWarpsPerBlock / kRowWarps);
      forward_register_kernel<T, W, kRowWarps, kValues, kVec><<<blocks, kThreads, 0, stream>>>(
          tx, tw, tb, y, mean, rstd, rows, cols, eps, rms, variant);
    }));
  } else {
    const int vec = vector_width<T>(variant, cols, {x, y});
    FUSEDOPS_LN_VECTOR_DISPATCH(T, vec, {
      forward_loop_kernel<T, W, kVec><<<row_blocks(rows, 1), kThreads, 0, stream>>>(
          tx, tw, tb, y, mean, rstd, rows, cols, eps, rms, variant);
    });
  }
}

// out_m (cols,) = the sum of partial_m's rows (partial_rows, cols), fp32, in a fixed order, for
// the matrices given (a null partial_m: none; dweight's and dbias's in the same launches): runs
// of kSplitRows rows first (column blocks x runs: 4 x 17 blocks a matrix at N = 1024 on an
// H100's 264 partial rows, where one pass over all rows ran 4 blocks), then the runs' sums.
// Overwrites the first row of each run.
template <typename W>
void launch_column_sums(float* partial0, W* out0, float* partial1, W* out1,
                        int64_t partial_rows, int cols, cudaStream_t stream) {
  float* partials[2] = {nullptr, nullptr};
  W* outs[2] = {nullptr, nullptr};
  unsigned int matrices = 0;
  if (partial0 != nullptr) {
    partials[matrices] = partial0;
    outs[matrices++] = out0;
  }
  if (partial1 != nullptr) {
    partials[matrices] = partial1;
    outs[matrices++] = out1;
  }
  if (matrices == 0) return;
  const ColumnSums<float> runs_sums{{partials[0], partials[1]}, {partials[0], partials[1]}};
  const ColumnSums<W> sums{{partials[0], partials[1]}, {outs[0], outs[1]}};
  const unsigned int column_blocks =
      static_cast<unsigned int>((static_cast<int64_t>(cols) + kThreads - 1) / kThreads);
  int64_t rows = partial_rows, row_step = 1;
  if (partial_rows > kSplitRows) {
    const int64_t runs = (partial_rows + kSplitRows - 1) / kSplitRows;
    const dim3 grid(column_blocks, static_cast<unsigned int>(runs), matrices);
    column_sum_kernel<float><<<grid, kThreads, 0, stream>>>(runs_sums, partial_rows, 1, cols,
                                                           kSplitRows, kSplitRows);
    rows = runs;
    row_step = kSplitRows;
  }
  const dim3 grid(column_blocks, 1, matrices);
  column_sum_kernel<W><<<grid, kThreads, 0, stream>>>(sums, rows, row_step, cols, rows, 0);
}

template <typename T, typename W>
void launch_backward(const void* dy, const void* x, const void* weight, const float* mean,
                     const float* rstd, void* dx, float* dw_partial, float* db_partial,
                     int64_t partial_rows, void* dweight, void* dbias, float* coeffs,
                     int64_t rows, int cols, bool rms, NormVariant variant,
                     int64_t max_register_cols, cudaStream_t stream) {
  const T* tx = static_cast<const T*>(x);
  const W* tw = static_cast<const W*>(weight);
  T* tdx = static_cast<T*>(dx);
  const unsigned int blocks = static_cast<unsigned int>(partial_rows);
  if (use_register_path(cols, max_register_cols)) {
    const int vec = vector_width<T>(variant, cols, {dy, x, dx});
    FUSEDOPS_LN_REGISTER_DISPATCH(cols, FUSEDOPS_LN_VECTOR_DISPATCH(T, vec, {
      constexpr int kValues = kVpt < kVec ? kVec : kVpt;
      backward_register_kernel<T, W, kRowWarps, kValues, kVec><<<blocks, kThreads, 0, stream>>>(
          dy, tx, tw, mean, rstd, tdx, dw_partial, db_partial, rows, cols, rms, variant);
    }));
  } else {
    const int vec = vector_width<T>(variant, cols, {dy, x, dx});
    FUSEDOPS_LN_VECTOR_DISPATCH(T, vec, {
      row_coeffs_kernel<T, W, kVec><<<row_blocks(rows, 1), kThreads, 0, stream>>>(
          dy, tx, tw, mean, rstd, coeffs, rows, cols, rms, variant);
      // 64-bit: cols + per_block - 1 would overflow int for cols near INT32_MAX
      const int64_t per_block = static_cast<int64_t>(kThreads) * kVec;
      const auto column_blocks =
          static_cast<unsigned int>((static_cast<int64_t>(cols) + per_block - 1) / per_block);
      const dim3 grid(column_blocks, blocks);
      backward_columns_kernel<T, W, kVec><<<grid, kThreads, 0, stream>>>(
          dy, tx, tw, mean, rstd, coeffs, tdx, dw_partial, db_partial, rows, cols, rms, variant);
    });
  }
  launch_column_sums(dweight != nullptr ? dw_partial : nullptr, static_cast<W*>(dweight),
                     dbias != nullptr ? db_partial : nullptr, static_cast<W*>(dbias),
                     partial_rows, cols, stream);
}

// Runs BODY with `param_t` bound to the parameters' C++ type: float, or x's type scalar_t.
#define FUSEDOPS_LN_PARAM_DISPATCH(PARAM_DTYPE, DTYPE, ...)         \
  do {                                                              \
    if ((PARAM_DTYPE) == DType::kFloat32) {                         \
      using param_t = float;                                        \
      __VA_ARGS__;                                                  \
    } else if ((PARAM_DTYPE) == (DTYPE)) {                          \
      using param_t = scalar_t;                                     \
      __VA_ARGS__;                                                  \
    } else {                                                        \
      return cudaErrorInvalidValue;                                 \
    }                                                               \
  } while (0)

// xhat_dtype: float32 (no rounding), float16 or bfloat16.
bool valid_variant(const NormVariant& variant) {
  return variant.xhat_dtype == DType::kFloat32 || variant.xhat_dtype == DType::kFloat16 ||
         variant.xhat_dtype == DType::kBFloat16;
}

}  // namespace

cudaError_t layer_norm_forward(const void* x, const void* weight, const void* bias,
                               DType param_dtype, void* y, float* mean, float* rstd,
                               int64_t rows, int64_t cols, float eps, bool rms,
                               NormVariant variant, int64_t max_register_cols, DType dtype,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (cols <= 0 || cols > INT32_MAX || rstd == nullptr || (!rms && mean == nullptr) ||
      !valid_variant(variant)) {
    return cudaErrorInvalidValue;
  }
  const int n = static_cast<int>(cols);
  FUSEDOPS_DISPATCH_FLOAT(dtype, FUSEDOPS_LN_PARAM_DISPATCH(param_dtype, dtype, {
                            launch_forward<scalar_t, param_t>(x, weight, bias, y, mean, rstd,
                                                              rows, n, eps, rms, variant,
                                                              max_register_cols, stream);
                          }));
  return cudaGetLastError();
}

bool layer_norm_backward_needs_coeffs(int64_t cols, int64_t max_register_cols) {
  return !use_register_path(cols, max_register_cols);
}

cudaError_t layer_norm_backward(const void* dy, const void* x, const void* weight,
                                DType param_dtype, const float* mean, const float* rstd,
                                void* dx, float* dw_partial, float* db_partial,
                                int64_t partial_rows, void* dweight, void* dbias, float* coeffs,
                                int64_t rows, int64_t cols, bool rms, NormVariant variant,
                                int64_t max_register_cols, DType dtype, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (cols <= 0 || cols > INT32_MAX || partial_rows < 1 || partial_rows > 65535 ||
      partial_rows > rows || rstd == nullptr || (!rms && mean == nullptr) ||
      (dw_partial == nullptr) != (dweight == nullptr) ||
      (db_partial == nullptr) != (dbias == nullptr) ||
      (layer_norm_backward_needs_coeffs(cols, max_register_cols) && coeffs == nullptr) ||
      !valid_variant(variant)) {
    return cudaErrorInvalidValue;
  }
  const int n = static_cast<int>(cols);
  FUSEDOPS_DISPATCH_FLOAT(dtype, FUSEDOPS_LN_PARAM_DISPATCH(param_dtype, dtype, {
                            launch_backward<scalar_t, param_t>(
                                dy, x, weight, mean, rstd, dx, dw_partial, db_partial,
                                partial_rows, dweight, dbias, coeffs, rows, n, rms, variant,
                                max_register_cols, stream);
                          }));
  return cudaGetLastError();
}

}  // namespace fusedops
