// The launchers of the Swin window gathers (window_process.cu), declared for window_process.cu
// (nvcc) and window_process_bindings.cpp (host compiler): plain CUDA runtime types only, no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace fusedops {

// Swin window gathers (window_process.cu). reverse == false: src is a contiguous (B, H, W, C)
// map, dst receives roll(src, (shift_h, shift_w)) cut into (B*nW, window_h, window_w, C)
// windows; reverse == true: src holds the windows, dst receives the (B, H, W, C) map they form,
// rolled by (shift_h, shift_w). H, W multiples of the window; 0 <= shift_h < H, 0 <= shift_w < W.
cudaError_t window_gather(const void* src, void* dst, int64_t batch, int64_t height,
                          int64_t width, int64_t channels, int64_t window_h, int64_t window_w,
                          int64_t shift_h, int64_t shift_w, bool reverse, DType dtype,
                          cudaStream_t stream);

}  // namespace fusedops
