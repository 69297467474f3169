// The launchers of the Swin attention softmax (swin_softmax.cu), declared for swin_softmax.cu
// (nvcc) and swin_softmax_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// Swin attention softmax (swin_softmax.cu), 1 <= n <= 1024. attn, out: contiguous
// (windows, heads, n, n) of dtype; bias: (heads, n, n) fp32; mask: (mask_windows, n, n) fp32 or
// null, window w using mask[w % mask_windows]. out = softmax(attn + bias + mask) per row, a fully
// -inf row giving zeros.
cudaError_t swin_softmax_forward(const void* attn, const float* bias, const float* mask,
                                 void* out, int64_t windows, int64_t mask_windows, int64_t heads,
                                 int64_t n, DType dtype, cudaStream_t stream);
// grad, probs, d_attn: (windows, heads, n, n) of dtype; d_attn = probs * (grad - rowsum(grad *
// probs)); partial: (chunks, heads, n, n) fp32, chunk c holding the sum of d_attn's fp32 values
// over windows [c * per, min((c + 1) * per, windows)), per = ceil(windows / chunks);
// 1 <= chunks <= min(windows, 65535).
cudaError_t swin_softmax_backward(const void* grad, const void* probs, void* d_attn,
                                  float* partial, int64_t windows, int64_t heads, int64_t n,
                                  int64_t chunks, DType dtype, cudaStream_t stream);

}  // namespace fusedops
