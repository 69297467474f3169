// Torch binding of Adam / AdamW (adam.cu): a TORCH_LIBRARY_FRAGMENT of the fusedops_cuda library
// (library.cpp claims the namespace). Unwraps and checks the tensors that kernels/cuda/adam.py
// passes in, takes the current stream and calls the plain-CUDA launchers declared in adam.h.
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "adam.h"

namespace {

using fusedops::DType;

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// Adam / AdamW: one group of tensors (one device, one param dtype); layout in adam.h.
const float* adam_scalar(const std::optional<at::Tensor>& t, const char* name,
                         const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->is_cuda() && t->device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, name, " must be float32, got ",
                   t->scalar_type());
  TORCH_CHECK(t->numel() == 1, name, " must have one element, got ", t->numel());
  return static_cast<const float*>(t->const_data_ptr());
}

std::vector<void*> adam_pointers(at::TensorList list, const char* name, at::TensorList params,
                                 at::ScalarType dtype) {
  TORCH_CHECK(list.size() == params.size(), name, " has ", list.size(), " tensors, expected ",
              params.size());
  std::vector<void*> pointers;
  pointers.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    const at::Tensor& p = params[i];
    TORCH_CHECK(t.is_cuda() && t.device() == params[0].device(), name, "[", i, "] is on ",
                t.device(), ", expected ", params[0].device());
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, "[", i, "] has dtype ", t.scalar_type(),
                     ", expected ", dtype);
    TORCH_CHECK(t.numel() == p.numel(), name, "[", i, "] has ", t.numel(), " elements, expected ",
                p.numel());  // zero-size tensors are skipped by the launcher
    TORCH_CHECK((t.is_contiguous() && p.is_contiguous()) ||
                    (t.sizes() == p.sizes() && t.strides() == p.strides() &&
                     t.is_non_overlapping_and_dense()),
                name, "[", i, "] must be one dense block laid out like params[", i, "]");
    pointers.push_back(t.data_ptr());
  }
  return pointers;
}

void adam_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
               at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
               at::TensorList masters, at::TensorList steps,
               const std::optional<at::Tensor>& lr_tensor, double lr, double beta1, double beta2,
               double eps, double weight_decay, bool amsgrad, bool maximize, bool decoupled,
               const std::optional<at::Tensor>& grad_scale,
               const std::optional<at::Tensor>& found_inf,
               const std::optional<at::Tensor>& clip_coef, int64_t chunk_size) {
  if (params.empty()) return;
  const at::Tensor& first = params[0];
  const at::ScalarType param_type = first.scalar_type();
  const DType param_dtype = dtype_of(first, "params");
  const bool master = !masters.empty();
  const at::ScalarType state_type = master ? at::kFloat : param_type;
  TORCH_CHECK(chunk_size > 0, "chunk_size must be positive, got ", chunk_size);
  std::vector<void*> param_ptrs = adam_pointers(params, "params", params, param_type);
  std::vector<void*> grad_ptrs = adam_pointers(grads, "grads", params, param_type);
  std::vector<void*> exp_avg_ptrs = adam_pointers(exp_avgs, "exp_avgs", params, state_type);
  std::vector<void*> exp_avg_sq_ptrs =
      adam_pointers(exp_avg_sqs, "exp_avg_sqs", params, state_type);
  std::vector<void*> max_ptrs;
  if (amsgrad) max_ptrs = adam_pointers(max_exp_avg_sqs, "max_exp_avg_sqs", params, state_type);
  std::vector<float*> master_ptrs;
  if (master) {
    for (void* p : adam_pointers(masters, "masters", params, at::kFloat)) {
      master_ptrs.push_back(static_cast<float*>(p));
    }
  }
  TORCH_CHECK(steps.size() == params.size(), "steps has ", steps.size(), " tensors, expected ",
              params.size());
  std::vector<const float*> step_ptrs;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < params.size(); ++i) {
    step_ptrs.push_back(adam_scalar(steps[i], "steps[i]", first));
    sizes.push_back(params[i].numel());
  }
  fusedops::AdamOptions options{};
  options.lr = static_cast<float>(lr);
  options.lr_ptr = adam_scalar(lr_tensor, "lr_tensor", first);
  options.beta1 = static_cast<float>(beta1);
  options.beta2 = static_cast<float>(beta2);
  options.eps = static_cast<float>(eps);
  options.weight_decay = static_cast<float>(weight_decay);
  options.amsgrad = amsgrad;
  options.maximize = maximize;
  options.decoupled = decoupled;
  options.grad_scale = adam_scalar(grad_scale, "grad_scale", first);
  options.found_inf = adam_scalar(found_inf, "found_inf", first);
  options.clip_coef = adam_scalar(clip_coef, "clip_coef", first);
  c10::cuda::CUDAGuard guard(first.device());
  check_launch(fusedops::adam_multi_tensor(
                   static_cast<int64_t>(params.size()), param_ptrs.data(), grad_ptrs.data(),
                   exp_avg_ptrs.data(), exp_avg_sq_ptrs.data(),
                   amsgrad ? max_ptrs.data() : nullptr, master ? master_ptrs.data() : nullptr,
                   step_ptrs.data(), sizes.data(), param_dtype,
                   master ? DType::kFloat32 : param_dtype, options, chunk_size, current_stream()),
               "adam_step");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "adam_step(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, "
      "Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs, Tensor(f!)[] masters, "
      "Tensor(g!)[] steps, Tensor? lr_tensor, float lr, float beta1, float beta2, float eps, "
      "float weight_decay, bool amsgrad, bool maximize, bool decoupled, Tensor? grad_scale, "
      "Tensor? found_inf, Tensor? clip_coef, int chunk_size) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("adam_step", &adam_step);
}
