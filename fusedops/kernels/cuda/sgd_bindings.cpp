// Torch binding of SGD (sgd.cu): a TORCH_LIBRARY_FRAGMENT of the fusedops_cuda library
// (library.cpp claims the namespace). Unwraps and checks the tensors that kernels/cuda/sgd.py
// passes in, takes the current stream and calls the plain-CUDA launcher declared in sgd.h.
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "sgd.h"

namespace {

using fusedops::DType;

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// A float32 device scalar (null when absent) on like's device.
const float* sgd_scalar(const std::optional<at::Tensor>& t, const char* name,
                        const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->is_cuda() && t->device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, name, " must be float32, got ",
                   t->scalar_type());
  TORCH_CHECK(t->numel() == 1, name, " must have one element, got ", t->numel());
  return static_cast<const float*>(t->const_data_ptr());
}

// The data pointers of list, each tensor on params' device in `dtype`, elementwise aligned with
// its param (one dense block laid out like it).
std::vector<void*> sgd_pointers(at::TensorList list, const char* name, at::TensorList params,
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

// SGD: one group of tensors (one device, one param dtype); layout in sgd.h. momentum_buffers and
// firsts are empty when momentum is 0, masters empty without master weights, firsts empty when
// no buffer is at its first step.
void sgd_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
              at::TensorList masters, at::TensorList firsts,
              const std::optional<at::Tensor>& lr_tensor, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov, bool maximize,
              const std::optional<at::Tensor>& grad_scale,
              const std::optional<at::Tensor>& found_inf, int64_t chunk_size) {
  if (params.empty()) return;
  const at::Tensor& first_param = params[0];
  const at::ScalarType param_type = first_param.scalar_type();
  const DType param_dtype = dtype_of(first_param, "params");
  const bool master = !masters.empty();
  const bool has_momentum = momentum != 0.0;
  const at::ScalarType state_type = master ? at::kFloat : param_type;
  TORCH_CHECK(chunk_size > 0, "chunk_size must be positive, got ", chunk_size);
  std::vector<void*> param_ptrs = sgd_pointers(params, "params", params, param_type);
  std::vector<void*> grad_ptrs = sgd_pointers(grads, "grads", params, param_type);
  std::vector<void*> buffer_ptrs;
  if (has_momentum) {
    buffer_ptrs = sgd_pointers(momentum_buffers, "momentum_buffers", params, state_type);
  }
  std::vector<float*> master_ptrs;
  if (master) {
    for (void* p : sgd_pointers(masters, "masters", params, at::kFloat)) {
      master_ptrs.push_back(static_cast<float*>(p));
    }
  }
  std::vector<const float*> first_ptrs;
  if (has_momentum && !firsts.empty()) {
    TORCH_CHECK(firsts.size() == params.size(), "firsts has ", firsts.size(),
                " tensors, expected ", params.size());
    for (size_t i = 0; i < firsts.size(); ++i) {
      first_ptrs.push_back(sgd_scalar(firsts[i], "firsts[i]", first_param));
    }
  }
  std::vector<int64_t> sizes;
  sizes.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) sizes.push_back(params[i].numel());
  fusedops::SgdOptions options{};
  options.lr = static_cast<float>(lr);
  options.lr_ptr = sgd_scalar(lr_tensor, "lr_tensor", first_param);
  options.momentum = static_cast<float>(momentum);
  options.dampening = static_cast<float>(dampening);
  options.weight_decay = static_cast<float>(weight_decay);
  options.nesterov = nesterov;
  options.maximize = maximize;
  options.grad_scale = sgd_scalar(grad_scale, "grad_scale", first_param);
  options.found_inf = sgd_scalar(found_inf, "found_inf", first_param);
  c10::cuda::CUDAGuard guard(first_param.device());
  check_launch(fusedops::sgd_multi_tensor(
                   static_cast<int64_t>(params.size()), param_ptrs.data(), grad_ptrs.data(),
                   has_momentum ? buffer_ptrs.data() : nullptr,
                   master ? master_ptrs.data() : nullptr,
                   first_ptrs.empty() ? nullptr : first_ptrs.data(), sizes.data(), param_dtype,
                   master ? DType::kFloat32 : param_dtype, options, chunk_size, current_stream()),
               "sgd_step");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "sgd_step(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] momentum_buffers, "
      "Tensor(d!)[] masters, Tensor[] firsts, Tensor? lr_tensor, float lr, float momentum, "
      "float dampening, float weight_decay, bool nesterov, bool maximize, Tensor? grad_scale, "
      "Tensor? found_inf, int chunk_size) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("sgd_step", &sgd_step);
}
