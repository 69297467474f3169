// Host-side declarations of every CUDA launcher. Plain CUDA runtime types only (no torch),
// so bindings.cpp (host compiler) and each <op>.cu (nvcc) share them.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace fusedops {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// QuickGELU: y = x * sigmoid(1.702 x); dx = dy * (s + 1.702 x s (1 - s)). n elements, contiguous.
cudaError_t quick_gelu_forward(const void* x, void* y, int64_t n, DType dtype,
                               cudaStream_t stream);
cudaError_t quick_gelu_backward(const void* grad, const void* x, void* dx, int64_t n,
                                DType dtype, cudaStream_t stream);

}  // namespace fusedops
