// Device-side helpers shared by the .cu files: dtype conversion, dtype dispatch, grid sizing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype.h"

namespace fusedops {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// max(a, b) that is NaN when either is (fmaxf drops NaN): the softmax kernels' row max, so a
// row holding NaN is not taken for fully masked (max -inf) and gives NaN, as torch.softmax.
__device__ __forceinline__ float max_nan(float a, float b) { return (isnan(a) || a > b) ? a : b; }

// Number of blocks for a grid-stride loop over n items: enough to fill the GPU, capped so the
// grid never exceeds the hardware limit however large n is.
inline unsigned int grid_blocks(int64_t n, int threads) {
  const int64_t max_blocks = 65535LL * 32;
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < max_blocks ? blocks : max_blocks);
}

// Integer division by a divisor fixed at launch. FastDivider: n / d for 0 <= n < 2^31 and
// 1 <= d < 2^31 by a multiply-high and a shift (a few instructions instead of a 64-bit division);
// WideDivider: plain 64-bit division, for index spaces of 2^31 or more. Same interface.
struct FastDivider {
  uint32_t divisor = 1, magic = 1, shift = 0;
  FastDivider() = default;
  explicit FastDivider(int64_t d) : divisor(static_cast<uint32_t>(d)) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    const uint64_t one = 1;
    magic = static_cast<uint32_t>(((one << 32) * ((one << shift) - divisor)) / divisor + 1);
  }
  __host__ __device__ __forceinline__ int64_t div(int64_t n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(u, magic);
#else
    const uint32_t high = static_cast<uint32_t>((static_cast<uint64_t>(u) * magic) >> 32);
#endif
    return static_cast<int64_t>((high + u) >> shift);
  }
};

struct WideDivider {
  int64_t divisor = 1;
  WideDivider() = default;
  explicit WideDivider(int64_t d) : divisor(d) {}
  __host__ __device__ __forceinline__ int64_t div(int64_t n) const { return n / divisor; }
};

}  // namespace fusedops

// Runs BODY with `scalar_t` bound to the C++ type of DTYPE; unknown dtype -> invalid value.
#define FUSEDOPS_DISPATCH_FLOAT(DTYPE, ...)                  \
  switch (DTYPE) {                                           \
    case ::fusedops::DType::kFloat32: {                      \
      using scalar_t = float;                                \
      __VA_ARGS__;                                           \
      break;                                                 \
    }                                                        \
    case ::fusedops::DType::kFloat16: {                      \
      using scalar_t = __half;                               \
      __VA_ARGS__;                                           \
      break;                                                 \
    }                                                        \
    case ::fusedops::DType::kBFloat16: {                     \
      using scalar_t = __nv_bfloat16;                        \
      __VA_ARGS__;                                           \
      break;                                                 \
    }                                                        \
    default:                                                 \
      return cudaErrorInvalidValue;                          \
  }
