// Torch binding of window attention's softmax (window_attention.cu): a TORCH_LIBRARY_FRAGMENT of
// the fusedops_cuda library (library.cpp claims the namespace). Unwraps and checks the tensors that
// kernels/cuda/window_attention.py passes in, takes the current stream and calls the plain-CUDA
// launchers declared in window_attention.h.
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "window_attention.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "window_attention_softmax_forward(Tensor scores, Tensor? bias, Tensor? mask, float scale, "
      "Tensor(a!) probs, Tensor(b!) lse) -> ()");
  m.def(
      "window_attention_softmax_backward(Tensor scores, Tensor dprobs, Tensor? bias, "
      "Tensor? mask, Tensor lse, float scale, Tensor(a!) probs, Tensor(b!) dscores, "
      "Tensor(c!)? dbias_partial, int groups) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("window_attention_softmax_forward", &window_attention_softmax_forward);
  m.impl("window_attention_softmax_backward", &window_attention_softmax_backward);
}
