// Torch binding of LayerNorm / RMSNorm (layer_norm.cu): a TORCH_LIBRARY_FRAGMENT of the
// fusedops_cuda library (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/layer_norm.py passes in, takes the current stream and calls the plain-CUDA launchers
// declared in layer_norm.h. Also norm, LayerNorm / RMSNorm with its autograd in C++ (the eager path
// on CUDA). LayerNorm's functions allocate their outputs here (one call from Python per direction:
// the host cost of a small LayerNorm is mostly per-call overhead); poison fills them with NaN first
// (tests).
#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "layer_norm.h"

namespace {

using fusedops::DType;

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// LayerNorm / RMSNorm: x (rows, cols); parameters (cols) in fp32 or x's dtype; fp32 statistics.

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

// RMSNorm variants (layer_norm.h, NormVariant): y / dy in x's dtype or float32 (`out_type`), xhat
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
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
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("layer_norm_forward", &layer_norm_forward);
  m.impl("layer_norm_backward", &layer_norm_backward);
  m.impl("norm", &norm_forward_only);
}

TORCH_LIBRARY_IMPL(fusedops_cuda, Autograd, m) { m.impl("norm", &norm_autograd); }
