// QuickGELU forward and backward: grid-stride elementwise kernels, math in fp32,
// 64-bit indices. Each element is read and written once.
#include "device.cuh"

namespace fusedops {
namespace {

constexpr float kAlpha = 1.702f;
constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

template <typename T>
__global__ void quick_gelu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = to_float(x[i]);
    y[i] = from_float<T>(v * sigmoid(kAlpha * v));
  }
}

template <typename T>
__global__ void quick_gelu_backward_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                                           T* __restrict__ dx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = to_float(x[i]);
    const float s = sigmoid(kAlpha * v);
    dx[i] = from_float<T>(to_float(grad[i]) * (s + kAlpha * v * s * (1.0f - s)));
  }
}

}  // namespace

cudaError_t quick_gelu_forward(const void* x, void* y, int64_t n, DType dtype,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, quick_gelu_forward_kernel<scalar_t>
                          <<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(
                              static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), n));
  return cudaGetLastError();
}

cudaError_t quick_gelu_backward(const void* grad, const void* x, void* dx, int64_t n,
                                DType dtype, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, quick_gelu_backward_kernel<scalar_t>
                          <<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(
                              static_cast<const scalar_t*>(grad), static_cast<const scalar_t*>(x),
                              static_cast<scalar_t*>(dx), n));
  return cudaGetLastError();
}

}  // namespace fusedops
