// Torch binding of the Swin attention softmax (swin_softmax.cu): a TORCH_LIBRARY_FRAGMENT of the
// fusedops_cuda library (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/swin_softmax.py passes in, takes the current stream and calls the plain-CUDA
// launchers declared in swin_softmax.h.
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "swin_softmax.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// Swin attention softmax (swin_softmax.cu): attn/grad/probs and the outputs contiguous
// (windows, heads, n, n); bias (heads, n, n) and mask (nW, n, n) contiguous fp32 on attn's device.
void check_float32(const at::Tensor& t, const char* name, const at::Tensor& like,
                   at::IntArrayRef shape) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, name, " has shape ", t.sizes(), ", expected ", shape);
}

void swin_softmax_forward(const at::Tensor& attn, const at::Tensor& bias,
                          const std::optional<at::Tensor>& mask, at::Tensor& out) {
  TORCH_CHECK(attn.dim() == 4 && attn.size(2) == attn.size(3), "attn must be (B*nW, heads, N, N)");
  check_input(attn, "attn", attn);
  check_input(out, "out", attn);
  const int64_t heads = attn.size(1);
  const int64_t n = attn.size(3);
  check_float32(bias, "bias", attn, {heads, n, n});
  int64_t mask_windows = 1;
  if (mask.has_value()) {
    mask_windows = mask->size(0);
    check_float32(*mask, "mask", attn, {mask_windows, n, n});
    TORCH_CHECK(mask_windows > 0 && attn.size(0) % mask_windows == 0, "attn's ", attn.size(0),
                " windows are not a multiple of the mask's ", mask_windows);
  }
  c10::cuda::CUDAGuard guard(attn.device());
  check_launch(fusedops::swin_softmax_forward(
                   attn.const_data_ptr(), bias.const_data_ptr<float>(),
                   mask.has_value() ? mask->const_data_ptr<float>() : nullptr, out.data_ptr(),
                   attn.size(0), mask_windows, heads, n, dtype_of(attn, "attn"),
                   current_stream()),
               "swin_softmax_forward");
}

void swin_softmax_backward(const at::Tensor& grad, const at::Tensor& probs, at::Tensor& d_attn,
                           at::Tensor& partial) {
  TORCH_CHECK(probs.dim() == 4 && probs.size(2) == probs.size(3),
              "probs must be (B*nW, heads, N, N)");
  check_input(probs, "probs", probs);
  check_input(grad, "grad", probs);
  check_input(d_attn, "d_attn", probs);
  const int64_t heads = probs.size(1);
  const int64_t n = probs.size(3);
  TORCH_CHECK(partial.dim() == 4, "partial must be (chunks, heads, N, N)");
  check_float32(partial, "partial", probs, {partial.size(0), heads, n, n});
  c10::cuda::CUDAGuard guard(probs.device());
  check_launch(fusedops::swin_softmax_backward(grad.const_data_ptr(), probs.const_data_ptr(),
                                               d_attn.data_ptr(), partial.data_ptr<float>(),
                                               probs.size(0), heads, n, partial.size(0),
                                               dtype_of(probs, "probs"), current_stream()),
               "swin_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def("swin_softmax_forward(Tensor attn, Tensor bias, Tensor? mask, Tensor(a!) out) -> ()");
  m.def(
      "swin_softmax_backward(Tensor grad, Tensor probs, Tensor(a!) d_attn, Tensor(b!) partial) "
      "-> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("swin_softmax_forward", &swin_softmax_forward);
  m.impl("swin_softmax_backward", &swin_softmax_backward);
}
