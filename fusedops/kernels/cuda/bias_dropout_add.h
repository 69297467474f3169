// The launchers of bias-dropout-add (bias_dropout_add.cu), declared for bias_dropout_add.cu (nvcc)
// and bias_dropout_add_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// Bias-dropout-add (bias_dropout_add.cu). Element i of a call is kept iff word i % 4 of
// Philox4x32-10 counter (seed[1] + i / 4) under key seed[0] is >= threshold (mode kRandom; seed:
// int64[2] in device memory), or always (kKeep) / never (kDrop); kept values are scaled by scale.
enum class DropoutMode : int { kKeep = 0, kRandom = 1, kDrop = 2 };
struct DropoutParams {
  const int64_t* seed;  // device [key, offset]; read only in kRandom mode (may be null otherwise)
  int64_t threshold;    // in [0, 2^32]
  float scale;          // 1 / (1 - p)
  DropoutMode mode;
};
// out = residual + dropout(src + bias[i % cols]): src (n) of src_dtype, bias (cols, fp32) or
// null, residual (n, out_dtype) or null, out (n, out_dtype); all contiguous.
cudaError_t bias_dropout_add_forward(const void* src, DType src_dtype, const float* bias,
                                     int64_t cols, const void* residual, void* out,
                                     DType out_dtype, int64_t n, const DropoutParams& params,
                                     cudaStream_t stream);
// grad_x = dropout(grad) over (rows, cols) (grad of grad_dtype, grad_x of x_dtype, contiguous);
// grad_bias (cols, fp32) = its column sums: fp32 partial sums of `groups` (1..65535) row
// groups in partial (groups, cols), then added in a fixed order.
cudaError_t bias_dropout_add_backward(const void* grad, DType grad_dtype, void* grad_x,
                                      DType x_dtype, float* partial, float* grad_bias,
                                      int64_t groups, int64_t rows, int64_t cols,
                                      const DropoutParams& params, cudaStream_t stream);

}  // namespace fusedops
