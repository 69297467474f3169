// The launchers of NMS and soft-NMS (nms.cu), declared for nms.cu (nvcc) and nms_bindings.cpp (host
// compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

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
