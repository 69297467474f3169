// Torch binding of bias-dropout-add (bias_dropout_add.cu): a TORCH_LIBRARY_FRAGMENT of the
// fusedops_cuda library (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/bias_dropout_add.py passes in, takes the current stream and calls the plain-CUDA
// launchers declared in bias_dropout_add.h.
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "bias_dropout_add.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// Bias-dropout-add: tensors contiguous on one CUDA device; src/out (forward) and grad/grad_x
// (backward) hold the same number of elements, each in its own dtype (the dtypes may differ).
void check_elements(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.numel() == like.numel(), name, " has ", t.numel(), " elements, expected ",
              like.numel());
}

fusedops::DropoutParams dropout_params(const std::optional<at::Tensor>& seed, int64_t threshold,
                                       double scale, int64_t mode, const at::Tensor& like) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "mode must be 0 (keep), 1 (random) or 2 (drop), got ",
              mode);
  TORCH_CHECK(threshold >= 0 && threshold <= (int64_t{1} << 32), "threshold ", threshold,
              " is outside [0, 2^32]");
  const int64_t* seed_ptr = nullptr;
  if (seed.has_value()) {
    TORCH_CHECK(seed->is_cuda() && seed->device() == like.device(), "seed must be on ",
                like.device());
    TORCH_CHECK_TYPE(seed->scalar_type() == at::kLong, "seed must be int64, got ",
                     seed->scalar_type());
    TORCH_CHECK(seed->is_contiguous() && seed->numel() == 2, "seed must be 2 contiguous values");
    seed_ptr = seed->const_data_ptr<int64_t>();
  }
  const auto dropout_mode = static_cast<fusedops::DropoutMode>(mode);
  TORCH_CHECK(dropout_mode != fusedops::DropoutMode::kRandom || seed_ptr != nullptr,
              "a random dropout mask needs a seed");
  return {seed_ptr, threshold, static_cast<float>(scale), dropout_mode};
}

// out = residual + dropout(src + bias) (src: x, or grad with neither bias nor residual).
void bias_dropout_add_forward(const at::Tensor& src, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, at::Tensor& out,
                              const std::optional<at::Tensor>& seed, int64_t threshold,
                              double scale, int64_t mode) {
  check_elements(src, "src", out);
  check_elements(out, "out", out);
  if (residual.has_value()) check_input(*residual, "residual", out);
  const int64_t cols = bias.has_value() ? bias->numel() : 1;
  const float* bias_ptr = float_ptr(bias, "bias", cols, out);
  // a zero-width bias goes with an empty src (the launcher returns before any launch)
  TORCH_CHECK(!bias.has_value() || (cols > 0 ? src.numel() % cols == 0 : src.numel() == 0),
              "bias has ", cols, " elements, not a divisor of src's ", src.numel());
  const auto params = dropout_params(seed, threshold, scale, mode, out);
  c10::cuda::CUDAGuard guard(out.device());
  check_launch(fusedops::bias_dropout_add_forward(
                   src.const_data_ptr(), dtype_of(src, "src"), bias_ptr, cols,
                   residual.has_value() ? residual->const_data_ptr() : nullptr, out.data_ptr(),
                   dtype_of(out, "out"), src.numel(), params, current_stream()),
               "bias_dropout_add_forward");
}

// grad_x = dropout(grad) over grad viewed as (rows, cols = grad_bias.numel()); grad_bias = its
// column sums through partial (groups, cols) fp32.
void bias_dropout_add_backward(const at::Tensor& grad, at::Tensor& grad_x, at::Tensor& partial,
                               at::Tensor& grad_bias, const std::optional<at::Tensor>& seed,
                               int64_t threshold, double scale, int64_t mode) {
  check_elements(grad, "grad", grad_x);
  check_elements(grad_x, "grad_x", grad_x);
  const int64_t cols = grad_bias.numel();
  float* grad_bias_ptr = float_ptr(grad_bias, "grad_bias", cols, grad_x);
  TORCH_CHECK(partial.dim() == 2 && partial.size(1) == cols, "partial must be (groups, ", cols,
              ")");
  float* partial_ptr = float_ptr(partial, "partial", partial.numel(), grad_x);
  TORCH_CHECK(cols > 0 ? grad.numel() % cols == 0 : grad.numel() == 0, "grad_bias has ", cols,
              " elements, not a divisor of grad's ", grad.numel());
  const auto params = dropout_params(seed, threshold, scale, mode, grad_x);
  c10::cuda::CUDAGuard guard(grad_x.device());
  check_launch(fusedops::bias_dropout_add_backward(
                   grad.const_data_ptr(), dtype_of(grad, "grad"), grad_x.data_ptr(),
                   dtype_of(grad_x, "grad_x"), partial_ptr, grad_bias_ptr, partial.size(0),
                   cols > 0 ? grad.numel() / cols : 0, cols, params, current_stream()),
               "bias_dropout_add_backward");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "bias_dropout_add_forward(Tensor src, Tensor? bias, Tensor? residual, Tensor(a!) out, "
      "Tensor? seed, int threshold, float scale, int mode) -> ()");
  m.def(
      "bias_dropout_add_backward(Tensor grad, Tensor(a!) grad_x, Tensor(b!) partial, "
      "Tensor(c!) grad_bias, Tensor? seed, int threshold, float scale, int mode) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("bias_dropout_add_forward", &bias_dropout_add_forward);
  m.impl("bias_dropout_add_backward", &bias_dropout_add_backward);
}
