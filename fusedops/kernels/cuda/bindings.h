// Helpers shared by the torch bindings (each <op>_bindings.cpp): the dtype mapping, input
// checks, the launch status check and the current stream. Host compiler only.
#pragma once
#include <cstdint>
#include <optional>

#include <cuda_runtime_api.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include "dtype.h"

namespace fusedops::binding {

inline DType dtype_of(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, name, " has dtype ", type,
                       "; the CUDA kernels take float32, float16 and bfloat16");
  }
}

inline DType dtype_of(const at::Tensor& t, const char* name) {
  return dtype_of(t.scalar_type(), name);
}

// t: contiguous, on like's device, with like's number of elements and `dtype`.
inline void check_input(const at::Tensor& t, const char* name, const at::Tensor& like,
                        at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
  TORCH_CHECK(t.numel() == like.numel(), name, " has ", t.numel(), " elements, expected ",
              like.numel());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ",
                   dtype);
}

inline void check_input(const at::Tensor& t, const char* name, const at::Tensor& like) {
  check_input(t, name, like, like.scalar_type());
}

// t: contiguous, on like's device, `numel` elements of `dtype`.
inline void check_sized(const at::Tensor& t, const char* name, int64_t numel,
                        at::ScalarType dtype, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ",
                   t.scalar_type());
  TORCH_CHECK(t.numel() == numel, name, " has ", t.numel(), " elements, expected ", numel);
}

// The float32 data of an optional tensor (null when absent): contiguous, on like's device,
// `numel` elements.
inline float* float_ptr(const std::optional<at::Tensor>& t, const char* name, int64_t numel,
                        const at::Tensor& like) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->is_cuda() && t->device() == like.device(), name, " must be on ", like.device());
  TORCH_CHECK(t->is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, name, " must be float32, got ",
                   t->scalar_type());
  TORCH_CHECK(t->numel() == numel, name, " has ", t->numel(), " elements, expected ", numel);
  return static_cast<float*>(t->data_ptr());
}

inline void check_launch(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "fusedops CUDA launch failed in ", what, ": ",
              cudaGetErrorString(status));
}

// The data of an optional tensor, null when absent.
inline const void* const_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->const_data_ptr() : nullptr;
}

inline void* mutable_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr() : nullptr;
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace fusedops::binding
