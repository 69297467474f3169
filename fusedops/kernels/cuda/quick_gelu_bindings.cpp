// Torch binding of QuickGELU (quick_gelu.cu): a TORCH_LIBRARY_FRAGMENT of the fusedops_cuda library
// (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/quick_gelu.py passes in, takes the current stream and calls the plain-CUDA launchers
// declared in quick_gelu.h.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "quick_gelu.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

void quick_gelu_forward(const at::Tensor& x, at::Tensor& y) {
  check_input(x, "x", x);
  check_input(y, "y", x);
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(fusedops::quick_gelu_forward(x.const_data_ptr(), y.data_ptr(), x.numel(),
                                            dtype_of(x, "x"), current_stream()),
               "quick_gelu_forward");
}

void quick_gelu_backward(const at::Tensor& grad, const at::Tensor& x, at::Tensor& dx) {
  check_input(x, "x", x);
  check_input(grad, "grad", x);
  check_input(dx, "dx", x);
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(fusedops::quick_gelu_backward(grad.const_data_ptr(), x.const_data_ptr(),
                                             dx.data_ptr(), x.numel(), dtype_of(x, "x"),
                                             current_stream()),
               "quick_gelu_backward");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def("quick_gelu_forward(Tensor x, Tensor(a!) y) -> ()");
  m.def("quick_gelu_backward(Tensor grad, Tensor x, Tensor(a!) dx) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("quick_gelu_forward", &quick_gelu_forward);
  m.impl("quick_gelu_backward", &quick_gelu_backward);
}
