// The one TORCH_LIBRARY registration of the CUDA launchers: unwraps tensors, checks them,
// takes the current stream and calls the plain-CUDA launchers declared in launchers.h.
// Outputs are allocated by the Python side (kernels/cuda/<op>.py) and passed in.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "launchers.h"

namespace {

using fusedops::DType;

DType dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, name, " has dtype ", t.scalar_type(),
                       "; the CUDA kernels take float32, float16 and bfloat16");
  }
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
  TORCH_CHECK(t.numel() == like.numel(), name, " has ", t.numel(), " elements, expected ",
              like.numel());
  TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
                   ", expected ", like.scalar_type());
}

void check_launch(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "fusedops CUDA launch failed in ", what, ": ",
              cudaGetErrorString(status));
}

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

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

TORCH_LIBRARY(fusedops_cuda, m) {
  m.def("quick_gelu_forward(Tensor x, Tensor(a!) y) -> ()");
  m.def("quick_gelu_backward(Tensor grad, Tensor x, Tensor(a!) dx) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("quick_gelu_forward", &quick_gelu_forward);
  m.impl("quick_gelu_backward", &quick_gelu_backward);
}
