// Torch binding of the deform_conv2d launchers (deform_conv2d.cu): a fragment of the
// fusedops_cuda library (library.cpp holds its TORCH_LIBRARY). Unwraps and checks the tensors
// that kernels/cuda/deform_conv2d.py allocates and passes in, and launches on the current
// stream. `geometry` is [offset_groups, kh, kw, h_out, w_out, stride_h, stride_w, pad_h, pad_w,
// dil_h, dil_w]; B, C, H, W come from the input (grad_input for segment_gather).
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings.h"
#include "deform_conv2d.h"

namespace {

using fusedops::DeformConvGeometry;
using namespace fusedops::binding;  // NOLINT: the shared binding helpers

// The geometry of `image` (B, C, H, W), contiguous CUDA of a kernel dtype, and `sizes`.
DeformConvGeometry geometry_of(const at::Tensor& image, const char* name, at::IntArrayRef sizes) {
  check_input(image, name, image);
  dtype_of(image, name);
  TORCH_CHECK(image.dim() == 4, name, " must be (B, C, H, W), got shape ", image.sizes());
  TORCH_CHECK(sizes.size() == 11, "geometry must hold 11 integers, got ", sizes.size());
  const DeformConvGeometry g{image.size(0), image.size(1), image.size(2), image.size(3),
                             sizes[0],      sizes[1],      sizes[2],      sizes[3],
                             sizes[4],      sizes[5],      sizes[6],      sizes[7],
                             sizes[8],      sizes[9],      sizes[10]};
  TORCH_CHECK(g.offset_groups > 0 && g.channels % g.offset_groups == 0, "offset_groups ",
              g.offset_groups, " must divide the ", g.channels, " channels");
  TORCH_CHECK(g.kh > 0 && g.kw > 0 && g.h_out > 0 && g.w_out > 0 && g.stride_h > 0 &&
                  g.stride_w > 0 && g.pad_h >= 0 && g.pad_w >= 0 && g.dil_h > 0 && g.dil_w > 0,
              "geometry ", sizes, " must be positive (padding non-negative)");
  return g;
}

int64_t samples(const DeformConvGeometry& g) {
  return g.batch * g.offset_groups * g.kh * g.kw * g.h_out * g.w_out;
}

int64_t columns_numel(const DeformConvGeometry& g) {
  return g.channels * g.kh * g.kw * g.batch * g.h_out * g.w_out;
}

// offset (B, 2 G K, H_out, W_out) and mask (B, G K, H_out, W_out) or absent, like input.
void check_offset_mask(const at::Tensor& offset, const std::optional<at::Tensor>& mask,
                       const at::Tensor& input, const DeformConvGeometry& g) {
  check_sized(offset, "offset", 2 * samples(g), input.scalar_type(), input);
  if (mask.has_value()) check_sized(*mask, "mask", samples(g), input.scalar_type(), input);
}

void deform_conv2d_columns(const at::Tensor& input, const at::Tensor& offset,
                           const std::optional<at::Tensor>& mask, at::Tensor& columns,
                           at::IntArrayRef geometry) {
  const DeformConvGeometry g = geometry_of(input, "input", geometry);
  check_offset_mask(offset, mask, input, g);
  check_sized(columns, "columns", columns_numel(g), input.scalar_type(), input);
  c10::cuda::CUDAGuard guard(input.device());
  check_launch(fusedops::deform_conv2d_columns(input.const_data_ptr(), offset.const_data_ptr(),
                                               const_ptr(mask), columns.data_ptr(), g,
                                               dtype_of(input, "input"), current_stream()),
               "deform_conv2d_columns");
}

void deform_conv2d_sample_grads(const at::Tensor& grad_columns, const at::Tensor& input,
                                const at::Tensor& offset, const std::optional<at::Tensor>& mask,
                                at::IntArrayRef geometry, at::Tensor& grad_offset,
                                const std::optional<at::Tensor>& grad_mask,
                                const std::optional<at::Tensor>& grad_input,
                                const std::optional<at::Tensor>& keys,
                                const std::optional<at::Tensor>& coefs) {
  const DeformConvGeometry g = geometry_of(input, "input", geometry);
  const at::ScalarType dtype = input.scalar_type();
  check_offset_mask(offset, mask, input, g);
  check_sized(grad_columns, "grad_columns", columns_numel(g), dtype, input);
  check_sized(grad_offset, "grad_offset", 2 * samples(g), dtype, input);
  TORCH_CHECK(grad_mask.has_value() == mask.has_value(), "grad_mask goes with mask");
  if (grad_mask.has_value()) check_sized(*grad_mask, "grad_mask", samples(g), dtype, input);
  TORCH_CHECK(grad_input.has_value() != (keys.has_value() && coefs.has_value()) &&
                  keys.has_value() == coefs.has_value(),
              "give either grad_input (atomic) or keys and coefs (deterministic)");
  if (grad_input.has_value()) {
    check_sized(*grad_input, "grad_input", input.numel(), at::kFloat, input);
  } else {
    check_sized(*keys, "keys", 4 * samples(g), at::kLong, input);
    check_sized(*coefs, "coefs", 4 * samples(g), at::kFloat, input);
  }
  c10::cuda::CUDAGuard guard(input.device());
  check_launch(fusedops::deform_conv2d_sample_grads(
                   grad_columns.const_data_ptr(), input.const_data_ptr(),
                   offset.const_data_ptr(), const_ptr(mask), grad_offset.data_ptr(),
                   mutable_ptr(grad_mask), static_cast<float*>(mutable_ptr(grad_input)),
                   static_cast<int64_t*>(mutable_ptr(keys)),
                   static_cast<float*>(mutable_ptr(coefs)), g, dtype_of(input, "input"),
                   current_stream()),
               "deform_conv2d_sample_grads");
}

void deform_conv2d_segment_gather(const at::Tensor& grad_columns, const at::Tensor& order,
                                  const at::Tensor& coefs, const at::Tensor& starts,
                                  at::IntArrayRef geometry, at::Tensor& grad_input) {
  const DeformConvGeometry g = geometry_of(grad_input, "grad_input", geometry);
  const int64_t segments = g.batch * g.offset_groups * g.height * g.width;
  check_sized(grad_columns, "grad_columns", columns_numel(g), grad_input.scalar_type(),
              grad_input);
  check_sized(order, "order", 4 * samples(g), at::kLong, grad_input);
  check_sized(coefs, "coefs", 4 * samples(g), at::kFloat, grad_input);
  check_sized(starts, "starts", segments + 1, at::kLong, grad_input);
  c10::cuda::CUDAGuard guard(grad_input.device());
  check_launch(fusedops::deform_conv2d_segment_gather(
                   grad_columns.const_data_ptr(), order.const_data_ptr<int64_t>(),
                   coefs.const_data_ptr<float>(), starts.const_data_ptr<int64_t>(),
                   grad_input.data_ptr(), g, dtype_of(grad_input, "grad_input"),
                   current_stream()),
               "deform_conv2d_segment_gather");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fusedops_cuda, m) {
  m.def(
      "deform_conv2d_columns(Tensor input, Tensor offset, Tensor? mask, Tensor(a!) columns, "
      "int[] geometry) -> ()");
  m.def(
      "deform_conv2d_sample_grads(Tensor grad_columns, Tensor input, Tensor offset, "
      "Tensor? mask, int[] geometry, Tensor(a!) grad_offset, Tensor(b!)? grad_mask, "
      "Tensor(c!)? grad_input, Tensor(d!)? keys, Tensor(e!)? coefs) -> ()");
  m.def(
      "deform_conv2d_segment_gather(Tensor grad_columns, Tensor order, Tensor coefs, "
      "Tensor starts, int[] geometry, Tensor(a!) grad_input) -> ()");
}

TORCH_LIBRARY_IMPL(fusedops_cuda, CUDA, m) {
  m.impl("deform_conv2d_columns", &deform_conv2d_columns);
  m.impl("deform_conv2d_sample_grads", &deform_conv2d_sample_grads);
  m.impl("deform_conv2d_segment_gather", &deform_conv2d_segment_gather);
}
