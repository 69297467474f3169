// The launchers of QuickGELU (quick_gelu.cu), declared for quick_gelu.cu (nvcc) and
// quick_gelu_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// QuickGELU: y = x * sigmoid(1.702 x); dx = dy * (s + 1.702 x s (1 - s)). n elements, contiguous.
cudaError_t quick_gelu_forward(const void* x, void* y, int64_t n, DType dtype,
                               cudaStream_t stream);
cudaError_t quick_gelu_backward(const void* grad, const void* x, void* dx, int64_t n,
                                DType dtype, cudaStream_t stream);

}  // namespace fusedops
