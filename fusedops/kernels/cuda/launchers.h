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

// LayerNorm / RMSNorm (rms) over rows of `cols` elements; x, y, dy, dx contiguous (rows, cols)
// of `dtype`; weight, bias (cols) of param_dtype (float32 or `dtype`) or null; mean (rows,
// LayerNorm only; null for RMSNorm) and rstd (rows) fp32. Rows up to min(max_register_cols,
// 8192) are held in registers.
cudaError_t layer_norm_forward(const void* x, const void* weight, const void* bias,
                               DType param_dtype, void* y, float* mean, float* rstd,
                               int64_t rows, int64_t cols, float eps, bool rms,
                               int64_t max_register_cols, DType dtype, cudaStream_t stream);
// dx, and dweight/dbias (param_dtype, cols; null when not wanted) summed in fp32 in a fixed order
// from partial_rows (1..min(rows, 65535)) fp32 partial rows (dw_partial/db_partial,
// (partial_rows, cols), null exactly when dweight/dbias is). coeffs: (2, rows) fp32 workspace
// for long rows (exactly when layer_norm_backward_needs_coeffs; may be null otherwise).
bool layer_norm_backward_needs_coeffs(int64_t cols, int64_t max_register_cols);
cudaError_t layer_norm_backward(const void* dy, const void* x, const void* weight,
                                DType param_dtype, const float* mean, const float* rstd,
                                void* dx, float* dw_partial, float* db_partial,
                                int64_t partial_rows, void* dweight, void* dbias, float* coeffs,
                                int64_t rows, int64_t cols, bool rms, int64_t max_register_cols,
                                DType dtype, cudaStream_t stream);

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
};
cudaError_t adam_multi_tensor(int64_t n, void* const* params, void* const* grads,
                              void* const* exp_avgs, void* const* exp_avg_sqs,
                              void* const* max_exp_avg_sqs, float* const* masters,
                              const float* const* steps, const int64_t* sizes, DType param_dtype,
                              DType state_dtype, const AdamOptions& options, int64_t chunk_size,
                              cudaStream_t stream);

// NMS (nms.cu). boxes (n, 4) contiguous of `dtype` in processing order; classes int64 (n),
// grouped by class, and col_end int64 (ceil(n / 64)): per 64-box row block, the first column
// block of later classes (both null without classes); mask: n * ceil(n / 64) words of
// workspace. positions (n) int64: the kept positions in order, then n; count: int64 scalar.
cudaError_t nms_walk(const void* boxes, const int64_t* classes, const int64_t* col_end,
                     uint64_t* mask, int64_t n, float iou_threshold, float offset,
                     int64_t* positions, int64_t* count, DType dtype, cudaStream_t stream);

// soft-NMS (nms.cu), one block per segment [seg_starts[s], seg_starts[s + 1]) of boxes (n, 4)
// of `dtype` with fp32 scores (n); longest: the longest segment. Segments of more than
// soft_nms_shared_items(device) boxes work in `workspace` (7 * n floats; may be null
// otherwise). positions (n) int64 / picked (n) fp32: each segment's picks in pick order from
// its start, then n / 0; counts (segments) int64.
struct SoftNmsOptions {
  float iou_threshold, sigma, min_score, offset;
  int method;  // 0 naive, 1 linear, 2 gaussian
};
int64_t soft_nms_shared_items(int device);
cudaError_t soft_nms_segments(const void* boxes, const float* scores, const int64_t* seg_starts,
                              int64_t n_segments, int64_t n, int64_t longest, float* workspace,
                              int64_t* positions, float* picked, int64_t* counts,
                              const SoftNmsOptions& options, DType dtype, cudaStream_t stream);

}  // namespace fusedops
