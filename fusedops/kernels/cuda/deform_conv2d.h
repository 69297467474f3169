// The launchers of deform_conv2d (deform_conv2d.cu), declared for deform_conv2d.cu (nvcc) and
// deform_conv2d_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

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
