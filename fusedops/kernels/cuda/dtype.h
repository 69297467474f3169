// The element types the CUDA launchers take, shared by every <op>.h, device.cuh (nvcc) and
// bindings.h (host compiler). No torch, no CUDA headers.
#pragma once

namespace fusedops {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

}  // namespace fusedops
