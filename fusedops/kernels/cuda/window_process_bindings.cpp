// Torch binding of the Swin window gathers (window_process.cu): a TORCH_LIBRARY_FRAGMENT of the
// fusedops_cuda library (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/window_process.py passes in, takes the current stream and calls the plain-CUDA
// launchers declared in window_process.h.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "window_process.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// Swin window gathers (window_process.cu): src and dst contiguous, same dtype, device and
// numel; the (B, H, W, C) map is dst when reverse, else src; the windows are the other one.
void window_gather(const at::Tensor& src, at::Tensor& dst, int64_t height, int64_t width,
                   int64_t window_h, int64_t window_w, int64_t shift_h, int64_t shift_w,
                   bool reverse) {
  check_input(src, "src", src);
  check_input(dst, "dst", src);
  const at::Tensor& map = reverse ? dst : src;
  const at::Tensor& windows = reverse ? src : dst;
  TORCH_CHECK(map.dim() == 4 && windows.dim() == 4, "window_gather takes 4-D tensors");
  TORCH_CHECK(map.size(1) == height && map.size(2) == width, "the map is ", map.sizes(),
              ", expected (B, ", height, ", ", width, ", C)");
  TORCH_CHECK(windows.size(1) == window_h && windows.size(2) == window_w &&
                  windows.size(3) == map.size(3),
              "the windows are ", windows.sizes(), ", expected (B*nW, ", window_h, ", ",
              window_w, ", ", map.size(3), ")");
  c10::cuda::CUDAGuard guard(src.device());
  check_launch(fusedops::window_gather(src.const_data_ptr(), dst.data_ptr(), map.size(0), height,
                                       width, map.size(3), window_h, window_w, shift_h, shift_w,
                                       reverse, dtype_of(src, "src"), current_stream()),
               "window_gather");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "window_gather(Tensor src, Tensor(a!) dst, int height, int width, int window_h, "
      "int window_w, int shift_h, int shift_w, bool reverse) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("window_gather", &window_gather);
}
