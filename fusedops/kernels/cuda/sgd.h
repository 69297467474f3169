// The launcher of SGD (sgd.cu), declared for sgd.cu (nvcc) and sgd_bindings.cpp (host
// compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// SGD multi-tensor apply (sgd.cu). Host arrays of n device pointers, per tensor i: params[i],
// grads[i] (param_dtype), momentum_buffers[i] (state_dtype: param_dtype, or float32 with master
// weights; momentum_buffers == nullptr when momentum is 0), masters[i] (float32; masters ==
// nullptr: no master weights), firsts[i] (float32 device scalar, nonzero: the buffer's first
// step, b = g; firsts == nullptr: no buffer is at its first step), sizes[i] >= 0 elements (0:
// skipped), each tensor one dense block laid out like its param.
struct SgdOptions {
  float lr;             // used when lr_ptr is null
  const float* lr_ptr;  // float32 device scalar, or null
  float momentum, dampening, weight_decay;
  bool nesterov, maximize;
  const float* grad_scale;  // float32 device scalar or null: grads are divided by it (stored)
  const float* found_inf;   // float32 device scalar or null: nonzero -> nothing is written
};
cudaError_t sgd_multi_tensor(int64_t n, void* const* params, void* const* grads,
                             void* const* momentum_buffers, float* const* masters,
                             const float* const* firsts, const int64_t* sizes, DType param_dtype,
                             DType state_dtype, const SgdOptions& options, int64_t chunk_size,
                             cudaStream_t stream);

}  // namespace fusedops
