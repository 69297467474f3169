// SGD multi-tensor apply (as apex's multi_tensor_apply, and adam.cu here): the tensors of a group
// are cut into chunks of chunk_size elements; a table (a struct of pointer arrays, passed by
// value as a kernel argument) names up to kMaxTensors tensors and kMaxBlocks chunks, one CUDA
// block per chunk. When a table is full it is launched and refilled; a tensor whose chunks do not
// all fit continues in slot 0 of the next table. Same math as kernels/triton/sgd.py, in fp32:
//
//   g = grad / grad_scale (stored back);  g = -g if maximize;  g = g + wd * p  (wd != 0)
//   b = first ? g : momentum * b + (1 - dampening) * g;  g = nesterov ? g + momentum * b : b
//   p = p - lr * g                                        (the b lines only when momentum != 0)
//
// lr (optional), the first flags, grad_scale and found_inf are read on the device: no host
// sync. A nonzero found_inf makes every block return before touching memory.
//
// Vector path: when chunk_size % 4 == 0 and every array of the call is aligned to 4 of its
// elements (16 B fp32, 8 B fp16/bf16), each thread updates 4 consecutive elements per iteration
// with one vector load/store per array, all loads before the math; a tensor's < 4 last elements
// are then updated one per thread. A call with any misaligned array (e.g. a view with a storage
// offset) takes the scalar loop. Both paths run the same sgd_element: bit-identical results.
#include <cstdint>

#include "device.cuh"
#include "sgd.h"

namespace fusedops {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxTensors = 40;
constexpr int kMaxBlocks = 320;

// One launch's table. 5 pointers + a size per tensor slot, 5 bytes per block: 3520 bytes, with
// the options below the 4 KiB kernel-argument limit of every CUDA version.
struct SgdTable {
  void* params[kMaxTensors];
  void* grads[kMaxTensors];
  void* momentum_buffers[kMaxTensors];
  float* masters[kMaxTensors];
  const float* firsts[kMaxTensors];
  int64_t sizes[kMaxTensors];
  int32_t block_to_chunk[kMaxBlocks];  // chunk index within its tensor (< 2^31 chunks)
  uint8_t block_to_tensor[kMaxBlocks];
};

static_assert(sizeof(SgdTable) + sizeof(SgdOptions) + sizeof(int64_t) <= 4096,
              "kernel arguments must fit in 4 KiB");
static_assert(kMaxTensors <= 256, "block_to_tensor is a uint8_t");

// Per-block constants of the update (a block serves one tensor slot).
struct SgdCoeffs {
  float lr, grad_scale;
  bool has_grad_scale, has_weight_decay, first;
};

// The update of one element, the only copy of the math: the scalar loop passes pointers into the
// tensors, the vector loop pointers into register packs, so both paths give bit-identical results.
// master is read and written only if kMaster (param is then only written), the momentum buffer
// only if kMomentum; the grad is stored back, unscaled, only when a grad_scale is given.
template <bool kMaster, bool kMomentum, typename P, typename S>
__device__ __forceinline__ void sgd_element(const SgdOptions& opt, const SgdCoeffs& c, P* grad,
                                            P* param, float* master, S* momentum_buffer) {
  float g = to_float(*grad);
  if (c.has_grad_scale) {
    g = g / c.grad_scale;
    *grad = from_float<P>(g);
  }
  if (opt.maximize) g = -g;
  float p = kMaster ? *master : to_float(*param);
  if (c.has_weight_decay) g = g + opt.weight_decay * p;
  if constexpr (kMomentum) {
    float b = to_float(*momentum_buffer);
    b = c.first ? g : opt.momentum * b + (1.0f - opt.dampening) * g;
    *momentum_buffer = from_float<S>(b);
    g = opt.nesterov ? g + opt.momentum * b : b;
  }
  p = p - c.lr * g;
  if (kMaster) *master = p;
  *param = from_float<P>(p);
}

// 4 consecutive elements, loaded or stored with one vector access (16 bytes for fp32: float4;
// 8 bytes for fp16/bf16: 4 halves in 2 registers). The address must be aligned to 4 elements.
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T e[4];
};
template <typename T>
__device__ __forceinline__ Pack4<T> load4(const T* src) {
  return *reinterpret_cast<const Pack4<T>*>(src);
}
template <typename T>
__device__ __forceinline__ void store4(T* dst, const Pack4<T>& pack) {
  *reinterpret_cast<Pack4<T>*>(dst) = pack;
}

// kVec: the host checked chunk_size % 4 == 0 and the 4-element alignment of every array.
template <typename P, typename S, bool kMaster, bool kMomentum, bool kVec>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(const SgdTable table, const SgdOptions opt, const int64_t chunk_size) {
  if (opt.found_inf != nullptr && *opt.found_inf != 0.0f) return;
  const int slot = table.block_to_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_to_chunk[blockIdx.x]) * chunk_size;
  const int64_t n = table.sizes[slot];
  const int64_t end = begin + chunk_size < n ? begin + chunk_size : n;

  P* __restrict__ param = static_cast<P*>(table.params[slot]);
  P* __restrict__ grad = static_cast<P*>(table.grads[slot]);
  S* __restrict__ buf = kMomentum ? static_cast<S*>(table.momentum_buffers[slot]) : nullptr;
  float* __restrict__ master = kMaster ? table.masters[slot] : nullptr;

  SgdCoeffs c;
  c.lr = opt.lr_ptr != nullptr ? *opt.lr_ptr : opt.lr;
  c.has_grad_scale = opt.grad_scale != nullptr;
  c.grad_scale = c.has_grad_scale ? *opt.grad_scale : 1.0f;
  c.has_weight_decay = opt.weight_decay != 0.0f;
  const float* first = table.firsts[slot];
  c.first = kMomentum && first != nullptr && *first != 0.0f;

  if constexpr (kVec) {
    // begin is a multiple of 4 (chunk_size is); i + 4 <= end keeps every access below end.
    for (int64_t i = begin + 4 * threadIdx.x; i + 4 <= end; i += 4 * blockDim.x) {
      // every load of the iteration first: 2 or 3 independent vector loads in flight
      Pack4<P> g = load4(grad + i);
      Pack4<P> p;       // param: read unless kMaster, always written
      Pack4<float> pm;  // master (kMaster only)
      if constexpr (kMaster) {
        pm = load4(master + i);
      } else {
        p = load4(param + i);
      }
      Pack4<S> b;
      if constexpr (kMomentum) b = load4(buf + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sgd_element<kMaster, kMomentum>(opt, c, &g.e[k], &p.e[k], &pm.e[k], &b.e[k]);
      }
      if (c.has_grad_scale) store4(grad + i, g);
      if constexpr (kMomentum) store4(buf + i, b);
      if constexpr (kMaster) store4(master + i, pm);
      store4(param + i, p);
    }
    // The < 4 elements the vector loop left (only in a tensor's last chunk): one per thread.
    const int64_t i = begin + ((end - begin) & ~int64_t{3}) + threadIdx.x;
    if (i < end) {
      sgd_element<kMaster, kMomentum>(opt, c, grad + i, param + i,
                                      kMaster ? master + i : nullptr,
                                      kMomentum ? buf + i : nullptr);
    }
  } else {
#pragma unroll 1
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      sgd_element<kMaster, kMomentum>(opt, c, grad + i, param + i,
                                      kMaster ? master + i : nullptr,
                                      kMomentum ? buf + i : nullptr);
    }
  }
}

// Whether ptr is aligned to 4 elements of T, as the vector loop needs.
template <typename T>
bool aligned4(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % (4 * sizeof(T)) == 0;
}

template <typename P, typename S, bool kMaster, bool kMomentum>
cudaError_t launch_tables(int64_t n, void* const* params, void* const* grads,
                          void* const* momentum_buffers, float* const* masters,
                          const float* const* firsts, const int64_t* sizes,
                          const SgdOptions& opt, int64_t chunk_size, cudaStream_t stream) {
  // One decision per call: the vector path only if every array of every tensor allows it.
  bool vec = chunk_size % 4 == 0;
  for (int64_t i = 0; i < n && vec; ++i) {
    if (sizes[i] <= 0) continue;  // never dereferenced
    vec = aligned4<P>(params[i]) && aligned4<P>(grads[i]) &&
          (!kMomentum || aligned4<S>(momentum_buffers[i])) &&
          (!kMaster || aligned4<float>(masters[i]));
  }
  const auto kernel = vec ? sgd_kernel<P, S, kMaster, kMomentum, true>
                          : sgd_kernel<P, S, kMaster, kMomentum, false>;

  SgdTable table;
  int slot = 0;    // the slot of tensor i
  int blocks = 0;  // blocks (chunks) already in the table
  const auto launch = [&]() {
    kernel<<<blocks, kThreads, 0, stream>>>(table, opt, chunk_size);
    blocks = 0;
    return cudaGetLastError();
  };
  for (int64_t i = 0; i < n; ++i) {
    if (sizes[i] <= 0) continue;  // zero-size tensor: nothing to update, takes no slot
    table.params[slot] = params[i];
    table.grads[slot] = grads[i];
    table.momentum_buffers[slot] = kMomentum ? momentum_buffers[i] : nullptr;
    table.masters[slot] = kMaster ? masters[i] : nullptr;
    table.firsts[slot] = firsts != nullptr ? firsts[i] : nullptr;
    table.sizes[slot] = sizes[i];
    const int64_t chunks = sizes[i] / chunk_size + (sizes[i] % chunk_size != 0 ? 1 : 0);
    for (int64_t c = 0; c < chunks; ++c) {
      table.block_to_tensor[blocks] = static_cast<uint8_t>(slot);
      table.block_to_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool tensor_done = c == chunks - 1;
      if (blocks == kMaxBlocks || (tensor_done && slot + 1 == kMaxTensors)) {
        const cudaError_t status = launch();
        if (status != cudaSuccess) return status;
        if (tensor_done) {
          slot = -1;  // the next tensor starts the new table at slot 0
        } else {      // tensor i continues: its pointers move to slot 0 of the new table
          table.params[0] = table.params[slot];
          table.grads[0] = table.grads[slot];
          table.momentum_buffers[0] = table.momentum_buffers[slot];
          table.masters[0] = table.masters[slot];
          table.firsts[0] = table.firsts[slot];
          table.sizes[0] = table.sizes[slot];
          slot = 0;
        }
      }
    }
    ++slot;
  }
  return blocks > 0 ? launch() : cudaSuccess;  // the last, partly filled table
}

template <typename P, typename S>
cudaError_t dispatch_flags(int64_t n, void* const* params, void* const* grads,
                           void* const* momentum_buffers, float* const* masters,
                           const float* const* firsts, const int64_t* sizes,
                           const SgdOptions& opt, int64_t chunk_size, cudaStream_t stream) {
  const bool master = masters != nullptr;
  const bool momentum = momentum_buffers != nullptr;
#define FUSEDOPS_SGD_LAUNCH(M, B)                                                          \
  return launch_tables<P, S, M, B>(n, params, grads, momentum_buffers, masters, firsts, sizes, \
                                   opt, chunk_size, stream)
  if (master && momentum) FUSEDOPS_SGD_LAUNCH(true, true);
  if (master) FUSEDOPS_SGD_LAUNCH(true, false);
  if (momentum) FUSEDOPS_SGD_LAUNCH(false, true);
  FUSEDOPS_SGD_LAUNCH(false, false);
#undef FUSEDOPS_SGD_LAUNCH
}

}  // namespace

cudaError_t sgd_multi_tensor(int64_t n, void* const* params, void* const* grads,
                             void* const* momentum_buffers, float* const* masters,
                             const float* const* firsts, const int64_t* sizes, DType param_dtype,
                             DType state_dtype, const SgdOptions& options, int64_t chunk_size,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (chunk_size <= 0) return cudaErrorInvalidValue;
  for (int64_t i = 0; i < n; ++i) {  // before any launch: all or nothing is updated
    // block_to_chunk holds a tensor's chunk index as int32
    if (sizes[i] < 0 || (sizes[i] - 1) / chunk_size > INT32_MAX) return cudaErrorInvalidValue;
  }
  if (state_dtype == DType::kFloat32) {  // fp32 params, or fp16/bf16 params with fp32 state
    FUSEDOPS_DISPATCH_FLOAT(param_dtype,
                            return dispatch_flags<scalar_t, float>(
                                n, params, grads, momentum_buffers, masters, firsts, sizes,
                                options, chunk_size, stream));
  }
  if (state_dtype != param_dtype || masters != nullptr) return cudaErrorInvalidValue;
  FUSEDOPS_DISPATCH_FLOAT(param_dtype,
                          return dispatch_flags<scalar_t, scalar_t>(
                              n, params, grads, momentum_buffers, masters, firsts, sizes,
                              options, chunk_size, stream));
  return cudaErrorInvalidValue;
}

}  // namespace fusedops
