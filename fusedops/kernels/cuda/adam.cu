// Adam / AdamW multi-tensor apply (as apex's multi_tensor_apply): the tensors of a group are cut
// into chunks of chunk_size elements; a table (a struct of pointer arrays, passed by value as a
// kernel argument) names up to kMaxTensors tensors and kMaxBlocks chunks, one CUDA block per
// chunk. When a table is full it is launched and refilled; a tensor whose chunks do not all fit
// continues in slot 0 of the next table. Same math as kernels/triton/adam.py, in fp32:
//
//   g = grad / grad_scale (stored back);  g = g * clip_coef;  g = -g if maximize
//   p = p * (1 - lr * wd) if decoupled, else g = g + wd * p     (only when wd != 0)
//   m = m + (1 - beta1) * (g - m);  v = beta2 * v + (1 - beta2) * g * g;  v = max(vmax, v)
//   p = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
//
// step, lr (optional), grad_scale, found_inf and clip_coef are read on the device: no host sync. A nonzero
// found_inf makes every block return before touching memory.
//
// Vector path: when chunk_size % 4 == 0 and every array of the call is aligned to 4 of its
// elements (16 B fp32, 8 B fp16/bf16), each thread updates 4 consecutive elements per iteration
// with one vector load/store per array, all loads before the math; a tensor's < 4 last elements
// are then updated one per thread. A call with any misaligned array (e.g. a view with a storage
// offset) takes the scalar loop. Both paths run the same adam_element: bit-identical results.
#include <cstdint>

#include "device.cuh"
#include "adam.h"

namespace fusedops {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxTensors = 32;
constexpr int kMaxBlocks = 320;

// One launch's table. 7 pointers + a size per tensor slot, 5 bytes per block: 3648 bytes, with
// the options below the 4 KiB kernel-argument limit of every CUDA version.
struct AdamTable {
  void* params[kMaxTensors];
  void* grads[kMaxTensors];
  void* exp_avgs[kMaxTensors];
  void* exp_avg_sqs[kMaxTensors];
  void* max_exp_avg_sqs[kMaxTensors];
  float* masters[kMaxTensors];
  const float* steps[kMaxTensors];
  int64_t sizes[kMaxTensors];
  int32_t block_to_chunk[kMaxBlocks];  // chunk index within its tensor (< 2^31 chunks)
  uint8_t block_to_tensor[kMaxBlocks];
};

static_assert(sizeof(AdamTable) + sizeof(AdamOptions) + sizeof(int64_t) <= 4096,
              "kernel arguments must fit in 4 KiB");
static_assert(kMaxTensors <= 256, "block_to_tensor is a uint8_t");

// Per-block constants of the update (a block serves one tensor slot).
struct AdamCoeffs {
  float lr, step_size, bias_correction2_sqrt, grad_scale, clip_coef;
  bool has_grad_scale, has_weight_decay;
};

// The update of one element, the only copy of the math: the scalar loop passes pointers into the
// tensors, the vector loop pointers into register packs, so both paths give bit-identical results.
// master is read and written only if kMaster (param is then only written), max_exp_avg_sq only if
// kAmsgrad; the grad is stored back, unscaled, only when a grad_scale is given (never clipped:
// clip_coef is 1 without clipping, and x * 1.0f == x exactly).
template <bool kMaster, bool kAmsgrad, typename P, typename S>
__device__ __forceinline__ void adam_element(const AdamOptions& opt, const AdamCoeffs& c,
                                             P* grad, P* param, float* master, S* exp_avg,
                                             S* exp_avg_sq, S* max_exp_avg_sq) {
  float g = to_float(*grad);
  if (c.has_grad_scale) {
    g = g / c.grad_scale;
    *grad = from_float<P>(g);
  }
  g = g * c.clip_coef;
  if (opt.maximize) g = -g;
  float p = kMaster ? *master : to_float(*param);
  if (c.has_weight_decay) {
    if (opt.decoupled) {
      p = p * (1.0f - c.lr * opt.weight_decay);
    } else {
      g = g + opt.weight_decay * p;
    }
  }
  float m = to_float(*exp_avg);
  float v = to_float(*exp_avg_sq);
  m = m + (1.0f - opt.beta1) * (g - m);
  v = opt.beta2 * v + (1.0f - opt.beta2) * g * g;
  *exp_avg = from_float<S>(m);
  *exp_avg_sq = from_float<S>(v);
  if (kAmsgrad) {
    // torch.maximum: a NaN in either propagates (fmaxf would drop it)
    const float v_max = to_float(*max_exp_avg_sq);
    v = (v_max > v || isnan(v_max)) ? v_max : v;
    *max_exp_avg_sq = from_float<S>(v);
  }
  const float denom = sqrtf(v) / c.bias_correction2_sqrt + opt.eps;
  p = p - c.step_size * (m / denom);
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

// CTAs per SM asked of ptxas (__launch_bounds__'s second argument); 0 leaves the choice to
// ptxas. The scalar loop without a master copy fits 32 registers (4 CTAs of 512 threads) without
// spills; left to itself ptxas (nvcc 13.0) took 34-36 registers for fp32 (3 CTAs).
template <bool kMaster, bool kVec>
constexpr int adam_min_blocks() {
  return kVec || kMaster ? 0 : 4;
}

// kVec: the host checked chunk_size % 4 == 0 and the 4-element alignment of every array.
template <typename P, typename S, bool kMaster, bool kAmsgrad, bool kVec>
__global__ void __launch_bounds__(kThreads, (adam_min_blocks<kMaster, kVec>()))
    adam_kernel(const AdamTable table, const AdamOptions opt, const int64_t chunk_size) {
  if (opt.found_inf != nullptr && *opt.found_inf != 0.0f) return;
  const int slot = table.block_to_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_to_chunk[blockIdx.x]) * chunk_size;
  const int64_t n = table.sizes[slot];
  const int64_t end = begin + chunk_size < n ? begin + chunk_size : n;

  P* __restrict__ param = static_cast<P*>(table.params[slot]);
  P* __restrict__ grad = static_cast<P*>(table.grads[slot]);
  S* __restrict__ exp_avg = static_cast<S*>(table.exp_avgs[slot]);
  S* __restrict__ exp_avg_sq = static_cast<S*>(table.exp_avg_sqs[slot]);
  S* __restrict__ max_exp_avg_sq = kAmsgrad ? static_cast<S*>(table.max_exp_avg_sqs[slot]) : nullptr;
  float* __restrict__ master = kMaster ? table.masters[slot] : nullptr;

  const float step = *table.steps[slot];
  AdamCoeffs c;
  c.lr = opt.lr_ptr != nullptr ? *opt.lr_ptr : opt.lr;
  const float bias_correction1 = 1.0f - expf(step * logf(opt.beta1));
  c.bias_correction2_sqrt = sqrtf(1.0f - expf(step * logf(opt.beta2)));
  c.step_size = c.lr / bias_correction1;
  c.has_grad_scale = opt.grad_scale != nullptr;
  c.grad_scale = c.has_grad_scale ? *opt.grad_scale : 1.0f;
  c.clip_coef = opt.clip_coef != nullptr ? *opt.clip_coef : 1.0f;
  c.has_weight_decay = opt.weight_decay != 0.0f;

  if constexpr (kVec) {
    // begin is a multiple of 4 (chunk_size is); i + 4 <= end keeps every access below end.
    for (int64_t i = begin + 4 * threadIdx.x; i + 4 <= end; i += 4 * blockDim.x) {
      // every load of the iteration first: 4 or 5 independent vector loads in flight
      Pack4<P> g = load4(grad + i);
      Pack4<P> p;       // param: read unless kMaster, always written
      Pack4<float> pm;  // master (kMaster only)
      if constexpr (kMaster) {
        pm = load4(master + i);
      } else {
        p = load4(param + i);
      }
      Pack4<S> m = load4(exp_avg + i);
      Pack4<S> v = load4(exp_avg_sq + i);
      Pack4<S> v_max;
      if constexpr (kAmsgrad) v_max = load4(max_exp_avg_sq + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        adam_element<kMaster, kAmsgrad>(opt, c, &g.e[k], &p.e[k], &pm.e[k], &m.e[k], &v.e[k],
                                        &v_max.e[k]);
      }
      if (c.has_grad_scale) store4(grad + i, g);
      store4(exp_avg + i, m);
      store4(exp_avg_sq + i, v);
      if constexpr (kAmsgrad) store4(max_exp_avg_sq + i, v_max);
      if constexpr (kMaster) store4(master + i, pm);
      store4(param + i, p);
    }
    // The < 4 elements the vector loop left (only in a tensor's last chunk): one per thread.
    const int64_t i = begin + ((end - begin) & ~int64_t{3}) + threadIdx.x;
    if (i < end) {
      adam_element<kMaster, kAmsgrad>(opt, c, grad + i, param + i, kMaster ? master + i : nullptr,
                                      exp_avg + i, exp_avg_sq + i,
                                      kAmsgrad ? max_exp_avg_sq + i : nullptr);
    }
  } else {
    // Not unrolled: nvcc unrolled this loop 4x for fp32 (its remainder count a 64-bit division
    // by blockDim.x, a called subroutine) and ptxas then spilled at 32 registers on sm_80; the
    // unrolled copies kept each iteration's loads behind the previous one's stores anyway.
#pragma unroll 1
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      adam_element<kMaster, kAmsgrad>(opt, c, grad + i, param + i, kMaster ? master + i : nullptr,
                                      exp_avg + i, exp_avg_sq + i,
                                      kAmsgrad ? max_exp_avg_sq + i : nullptr);
    }
  }
}

// Whether ptr is aligned to 4 elements of T, as the vector loop needs.
template <typename T>
bool aligned4(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % (4 * sizeof(T)) == 0;
}

template <typename P, typename S, bool kMaster, bool kAmsgrad>
cudaError_t launch_tables(int64_t n, void* const* params, void* const* grads,
                          void* const* exp_avgs, void* const* exp_avg_sqs,
                          void* const* max_exp_avg_sqs, float* const* masters,
                          const float* const* steps, const int64_t* sizes,
                          const AdamOptions& opt, int64_t chunk_size, cudaStream_t stream) {
  // One decision per call: the vector path only if every array of every tensor allows it.
  bool vec = chunk_size % 4 == 0;
  for (int64_t i = 0; i < n && vec; ++i) {
    if (sizes[i] <= 0) continue;  // never dereferenced
    vec = aligned4<P>(params[i]) && aligned4<P>(grads[i]) && aligned4<S>(exp_avgs[i]) &&
          aligned4<S>(exp_avg_sqs[i]) && (!kAmsgrad || aligned4<S>(max_exp_avg_sqs[i])) &&
          (!kMaster || aligned4<float>(masters[i]));
  }
  const auto kernel = vec ? adam_kernel<P, S, kMaster, kAmsgrad, true>
                          : adam_kernel<P, S, kMaster, kAmsgrad, false>;

  AdamTable table;
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
    table.exp_avgs[slot] = exp_avgs[i];
    table.exp_avg_sqs[slot] = exp_avg_sqs[i];
    table.max_exp_avg_sqs[slot] = kAmsgrad ? max_exp_avg_sqs[i] : nullptr;
    table.masters[slot] = kMaster ? masters[i] : nullptr;
    table.steps[slot] = steps[i];
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
          table.exp_avgs[0] = table.exp_avgs[slot];
          table.exp_avg_sqs[0] = table.exp_avg_sqs[slot];
          table.max_exp_avg_sqs[0] = table.max_exp_avg_sqs[slot];
          table.masters[0] = table.masters[slot];
          table.steps[0] = table.steps[slot];
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
                           void* const* exp_avgs, void* const* exp_avg_sqs,
                           void* const* max_exp_avg_sqs, float* const* masters,
                           const float* const* steps, const int64_t* sizes,
                           const AdamOptions& opt, int64_t chunk_size, cudaStream_t stream) {
  const bool master = masters != nullptr;
#define FUSEDOPS_ADAM_LAUNCH(M, A)                                                       \
  return launch_tables<P, S, M, A>(n, params, grads, exp_avgs, exp_avg_sqs,              \
                                   max_exp_avg_sqs, masters, steps, sizes, opt, chunk_size, \
                                   stream)
  if (master && opt.amsgrad) FUSEDOPS_ADAM_LAUNCH(true, true);
  if (master) FUSEDOPS_ADAM_LAUNCH(true, false);
  if (opt.amsgrad) FUSEDOPS_ADAM_LAUNCH(false, true);
  FUSEDOPS_ADAM_LAUNCH(false, false);
#undef FUSEDOPS_ADAM_LAUNCH
}

}  // namespace

cudaError_t adam_multi_tensor(int64_t n, void* const* params, void* const* grads,
                              void* const* exp_avgs, void* const* exp_avg_sqs,
                              void* const* max_exp_avg_sqs, float* const* masters,
                              const float* const* steps, const int64_t* sizes, DType param_dtype,
                              DType state_dtype, const AdamOptions& options, int64_t chunk_size,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (chunk_size <= 0 || (options.amsgrad && max_exp_avg_sqs == nullptr)) {
    return cudaErrorInvalidValue;
  }
  for (int64_t i = 0; i < n; ++i) {  // before any launch: all or nothing is updated
    // block_to_chunk holds a tensor's chunk index as int32
    if (sizes[i] < 0 || (sizes[i] - 1) / chunk_size > INT32_MAX) return cudaErrorInvalidValue;
  }
  if (state_dtype == DType::kFloat32) {  // fp32 params, or fp16/bf16 params with fp32 state
    FUSEDOPS_DISPATCH_FLOAT(param_dtype,
                            return dispatch_flags<scalar_t, float>(
                                n, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                masters, steps, sizes, options, chunk_size, stream));
  }
  if (state_dtype != param_dtype || masters != nullptr) return cudaErrorInvalidValue;
  FUSEDOPS_DISPATCH_FLOAT(param_dtype,
                          return dispatch_flags<scalar_t, scalar_t>(
                              n, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters,
                              steps, sizes, options, chunk_size, stream));
  return cudaErrorInvalidValue;
}

}  // namespace fusedops
