// The one TORCH_LIBRARY registration of the CUDA launchers: unwraps tensors, checks them,
// takes the current stream and calls the plain-CUDA launchers declared in launchers.h.
// Outputs are allocated by the Python side (kernels/cuda/<op>.py) and passed in, except for
// LayerNorm's, allocated here.
#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "bindings.h"
#include "launchers.h"

namespace {

using fusedops::DType;

using fusedops::binding::check_input;
using fusedops::binding::check_launch;
using fusedops::binding::check_sized;
using fusedops::binding::const_ptr;
using fusedops::binding::current_stream;
using fusedops::binding::dtype_of;

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

// LayerNorm / RMSNorm: x (rows, cols); parameters (cols) in fp32 or x's dtype; fp32 statistics.
// These two allocate their outputs here (one call from Python per direction: the host cost of
// a small LayerNorm is mostly per-call overhead). poison: fill them with NaN first (tests).
float* float_ptr(const std::optional<at::Tensor>& t, const char* name, int64_t numel,
                 const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->is_cuda() && t->device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, name, " must be float32, got ",
                   t->scalar_type());
  TORCH_CHECK(t->numel() == numel, name, " has ", t->numel(), " elements, expected ", numel);
  return static_cast<float*>(t->data_ptr());
}

// weight and bias: absent, or (cols) contiguous on x's device, one dtype for both: fp32 or x's.
DType param_dtype_of(const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, const at::Tensor& x) {
  at::ScalarType type = at::kFloat;
  bool seen = false;
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->has_value()) continue;
    const at::Tensor& p = t->value();
    TORCH_CHECK(p.is_cuda() && p.device() == x.device(), name, " must be on ", x.device());
    TORCH_CHECK(p.is_contiguous() && p.numel() == x.size(1), name, " must be ", x.size(1),
                " contiguous elements");
    TORCH_CHECK_TYPE(p.scalar_type() == at::kFloat || p.scalar_type() == x.scalar_type(), name,
                     " must be float32 or x's dtype ", x.scalar_type(), ", got ", p.scalar_type());
    TORCH_CHECK_TYPE(!seen || p.scalar_type() == type, "weight and bias must share a dtype");
    type = p.scalar_type();
    seen = true;
  }
  return type == at::kFloat ? DType::kFloat32 : dtype_of(x, "x");
}

at::Tensor new_output(at::IntArrayRef shape, const at::TensorOptions& options, bool poison) {
  at::Tensor t = at::empty(shape, options);
  if (poison) t.fill_(std::numeric_limits<double>::quiet_NaN());
  return t;
}

// Blocks of the backward = fp32 partial rows of the dweight/dbias reduction: two per SM.
int64_t backward_partial_rows(const at::Tensor& x) {
  static std::array<std::atomic<int>, 64> multiprocessors{};  // by device index; 0: unknown
  const int device = x.get_device();
  int sms = device < 64 ? multiprocessors[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    check_launch(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                 "cudaDeviceGetAttribute");
    if (device < 64) multiprocessors[device].store(sms, std::memory_order_relaxed);
  }
  return std::max<int64_t>(1, std::min<int64_t>({x.size(0), 2 * int64_t{sms}, 65535}));
}

// RMSNorm variants (launchers.h, NormVariant): y / dy in x's dtype or float32 (`out_type`), xhat
// rounded to xhat_dtype (absent or float32: not rounded; float16, bfloat16); vector_access:
// 16-byte accesses in the register path where the rows allow them.
fusedops::NormVariant norm_variant(const at::Tensor& x, at::ScalarType out_type, bool rms,
                                   const std::optional<at::ScalarType>& xhat_dtype,
                                   bool vector_access) {
  fusedops::NormVariant variant;
  variant.vector_access = vector_access;
  TORCH_CHECK_TYPE(out_type == x.scalar_type() || out_type == at::kFloat,
                   "y and dy must have x's dtype ", x.scalar_type(), " or float32, got ", out_type);
  variant.out_fp32 = out_type != x.scalar_type();
  if (xhat_dtype.has_value()) {
    TORCH_CHECK(rms || *xhat_dtype == at::kFloat, "xhat_dtype is for RMSNorm only");
    TORCH_CHECK_TYPE(*xhat_dtype == at::kFloat || *xhat_dtype == at::kHalf ||
                         *xhat_dtype == at::kBFloat16,
                     "xhat_dtype must be float32, float16 or bfloat16, got ", *xhat_dtype);
    variant.xhat_dtype = dtype_of(*xhat_dtype, "xhat_dtype");
  }
  return variant;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, bool rms, int64_t max_register_cols,
    bool poison, std::optional<at::ScalarType> out_dtype = std::nullopt,
    std::optional<at::ScalarType> xhat_dtype = std::nullopt, bool vector_access = false) {
  TORCH_CHECK(x.dim() == 2, "x must be 2-D (rows, cols), got ", x.dim(), " dims");
  check_input(x, "x", x);
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const DType param_dtype = param_dtype_of(weight, bias, x);
  const at::ScalarType out_type = out_dtype.value_or(x.scalar_type());
  const fusedops::NormVariant variant = norm_variant(x, out_type, rms, xhat_dtype, vector_access);
  const at::TensorOptions stats = x.options().dtype(at::kFloat);
  at::Tensor y = new_output(x.sizes(), x.options().dtype(out_type), poison);
  at::Tensor mean = new_output({rms ? 0 : rows}, stats, poison);
  at::Tensor rstd = new_output({rows}, stats, poison);
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(fusedops::layer_norm_forward(
                   x.const_data_ptr(), const_ptr(weight), const_ptr(bias), param_dtype,
                   y.data_ptr(), rms ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(),
                   rows, cols, static_cast<float>(eps), rms, variant, max_register_cols,
                   dtype_of(x, "x"), current_stream()),
               "layer_norm_forward");
  return {y, mean, rstd};
}

// Returns dx, dweight (undefined without weight), dbias (undefined without bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& mean,
    const at::Tensor& rstd, bool rms, int64_t max_register_cols, bool poison,
    std::optional<at::ScalarType> xhat_dtype = std::nullopt, bool vector_access = false) {
  TORCH_CHECK(x.dim() == 2, "x must be 2-D (rows, cols), got ", x.dim(), " dims");
  check_input(x, "x", x);
  // dy has y's dtype: x's, or float32 for an RMSNorm variant
  check_input(dy, "dy", x, dy.scalar_type() == at::kFloat ? at::kFloat : x.scalar_type());
  const fusedops::NormVariant variant =
      norm_variant(x, dy.scalar_type(), rms, xhat_dtype, vector_access);
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  TORCH_CHECK(rms || mean.has_value(), "mean is required for layer_norm");
  const DType param_dtype = param_dtype_of(weight, bias, x);
  at::Tensor dx = new_output(x.sizes(), x.options(), poison);
  at::Tensor dweight, dbias;
  if (rows == 0) {  // nothing to reduce: zero gradients
    if (weight.has_value()) dweight = at::zeros_like(*weight);
    if (bias.has_value()) dbias = at::zeros_like(*bias);
    return {dx, dweight, dbias};
  }
  const int64_t partial_rows = backward_partial_rows(x);
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  at::Tensor dw_partial, db_partial, coeffs;
  if (weight.has_value()) {
    dw_partial = new_output({partial_rows, cols}, f32, poison);
    dweight = new_output({cols}, weight->options(), poison);
  }
  if (bias.has_value()) {
    db_partial = new_output({partial_rows, cols}, f32, poison);
    dbias = new_output({cols}, bias->options(), poison);
  }
  if (fusedops::layer_norm_backward_needs_coeffs(cols, max_register_cols)) {
    coeffs = new_output({2, rows}, f32, poison);
  }
  const auto data = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  const auto floats = [](const at::Tensor& t) {
    return t.defined() ? t.data_ptr<float>() : nullptr;
  };
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(
      fusedops::layer_norm_backward(
          dy.const_data_ptr(), x.const_data_ptr(), const_ptr(weight), param_dtype,
          float_ptr(mean, "mean", rows, x), float_ptr(rstd, "rstd", rows, x), dx.data_ptr(),
          floats(dw_partial), floats(db_partial), partial_rows, data(dweight), data(dbias),
          floats(coeffs), rows, cols, rms, variant, max_register_cols, dtype_of(x, "x"),
          current_stream()),
      "layer_norm_backward");
  return {dx, dweight, dbias};
}

// x as contiguous rows of n elements.
at::Tensor norm_rows(const at::Tensor& x, int64_t n) {
  TORCH_CHECK(n > 0 && x.numel() % n == 0, "x has ", x.numel(), " elements, not rows of ", n);
  return x.contiguous().view({-1, n});
}

// A parameter (or none) as n contiguous elements.
std::optional<at::Tensor> norm_param(const std::optional<at::Tensor>& p, int64_t n) {
  if (!p.has_value()) return std::nullopt;
  TORCH_CHECK(p->numel() == n, "a parameter has ", p->numel(), " elements, expected ", n);
  return p->contiguous().view({n});
}

// LayerNorm / RMSNorm with its autograd in C++ (the eager path on CUDA): x in any shape whose
// trailing dims hold n elements, weight/bias (absent, or n elements in fp32 or x's dtype). The
// backward runs on the autograd engine's thread without Python: no GIL, no Python frames per
// call. Returns y in x's shape.
class NormFunction : public torch::autograd::Function<NormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, int64_t n, double eps,
                            bool rms, int64_t max_register_cols, bool poison,
                            bool vector_access) {
    const at::Tensor rows = norm_rows(x, n);
    const std::optional<at::Tensor> w = norm_param(weight, n);
    const std::optional<at::Tensor> b = norm_param(bias, n);
    auto [y, mean, rstd] = layer_norm_forward(rows, w, b, eps, rms, max_register_cols, poison,
                                              std::nullopt, std::nullopt, vector_access);
    ctx->save_for_backward({rows, w.value_or(at::Tensor()), b.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["max_register_cols"] = max_register_cols;
    ctx->saved_data["poison"] = poison;
    ctx->saved_data["vector_access"] = vector_access;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["weight_sizes"] = weight.has_value() ? weight->sizes().vec() : std::vector<int64_t>{};
    ctx->saved_data["bias_sizes"] = bias.has_value() ? bias->sizes().vec() : std::vector<int64_t>{};
    // not a view to autograd: a view returned from here could not be modified in place later
    return at::_unsafe_view(y, x.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // The backward is not differentiable: refuse a graph of it (create_graph=True through an
    // input that requires grad) rather than return gradients that silently act as constants.
    const auto requires_grad = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
    const bool graph_of_backward =
        at::GradMode::is_enabled() &&
        (requires_grad(grads[0]) || std::any_of(saved.begin(), saved.begin() + 3, requires_grad));
    TORCH_CHECK(!graph_of_backward,
                "fusedops layer_norm/rms_norm: double backward (create_graph=True) is not supported");
    const at::Tensor& rows = saved[0];
    const bool rms = ctx->saved_data["rms"].toBool();
    const at::Tensor dy = grads[0].reshape(rows.sizes()).contiguous();
    auto [dx, dweight, dbias] = layer_norm_backward(
        dy, rows, defined_or_none(saved[1]), defined_or_none(saved[2]),
        rms ? std::nullopt : defined_or_none(saved[3]), saved[4], rms,
        ctx->saved_data["max_register_cols"].toInt(), ctx->saved_data["poison"].toBool(),
        std::nullopt, ctx->saved_data["vector_access"].toBool());
    const auto reshaped = [&](const at::Tensor& grad, const char* key) {
      return grad.defined() ? grad.view(ctx->saved_data[key].toIntVector()) : at::Tensor();
    };
    return {dx.view(ctx->saved_data["x_sizes"].toIntVector()), reshaped(dweight, "weight_sizes"),
            reshaped(dbias, "bias_sizes"), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static std::optional<at::Tensor> defined_or_none(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }
};

// The Autograd kernel of norm (records the graph when an input requires grad). GCC 13 reports
// a false -Wstringop-overflow inside std::vector<bool>::reserve, inlined from torch's
// Function::apply; silenced for this function only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
at::Tensor norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, int64_t n, double eps, bool rms,
                         int64_t max_register_cols, bool poison, bool vector_access) {
  return NormFunction::apply(x, weight, bias, n, eps, rms, max_register_cols, poison,
                             vector_access);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The CUDA kernel of norm: below autograd (inference mode, or called under no autograd key).
at::Tensor norm_forward_only(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, int64_t n, double eps,
                             bool rms, int64_t max_register_cols, bool poison,
                             bool vector_access) {
  auto [y, mean, rstd] = layer_norm_forward(norm_rows(x, n), norm_param(weight, n),
                                            norm_param(bias, n), eps, rms, max_register_cols,
                                            poison, std::nullopt, std::nullopt, vector_access);
  return at::_unsafe_view(y, x.sizes());
}

// Adam / AdamW: one group of tensors (one device, one param dtype); layout in launchers.h.
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

// Window attention's softmax kernels (window_attention.cu); the products around them are torch
// matmuls (cuBLAS) in kernels/cuda/window_attention.py, which also allocates every tensor here.
// scores, dprobs fp32 (Z, H, N, N); bias (H, N, N) and mask (nW, N, N) fp32 or absent; lse fp32
// (Z, H, N); probs, dscores (Z, H, N, N) in the input dtype; dbias_partial (G, H, N, N) fp32.
int64_t window_attention_rows(const at::Tensor& scores) {
  TORCH_CHECK(scores.dim() == 4 && scores.size(2) == scores.size(3),
              "scores must be (Z, H, N, N), got ", scores.sizes());
  return scores.size(0) * scores.size(1) * scores.size(2);
}

int64_t window_attention_masks(const std::optional<at::Tensor>& mask, const at::Tensor& scores) {
  if (!mask.has_value()) return 1;
  const int64_t n = scores.size(2);
  TORCH_CHECK(mask->dim() == 3 && mask->size(0) > 0 && mask->size(1) == n && mask->size(2) == n,
              "attn_mask must be (nW, ", n, ", ", n, "), got ", mask->sizes());
  TORCH_CHECK(scores.size(0) % mask->size(0) == 0, "windows ", scores.size(0),
              " are not a multiple of nW ", mask->size(0));
  return mask->size(0);
}

void* window_attention_output(at::Tensor& t, const char* name, const at::Tensor& scores) {
  TORCH_CHECK(t.is_cuda() && t.device() == scores.device(), name, " must be on ",
              scores.device());
  TORCH_CHECK(t.is_contiguous() && t.numel() == scores.numel(), name, " must hold ",
              scores.numel(), " contiguous elements");
  return t.data_ptr();
}

void window_attention_softmax_forward(const at::Tensor& scores,
                                      const std::optional<at::Tensor>& bias,
                                      const std::optional<at::Tensor>& mask, double scale,
                                      at::Tensor& probs, at::Tensor& lse) {
  const int64_t rows = window_attention_rows(scores);
  const int64_t batch = scores.size(0), heads = scores.size(1), n = scores.size(2);
  const int64_t windows = window_attention_masks(mask, scores);
  const float* s = float_ptr(scores, "scores", scores.numel(), scores);
  const float* b = float_ptr(bias, "relative_pos_bias", heads * n * n, scores);
  const float* m = float_ptr(mask, "attn_mask", windows * n * n, scores);
  void* p = window_attention_output(probs, "probs", scores);
  float* l = float_ptr(lse, "lse", rows, scores);
  c10::cuda::CUDAGuard guard(scores.device());
  check_launch(fusedops::window_attention_softmax_forward(s, b, m, p, l, batch, heads, n,
                                                          windows, static_cast<float>(scale),
                                                          dtype_of(probs, "probs"),
                                                          current_stream()),
               "window_attention_softmax_forward");
}

void window_attention_softmax_backward(const at::Tensor& scores, const at::Tensor& dprobs,
                                       const std::optional<at::Tensor>& bias,
                                       const std::optional<at::Tensor>& mask,
                                       const at::Tensor& lse, double scale, at::Tensor& probs,
                                       at::Tensor& dscores,
                                       const std::optional<at::Tensor>& dbias_partial,
                                       int64_t groups) {
  const int64_t rows = window_attention_rows(scores);
  const int64_t batch = scores.size(0), heads = scores.size(1), n = scores.size(2);
  const int64_t windows = window_attention_masks(mask, scores);
  TORCH_CHECK(groups >= 0 && groups <= batch && (groups > 0 || batch == 0), "groups ", groups,
              " must be in 1..", batch);
  TORCH_CHECK_TYPE(probs.scalar_type() == dscores.scalar_type(),
                   "probs and dscores must share a dtype");
  const float* s = float_ptr(scores, "scores", scores.numel(), scores);
  const float* dp = float_ptr(dprobs, "dprobs", scores.numel(), scores);
  const float* b = float_ptr(bias, "relative_pos_bias", heads * n * n, scores);
  const float* m = float_ptr(mask, "attn_mask", windows * n * n, scores);
  const float* l = float_ptr(lse, "lse", rows, scores);
  float* partial = float_ptr(dbias_partial, "dbias_partial", groups * heads * n * n, scores);
  c10::cuda::CUDAGuard guard(scores.device());
  check_launch(fusedops::window_attention_softmax_backward(
                   s, dp, b, m, l, window_attention_output(probs, "probs", scores),
                   window_attention_output(dscores, "dscores", scores), partial, groups, batch,
                   heads, n, windows, static_cast<float>(scale), dtype_of(probs, "probs"),
                   current_stream()),
               "window_attention_softmax_backward");
}

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

// NMS / soft-NMS (nms.cu): outputs and workspaces are allocated by kernels/cuda/nms.py.
int64_t check_boxes(const at::Tensor& boxes) {
  TORCH_CHECK(boxes.is_cuda(), "boxes must be a CUDA tensor");
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "boxes must have shape (N, 4)");
  TORCH_CHECK(boxes.is_contiguous(), "boxes must be contiguous");
  return boxes.size(0);
}

void nms_walk(const at::Tensor& boxes, const std::optional<at::Tensor>& classes,
              const std::optional<at::Tensor>& col_end, at::Tensor& mask, at::Tensor& positions,
              at::Tensor& count, double iou_threshold, double offset) {
  const int64_t n = check_boxes(boxes);
  const int64_t blocks = (n + 63) / 64;
  TORCH_CHECK(classes.has_value() == col_end.has_value(), "classes and col_end go together");
  if (classes.has_value()) {
    check_sized(*classes, "classes", n, at::kLong, boxes);
    check_sized(*col_end, "col_end", blocks, at::kLong, boxes);
  }
  check_sized(mask, "mask", n * blocks, at::kLong, boxes);
  check_sized(positions, "positions", n, at::kLong, boxes);
  check_sized(count, "count", 1, at::kLong, boxes);
  const auto indices = [](const std::optional<at::Tensor>& t) {
    return t.has_value() ? t->const_data_ptr<int64_t>() : nullptr;
  };
  c10::cuda::CUDAGuard guard(boxes.device());
  check_launch(fusedops::nms_walk(boxes.const_data_ptr(), indices(classes), indices(col_end),
                                  static_cast<uint64_t*>(mask.data_ptr()), n,
                                  static_cast<float>(iou_threshold), static_cast<float>(offset),
                                  positions.data_ptr<int64_t>(), count.data_ptr<int64_t>(),
                                  dtype_of(boxes, "boxes"), current_stream()),
               "nms_walk");
}

void soft_nms_segments(const at::Tensor& boxes, const at::Tensor& scores,
                       const at::Tensor& seg_starts, int64_t longest,
                       const std::optional<at::Tensor>& workspace, at::Tensor& positions,
                       at::Tensor& picked, at::Tensor& counts, double iou_threshold,
                       double sigma, double min_score, int64_t method, double offset) {
  const int64_t n = check_boxes(boxes);
  const int64_t segments = seg_starts.numel() - 1;
  TORCH_CHECK(segments >= 0, "seg_starts must hold at least one element");
  TORCH_CHECK(method >= 0 && method <= 2, "method must be 0, 1 or 2, got ", method);
  check_sized(scores, "scores", n, at::kFloat, boxes);
  check_sized(seg_starts, "seg_starts", segments + 1, at::kLong, boxes);
  check_sized(positions, "positions", n, at::kLong, boxes);
  check_sized(picked, "picked", n, at::kFloat, boxes);
  check_sized(counts, "counts", segments, at::kLong, boxes);
  if (workspace.has_value()) check_sized(*workspace, "workspace", 7 * n, at::kFloat, boxes);
  const fusedops::SoftNmsOptions options{
      static_cast<float>(iou_threshold), static_cast<float>(sigma),
      static_cast<float>(min_score), static_cast<float>(offset), static_cast<int>(method)};
  c10::cuda::CUDAGuard guard(boxes.device());
  check_launch(fusedops::soft_nms_segments(
                   boxes.const_data_ptr(), scores.const_data_ptr<float>(),
                   seg_starts.const_data_ptr<int64_t>(), segments, n, longest,
                   workspace.has_value() ? workspace->data_ptr<float>() : nullptr,
                   positions.data_ptr<int64_t>(), picked.data_ptr<float>(),
                   counts.data_ptr<int64_t>(), options, dtype_of(boxes, "boxes"),
                   current_stream()),
               "soft_nms_segments");
}

int64_t soft_nms_shared_items(const at::Tensor& like) {
  TORCH_CHECK(like.is_cuda(), "soft_nms_shared_items takes a CUDA tensor");
  return fusedops::soft_nms_shared_items(like.get_device());
}

}  // namespace

TORCH_LIBRARY(fusedops_cuda, m) {
  m.def("quick_gelu_forward(Tensor x, Tensor(a!) y) -> ()");
  m.def("quick_gelu_backward(Tensor grad, Tensor x, Tensor(a!) dx) -> ()");
  m.def(
      "layer_norm_forward(Tensor x, Tensor? weight, Tensor? bias, float eps, bool rms, "
      "int max_register_cols, bool poison, ScalarType? out_dtype=None, "
      "ScalarType? xhat_dtype=None, bool vector_access=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor? mean, "
      "Tensor rstd, bool rms, int max_register_cols, bool poison, "
      "ScalarType? xhat_dtype=None, bool vector_access=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "norm(Tensor x, Tensor? weight, Tensor? bias, int n, float eps, bool rms, "
      "int max_register_cols, bool poison, bool vector_access=False) -> Tensor");
  m.def(
      "adam_step(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, "
      "Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs, Tensor(f!)[] masters, "
      "Tensor(g!)[] steps, Tensor? lr_tensor, float lr, float beta1, float beta2, float eps, "
      "float weight_decay, bool amsgrad, bool maximize, bool decoupled, Tensor? grad_scale, "
      "Tensor? found_inf, Tensor? clip_coef, int chunk_size) -> ()");
  m.def(
      "bias_dropout_add_forward(Tensor src, Tensor? bias, Tensor? residual, Tensor(a!) out, "
      "Tensor? seed, int threshold, float scale, int mode) -> ()");
  m.def(
      "bias_dropout_add_backward(Tensor grad, Tensor(a!) grad_x, Tensor(b!) partial, "
      "Tensor(c!) grad_bias, Tensor? seed, int threshold, float scale, int mode) -> ()");
  m.def(
      "window_attention_softmax_forward(Tensor scores, Tensor? bias, Tensor? mask, float scale, "
      "Tensor(a!) probs, Tensor(b!) lse) -> ()");
  m.def(
      "window_attention_softmax_backward(Tensor scores, Tensor dprobs, Tensor? bias, "
      "Tensor? mask, Tensor lse, float scale, Tensor(a!) probs, Tensor(b!) dscores, "
      "Tensor(c!)? dbias_partial, int groups) -> ()");
  m.def(
      "window_gather(Tensor src, Tensor(a!) dst, int height, int width, int window_h, "
      "int window_w, int shift_h, int shift_w, bool reverse) -> ()");
  m.def("swin_softmax_forward(Tensor attn, Tensor bias, Tensor? mask, Tensor(a!) out) -> ()");
  m.def(
      "swin_softmax_backward(Tensor grad, Tensor probs, Tensor(a!) d_attn, Tensor(b!) partial) "
      "-> ()");
  m.def(
      "nms_walk(Tensor boxes, Tensor? classes, Tensor? col_end, Tensor(a!) mask, "
      "Tensor(b!) positions, Tensor(c!) count, float iou_threshold, float offset) -> ()");
  m.def(
      "soft_nms_segments(Tensor boxes, Tensor scores, Tensor seg_starts, int longest, "
      "Tensor(a!)? workspace, Tensor(b!) positions, Tensor(c!) picked, Tensor(d!) counts, "
      "float iou_threshold, float sigma, float min_score, int method, float offset) -> ()");
  m.def("soft_nms_shared_items(Tensor like) -> int");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("quick_gelu_forward", &quick_gelu_forward);
  m.impl("quick_gelu_backward", &quick_gelu_backward);
  m.impl("layer_norm_forward", &layer_norm_forward);
  m.impl("layer_norm_backward", &layer_norm_backward);
  m.impl("norm", &norm_forward_only);
  m.impl("adam_step", &adam_step);
  m.impl("bias_dropout_add_forward", &bias_dropout_add_forward);
  m.impl("bias_dropout_add_backward", &bias_dropout_add_backward);
  m.impl("window_attention_softmax_forward", &window_attention_softmax_forward);
  m.impl("window_attention_softmax_backward", &window_attention_softmax_backward);
  m.impl("window_gather", &window_gather);
  m.impl("swin_softmax_forward", &swin_softmax_forward);
  m.impl("swin_softmax_backward", &swin_softmax_backward);
  m.impl("nms_walk", &nms_walk);
  m.impl("soft_nms_segments", &soft_nms_segments);
  m.impl("soft_nms_shared_items", &soft_nms_shared_items);
}

TORCH_LIBRARY_IMPL(fusedops_cuda, Autograd, m) { m.impl("norm", &norm_autograd); }
