// The launchers of LayerNorm / RMSNorm (layer_norm.cu), declared for layer_norm.cu (nvcc) and
// layer_norm_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// RMSNorm as model libraries write it (transformers' LlamaRMSNorm, T5LayerNorm): xhat rounded
// to xhat_dtype (float16/bfloat16; float32: not rounded) before the weight multiply, and y
// (forward) / dy (backward) in float32 instead of x's dtype when out_fp32. The default is plain
// LayerNorm / RMSNorm.
struct NormVariant {
  bool out_fp32 = false;
  DType xhat_dtype = DType::kFloat32;
  // Register path: 16-byte loads and stores where rows allow them (layer_norm.cu, vector_width).
  bool vector_access = false;
};

// LayerNorm / RMSNorm (rms) over rows of `cols` elements; x, y, dy, dx contiguous (rows, cols)
// of `dtype` (y, dy: float32 with variant.out_fp32); weight, bias (cols) of param_dtype (float32
// or `dtype`) or null; mean (rows, LayerNorm only; null for RMSNorm) and rstd (rows) fp32. Rows
// up to min(max_register_cols, 8192) are held in registers.
cudaError_t layer_norm_forward(const void* x, const void* weight, const void* bias,
                               DType param_dtype, void* y, float* mean, float* rstd,
                               int64_t rows, int64_t cols, float eps, bool rms,
                               NormVariant variant, int64_t max_register_cols, DType dtype,
                               cudaStream_t stream);
// dx, and dweight/dbias (param_dtype, cols; null when not wanted) summed in fp32 in a fixed order
// from partial_rows (1..min(rows, 65535)) fp32 partial rows (dw_partial/db_partial,
// (partial_rows, cols), null exactly when dweight/dbias is). coeffs: (2, rows) fp32 workspace
// for long rows (exactly when layer_norm_backward_needs_coeffs; may be null otherwise).
bool layer_norm_backward_needs_coeffs(int64_t cols, int64_t max_register_cols);
cudaError_t layer_norm_backward(const void* dy, const void* x, const void* weight,
                                DType param_dtype, const float* mean, const float* rstd,
                                void* dx, float* dw_partial, float* db_partial,
                                int64_t partial_rows, void* dweight, void* dbias, float* coeffs,
                                int64_t rows, int64_t cols, bool rms, NormVariant variant,
                                int64_t max_register_cols, DType dtype, cudaStream_t stream);

}  // namespace fusedops
