// deform_conv2d (DCNv1/DCNv2) kernels for the CUDA path; the host steps around them (cuBLAS
// products, the deterministic path's sort) are kernels/deform_conv2d_host.py's, shared with the
// Triton backend, whose kernels these mirror.
//
// A sample is (image b, offset group g, kernel point k, output pixel l), flattened as
// ((b * G + g) * K + k) * L + l. Its position is y = oy * stride_h - pad_h + (k / kw) * dil_h +
// dy, x likewise with dx (dy, dx = offset[b][2 (g K + k)][oy][ox], offset[...][+1][...]); a
// sample with y <= -1, y >= H, x <= -1 or x >= W is 0, else each corner (floor(y) + {0, 1},
// floor(x) + {0, 1}) inside the image counts with its bilinear weight. Columns are laid out
// (C * K, B * L): row c * K + k, column b * L + l.
//
// - columns: one thread per sample computes the corners once and writes its group's channels'
//   masked samples;
// - sample_grads: one thread per sample sums, over its group's channels, grad_columns times the
//   corner values (grad_mask) and times the bilinear weights' derivatives (grad_offset, times the
//   mask): each written by that thread only. Then either fp32 atomics add grad_columns * mask *
//   corner weight into grad_input, or the thread writes, per corner, its destination key
//   ((b * G + g) * H * W + pixel; B * G * H * W for a corner outside the image) and coefficient
//   (mask * corner weight) for the deterministic path;
// - segment_gather (deterministic grad_input): one thread per input element (b, c, pixel) sums,
//   in the stably sorted order, grad_columns * coefficient over the entries of its segment
//   (b, c's group, pixel) of the sorted keys.
//
// Math and accumulation in fp32 whatever the dtype. Element offsets are 64-bit; the index
// decoding divides with 32-bit multiply-highs while the sample and element counts stay below
// 2^31, with 64-bit division beyond. Grid-stride loops on a 1-D grid (grid_blocks caps it), on
// the caller's stream.
#include <cstdint>

#include "device.cuh"
#include "deform_conv2d.h"

namespace fusedops {
namespace {

constexpr int kThreads = 256;

// The call's sizes with their dividers (FastDivider while every dividend stays below 2^31).
template <typename Divider>
struct Sizes {
  int64_t batch, channels, group_channels, groups, height, width, kw, points, pixels, w_out;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  Divider by_pixels, by_points, by_groups, by_w_out, by_kw, by_plane, by_channels,
      by_group_channels;

  explicit Sizes(const DeformConvGeometry& g)
      : batch(g.batch), channels(g.channels), group_channels(g.channels / g.offset_groups),
        groups(g.offset_groups), height(g.height), width(g.width), kw(g.kw),
        points(g.kh * g.kw), pixels(g.h_out * g.w_out), w_out(g.w_out), stride_h(g.stride_h),
        stride_w(g.stride_w), pad_h(g.pad_h), pad_w(g.pad_w), dil_h(g.dil_h), dil_w(g.dil_w),
        by_pixels(g.h_out * g.w_out), by_points(g.kh * g.kw), by_groups(g.offset_groups),
        by_w_out(g.w_out), by_kw(g.kw), by_plane(g.height * g.width), by_channels(g.channels),
        by_group_channels(g.channels / g.offset_groups) {}

  __host__ __device__ __forceinline__ int64_t samples() const {
    return batch * groups * points * pixels;
  }
  // Distance between a channel's rows of the columns (C * K, B * L): K * B * L.
  __host__ __device__ __forceinline__ int64_t channel_stride() const {
    return points * batch * pixels;
  }
};

// One sample's position, bilinear corner and weights.
struct Sample {
  int64_t bg, k, l;
  int64_t plane;                // offset of its group's first channel plane in the input
  int64_t column;               // offset of its group's first channel in the columns
  int64_t corner;               // y0 * W + x0 (0 for a sample outside the image)
  float ly, lx, hy, hx, m;      // fractions of y and x, 1 - them; the mask (1 without one)
  bool ok00, ok01, ok10, ok11;  // which corners lie inside the image
};

template <typename T, typename Divider>
__device__ __forceinline__ Sample decode(int64_t pos, const T* __restrict__ offset,
                                         const T* __restrict__ mask, const Sizes<Divider>& s) {
  Sample r;
  const int64_t t = s.by_pixels.div(pos);
  r.l = pos - t * s.pixels;
  r.bg = s.by_points.div(t);
  r.k = t - r.bg * s.points;
  const int64_t b = s.by_groups.div(r.bg);
  const int64_t g = r.bg - b * s.groups;
  const int64_t oy = s.by_w_out.div(r.l);
  const int64_t ox = r.l - oy * s.w_out;
  const int64_t ki = s.by_kw.div(r.k);
  const int64_t kj = r.k - ki * s.kw;
  const int64_t base = (r.bg * s.points + r.k) * 2 * s.pixels + r.l;
  const float y = static_cast<float>(oy * s.stride_h - s.pad_h + ki * s.dil_h) +
                  to_float(offset[base]);
  const float x = static_cast<float>(ox * s.stride_w - s.pad_w + kj * s.dil_w) +
                  to_float(offset[base + s.pixels]);
  const bool inside = y > -1.0f && y < static_cast<float>(s.height) && x > -1.0f &&
                      x < static_cast<float>(s.width);
  const float yf = floorf(y);
  const float xf = floorf(x);
  r.ly = y - yf;
  r.lx = x - xf;
  r.hy = 1.0f - r.ly;
  r.hx = 1.0f - r.lx;
  const int64_t y0 = inside ? static_cast<int64_t>(yf) : 0;
  const int64_t x0 = inside ? static_cast<int64_t>(xf) : 0;
  const bool top = inside && y0 >= 0;
  const bool bottom = inside && y0 + 1 < s.height;
  const bool left = x0 >= 0;
  const bool right = x0 + 1 < s.width;
  r.ok00 = top && left;
  r.ok01 = top && right;
  r.ok10 = bottom && left;
  r.ok11 = bottom && right;
  r.corner = y0 * s.width + x0;
  r.plane = (b * s.channels + g * s.group_channels) * s.height * s.width;
  r.column = (g * s.group_channels * s.points + r.k) * s.batch * s.pixels + b * s.pixels + r.l;
  r.m = mask != nullptr ? to_float(mask[(r.bg * s.points + r.k) * s.pixels + r.l]) : 1.0f;
  return r;
}

// The four corner values of channel plane `src` (0 for a corner outside the image).
struct Corners {
  float v00, v01, v10, v11;
};

template <typename T>
__device__ __forceinline__ Corners load_corners(const T* __restrict__ src, const Sample& p,
                                                int64_t width) {
  return {p.ok00 ? to_float(src[0]) : 0.0f, p.ok01 ? to_float(src[1]) : 0.0f,
          p.ok10 ? to_float(src[width]) : 0.0f, p.ok11 ? to_float(src[width + 1]) : 0.0f};
}

// Runs body(pos, sample) for this thread's samples (grid-stride).
template <typename T, typename Divider, typename Body>
__device__ __forceinline__ void for_each_sample(const T* __restrict__ offset,
                                                const T* __restrict__ mask,
                                                const Sizes<Divider>& s, Body body) {
  const int64_t n = s.samples();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t pos = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pos < n;
       pos += step) {
    body(pos, decode(pos, offset, mask, s));
  }
}

template <typename T, typename Divider>
__global__ void columns_kernel(const T* __restrict__ input, const T* __restrict__ offset,
                               const T* __restrict__ mask, T* __restrict__ columns,
                               Sizes<Divider> s) {
  for_each_sample(offset, mask, s, [&](int64_t, const Sample& p) {
    const float w00 = p.hy * p.hx * p.m, w01 = p.hy * p.lx * p.m;
    const float w10 = p.ly * p.hx * p.m, w11 = p.ly * p.lx * p.m;
    const T* src = input + p.plane + p.corner;
    T* dst = columns + p.column;
    for (int64_t c = 0; c < s.group_channels; ++c) {
      const Corners v = load_corners(src, p, s.width);
      dst[c * s.channel_stride()] =
          from_float<T>(w00 * v.v00 + w01 * v.v01 + w10 * v.v10 + w11 * v.v11);
      src += s.height * s.width;
    }
  });
}

template <typename T, bool kAtomic, typename Divider>
__global__ void sample_grads_kernel(const T* __restrict__ grad_columns,
                                    const T* __restrict__ input, const T* __restrict__ offset,
                                    const T* __restrict__ mask, T* __restrict__ grad_offset,
                                    T* __restrict__ grad_mask, float* __restrict__ grad_input,
                                    int64_t* __restrict__ keys, float* __restrict__ coefs,
                                    Sizes<Divider> s) {
  const int64_t plane_size = s.height * s.width;
  for_each_sample(offset, mask, s, [&](int64_t pos, const Sample& p) {
    const float hy = p.hy, hx = p.hx, ly = p.ly, lx = p.lx;
    float acc_m = 0.0f, acc_y = 0.0f, acc_x = 0.0f;
    const T* gc_ptr = grad_columns + p.column;
    int64_t at = p.plane + p.corner;
    for (int64_t c = 0; c < s.group_channels; ++c) {
      const float gc = to_float(gc_ptr[c * s.channel_stride()]);
      const Corners v = load_corners(input + at, p, s.width);
      acc_m += gc * (hy * (hx * v.v00 + lx * v.v01) + ly * (hx * v.v10 + lx * v.v11));
      acc_y += gc * (hx * (v.v10 - v.v00) + lx * (v.v11 - v.v01));
      acc_x += gc * (hy * (v.v01 - v.v00) + ly * (v.v11 - v.v10));
      if constexpr (kAtomic) {
        const float gm = gc * p.m;
        if (p.ok00) atomicAdd(grad_input + at, gm * hy * hx);
        if (p.ok01) atomicAdd(grad_input + at + 1, gm * hy * lx);
        if (p.ok10) atomicAdd(grad_input + at + s.width, gm * ly * hx);
        if (p.ok11) atomicAdd(grad_input + at + s.width + 1, gm * ly * lx);
      }
      at += plane_size;
    }
    const int64_t point = p.bg * s.points + p.k;
    const int64_t base = point * 2 * s.pixels + p.l;
    grad_offset[base] = from_float<T>(acc_y * p.m);
    grad_offset[base + s.pixels] = from_float<T>(acc_x * p.m);
    if (grad_mask != nullptr) grad_mask[point * s.pixels + p.l] = from_float<T>(acc_m);
    if constexpr (!kAtomic) {
      const int64_t none = s.batch * s.groups * plane_size;
      const int64_t key = p.bg * plane_size + p.corner;
      const int64_t entry = pos * 4;
      keys[entry] = p.ok00 ? key : none;
      keys[entry + 1] = p.ok01 ? key + 1 : none;
      keys[entry + 2] = p.ok10 ? key + s.width : none;
      keys[entry + 3] = p.ok11 ? key + s.width + 1 : none;
      coefs[entry] = p.m * hy * hx;
      coefs[entry + 1] = p.m * hy * lx;
      coefs[entry + 2] = p.m * ly * hx;
      coefs[entry + 3] = p.m * ly * lx;
    }
  });
}

// grad_input element i = (b * C + c) * H * W + pixel: the sum over its segment's entries.
template <typename T, typename Divider>
__global__ void segment_gather_kernel(const T* __restrict__ grad_columns,
                                      const int64_t* __restrict__ order,
                                      const float* __restrict__ coefs,
                                      const int64_t* __restrict__ starts,
                                      T* __restrict__ grad_input, Sizes<Divider> s) {
  const int64_t plane_size = s.height * s.width;
  const int64_t n = s.batch * s.channels * plane_size;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t columns = s.batch * s.pixels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const int64_t bc = s.by_plane.div(i);
    const int64_t pixel = i - bc * plane_size;
    const int64_t b = s.by_channels.div(bc);
    const int64_t c = bc - b * s.channels;
    const int64_t segment = (b * s.groups + s.by_group_channels.div(c)) * plane_size + pixel;
    const int64_t end = starts[segment + 1];
    const T* row = grad_columns + c * s.channel_stride() + b * s.pixels;
    float acc = 0.0f;
    for (int64_t e = starts[segment]; e < end; ++e) {
      const int64_t entry = order[e];
      const int64_t sample = entry >> 2;
      const int64_t t = s.by_pixels.div(sample);
      const int64_t point = t - s.by_points.div(t) * s.points;
      acc += coefs[entry] * to_float(row[point * columns + (sample - t * s.pixels)]);
    }
    grad_input[i] = from_float<T>(acc);
  }
}

// ---- host launchers (tests/test_deform_conv2d_cuda_host.py compiles what precedes this line)

// Runs launch(Sizes<FastDivider>) while every dividend fits 31 bits, launch(Sizes<WideDivider>)
// otherwise.
template <typename Launch>
cudaError_t with_sizes(const DeformConvGeometry& g, Launch launch) {
  const int64_t limit = int64_t{1} << 31;
  const int64_t samples = g.batch * g.offset_groups * g.kh * g.kw * g.h_out * g.w_out;
  const int64_t elements = g.batch * g.channels * g.height * g.width;
  if (samples < limit && elements < limit) {
    launch(Sizes<FastDivider>(g));
  } else {
    launch(Sizes<WideDivider>(g));
  }
  return cudaGetLastError();
}

bool valid(const DeformConvGeometry& g) {
  return g.batch >= 0 && g.channels > 0 && g.height > 0 && g.width > 0 && g.offset_groups > 0 &&
         g.channels % g.offset_groups == 0 && g.kh > 0 && g.kw > 0 && g.h_out > 0 &&
         g.w_out > 0 && g.stride_h > 0 && g.stride_w > 0 && g.pad_h >= 0 && g.pad_w >= 0 &&
         g.dil_h > 0 && g.dil_w > 0;
}

}  // namespace

cudaError_t deform_conv2d_columns(const void* input, const void* offset, const void* mask,
                                  void* columns, const DeformConvGeometry& geometry, DType dtype,
                                  cudaStream_t stream) {
  if (!valid(geometry)) return cudaErrorInvalidValue;
  const int64_t samples = geometry.batch * geometry.offset_groups * geometry.kh * geometry.kw *
                          geometry.h_out * geometry.w_out;
  if (samples == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, return with_sizes(geometry, [&](auto s) {
    columns_kernel<<<grid_blocks(samples, kThreads), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(input), static_cast<const scalar_t*>(offset),
        static_cast<const scalar_t*>(mask), static_cast<scalar_t*>(columns), s);
  }));
}

cudaError_t deform_conv2d_sample_grads(const void* grad_columns, const void* input,
                                       const void* offset, const void* mask, void* grad_offset,
                                       void* grad_mask, float* grad_input, int64_t* keys,
                                       float* coefs, const DeformConvGeometry& geometry,
                                       DType dtype, cudaStream_t stream) {
  if (!valid(geometry) || (mask == nullptr) != (grad_mask == nullptr) ||
      (grad_input == nullptr) == (keys == nullptr || coefs == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t samples = geometry.batch * geometry.offset_groups * geometry.kh * geometry.kw *
                          geometry.h_out * geometry.w_out;
  if (samples == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, return with_sizes(geometry, [&](auto s) {
    const auto* gc = static_cast<const scalar_t*>(grad_columns);
    const auto* x = static_cast<const scalar_t*>(input);
    const auto* off = static_cast<const scalar_t*>(offset);
    const auto* m = static_cast<const scalar_t*>(mask);
    auto* go = static_cast<scalar_t*>(grad_offset);
    auto* gm = static_cast<scalar_t*>(grad_mask);
    const unsigned int blocks = grid_blocks(samples, kThreads);
    if (grad_input != nullptr) {
      sample_grads_kernel<scalar_t, true><<<blocks, kThreads, 0, stream>>>(
          gc, x, off, m, go, gm, grad_input, nullptr, nullptr, s);
    } else {
      sample_grads_kernel<scalar_t, false><<<blocks, kThreads, 0, stream>>>(
          gc, x, off, m, go, gm, nullptr, keys, coefs, s);
    }
  }));
}

cudaError_t deform_conv2d_segment_gather(const void* grad_columns, const int64_t* order,
                                         const float* coefs, const int64_t* starts,
                                         void* grad_input, const DeformConvGeometry& geometry,
                                         DType dtype, cudaStream_t stream) {
  if (!valid(geometry)) return cudaErrorInvalidValue;
  const int64_t elements = geometry.batch * geometry.channels * geometry.height * geometry.width;
  if (elements == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, return with_sizes(geometry, [&](auto s) {
    segment_gather_kernel<<<grid_blocks(elements, kThreads), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(grad_columns), order, coefs, starts,
        static_cast<scalar_t*>(grad_input), s);
  }));
}

}  // namespace fusedops
