// The launchers of window attention's softmax (window_attention.cu), declared for
// window_attention.cu (nvcc) and window_attention_bindings.cpp (host compiler): plain CUDA runtime
// types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// Window attention's softmax around cuBLAS products (window_attention.cu). scores, dprobs:
// fp32 (batch, heads, n, n) contiguous, n <= 256; bias (heads, n, n) and mask (windows, n, n)
// fp32 or null (window z uses mask[z % windows]); lse fp32 (batch, heads, n); probs and dscores
// (batch, heads, n, n) of `dtype`. Forward: probs = softmax(scores * scale + bias + mask), lse
// (+inf for a fully masked row, whose probs are 0). Backward: probs = exp(logits - lse),
// dscores = probs * (dprobs - rowsum(probs * dprobs)) * scale and, unless dbias_partial is
// null, dbias_partial (groups, heads, n, n) fp32: partial g sums the unscaled dS of windows
// g, g + groups, ... (1 <= groups <= batch).
cudaError_t window_attention_softmax_forward(const float* scores, const float* bias,
                                             const float* mask, void* probs, float* lse,
                                             int64_t batch, int64_t heads, int64_t n,
                                             int64_t windows, float scale, DType dtype,
                                             cudaStream_t stream);
cudaError_t window_attention_softmax_backward(const float* scores, const float* dprobs,
                                              const float* bias, const float* mask,
                                              const float* lse, void* probs, void* dscores,
                                              float* dbias_partial, int64_t groups,
                                              int64_t batch, int64_t heads, int64_t n,
                                              int64_t windows, float scale, DType dtype,
                                              cudaStream_t stream);

}  // namespace fusedops
