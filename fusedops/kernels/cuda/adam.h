// The launchers of Adam / AdamW (adam.cu), declared for adam.cu (nvcc) and adam_bindings.cpp (host
// compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// Adam / AdamW multi-tensor apply (adam.cu). Host arrays of n device pointers, per tensor i:
// params[i], grads[i] (param_dtype), exp_avgs[i], exp_avg_sqs[i] and, when options.amsgrad,
// max_exp_avg_sqs[i] (state_dtype: param_dtype, or float32 with master weights), masters[i]
// (float32; masters == nullptr: no master weights), steps[i] (float32 device scalar, already
// incremented), sizes[i] >= 0 elements (0: skipped), each tensor one dense block laid out like
// its param.
struct AdamOptions {
  float lr;               // used when lr_ptr is null
  const float* lr_ptr;    // float32 device scalar, or null
  float beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;  // decoupled: AdamW's weight decay
  const float* grad_scale;  // float32 device scalar or null: grads are divided by it (stored)
  const float* found_inf;   // float32 device scalar or null: nonzero -> nothing is written
  const float* clip_coef;   // float32 device scalar or null: the unscaled grad is multiplied by
                            // it in the update (gradient clipping; the stored grad is not)
};
cudaError_t adam_multi_tensor(int64_t n, void* const* params, void* const* grads,
                              void* const* exp_avgs, void* const* exp_avg_sqs,
                              void* const* max_exp_avg_sqs, float* const* masters,
                              const float* const* steps, const int64_t* sizes, DType param_dtype,
                              DType state_dtype, const AdamOptions& options, int64_t chunk_size,
                              cudaStream_t stream);

}  // namespace fusedops
