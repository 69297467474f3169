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

// Swin window gathers (window_process.cu). reverse == false: src is a contiguous (B, H, W, C)
// map, dst receives roll(src, (shift_h, shift_w)) cut into (B*nW, window_h, window_w, C)
// windows; reverse == true: src holds the windows, dst receives the (B, H, W, C) map they form,
// rolled by (shift_h, shift_w). H, W multiples of the window; 0 <= shift_h < H, 0 <= shift_w < W.
cudaError_t window_gather(const void* src, void* dst, int64_t batch, int64_t height,
                          int64_t width, int64_t channels, int64_t window_h, int64_t window_w,
                          int64_t shift_h, int64_t shift_w, bool reverse, DType dtype,
                          cudaStream_t stream);

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

// deform_conv2d (deform_conv2d.cu; the products around these kernels are the host's, in
// kernels/deform_conv2d_host.py). input (B, C, H, W), offset (B, 2 G K, H_out, W_out), mask
// (B, G K, H_out, W_out) or null, all contiguous of `dtype`, K = kh * kw; columns and
// grad_columns (C * K, B * H_out * W_out) of `dtype`, row c * K + k, column b * L + l.
struct DeformConvGeometry {
  int64_t batch, channels, height, width, offset_groups, kh, kw, h_out, w_out;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};
// columns = the masked bilinear samples.
cudaError_t deform_conv2d_columns(const void* input, const void* offset, const void* mask,
                                  void* columns, const DeformConvGeometry& geometry, DType dtype,
                                  cudaStream_t stream);
// grad_offset (like offset) and grad_mask (like mask; null exactly when mask is) of `dtype`,
// one thread per sample; then either grad_input (fp32, like input, zeroed by the caller) gets
// the input gradient by atomics, or (grad_input null) keys / coefs (int64 / fp32, 4 per sample:
// each corner's (b G + g) H W + pixel, B G H W when outside, and its coefficient).
cudaError_t deform_conv2d_sample_grads(const void* grad_columns, const void* input,
                                       const void* offset, const void* mask, void* grad_offset,
                                       void* grad_mask, float* grad_input, int64_t* keys,
                                       float* coefs, const DeformConvGeometry& geometry,
                                       DType dtype, cudaStream_t stream);
// Deterministic input gradient: order (4 B G K L) int64 stably sorts the keys; starts
// (B G H W + 1) int64 their segment bounds; grad_input (like input, `dtype`) element (b, c,
// pixel) = the fp32 sum, in sorted order, of coefs[entry] * grad_columns over its segment.
cudaError_t deform_conv2d_segment_gather(const void* grad_columns, const int64_t* order,
                                         const float* coefs, const int64_t* starts,
                                         void* grad_input, const DeformConvGeometry& geometry,
                                         DType dtype, cudaStream_t stream);

}  // namespace fusedops
