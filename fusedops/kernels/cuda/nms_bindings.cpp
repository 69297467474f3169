// Torch binding of NMS and soft-NMS (nms.cu): a TORCH_LIBRARY_FRAGMENT of the fusedops_cuda library
// (library.cpp claims the namespace). Unwraps and checks the tensors that kernels/cuda/nms.py
// passes in, takes the current stream and calls the plain-CUDA launchers declared in nms.h.
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "nms.h"

namespace {

using namespace fusedops::binding;  // NOLINT: the shared binding helpers

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

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
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
  m.impl("nms_walk", &nms_walk);
  m.impl("soft_nms_segments", &soft_nms_segments);
  m.impl("soft_nms_shared_items", &soft_nms_shared_items);
}
