// Swin window gathers: cyclic shift + window partition, and window reverse + cyclic shift, each
// one pass. A group of threads_per_row threads (one per vector of the row up to 32, not rounded
// up to a power of two) copies one pixel row of C channels from the source pixel it comes from,
// 16 bytes at a time where the row size and both pointers allow it (the copy is dtype-agnostic:
// only the element size matters). The source pixel is computed once per row with multiply-high
// divisions (32-bit while there are fewer than 2^31 rows, 64-bit division beyond); element
// offsets are 64-bit. The batch is folded into the row index of a grid-stride loop, so there is
// no grid-dimension cap on it; launched on the caller's stream.
#include <cstdint>

#include "device.cuh"
#include "window_process.h"

namespace fusedops {
namespace {

constexpr int kThreads = 256;

// Sizes of the map and its windows; shifts reduced to 0 <= shift < size.
template <typename Divider>
struct Geometry {
  int64_t height, width, window_h, window_w, windows_h, windows_w, shift_h, shift_w;
  Divider by_height, by_width, by_window_h, by_window_w, by_windows_h, by_windows_w;
};

__host__ __device__ __forceinline__ int64_t unshift(int64_t i, int64_t shift, int64_t size) {
  return i >= shift ? i - shift : i + size - shift;  // (i - shift) mod size
}

// The source pixel row of output pixel row `row`.
template <bool kReverse, typename Divider>
__host__ __device__ __forceinline__ int64_t source_row(int64_t row, const Geometry<Divider>& g) {
  if constexpr (kReverse) {  // row: pixel of the (B, H, W) map; source: a window pixel
    const int64_t t = g.by_width.div(row);
    const int64_t image = g.by_height.div(t);
    const int64_t h = unshift(t - image * g.height, g.shift_h, g.height);
    const int64_t w = unshift(row - t * g.width, g.shift_w, g.width);
    const int64_t wi = g.by_window_h.div(h);
    const int64_t wj = g.by_window_w.div(w);
    const int64_t window = (image * g.windows_h + wi) * g.windows_w + wj;
    return (window * g.window_h + (h - wi * g.window_h)) * g.window_w + (w - wj * g.window_w);
  } else {  // row: pixel of a window; source: a pixel of the (B, H, W) map
    const int64_t t1 = g.by_window_w.div(row);
    const int64_t t2 = g.by_window_h.div(t1);
    const int64_t t3 = g.by_windows_w.div(t2);
    const int64_t image = g.by_windows_h.div(t3);
    const int64_t i = t1 - t2 * g.window_h;
    const int64_t j = row - t1 * g.window_w;
    const int64_t h = unshift((t3 - image * g.windows_h) * g.window_h + i, g.shift_h, g.height);
    const int64_t w = unshift((t2 - t3 * g.windows_w) * g.window_w + j, g.shift_w, g.width);
    return (image * g.height + h) * g.width + w;
  }
}

template <typename V, bool kReverse, typename Divider>
__global__ void window_gather_kernel(const V* __restrict__ src, V* __restrict__ dst, int64_t rows,
                                     int64_t vecs_per_row, int threads_per_row,
                                     Geometry<Divider> g) {
  const int lane = threadIdx.x % threads_per_row;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
                        threads_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / threads_per_row;
  for (int64_t row = first; row < rows; row += stride) {
    const V* from = src + source_row<kReverse>(row, g) * vecs_per_row;
    V* to = dst + row * vecs_per_row;
    for (int64_t v = lane; v < vecs_per_row; v += threads_per_row) to[v] = from[v];
  }
}

template <typename Divider>
Geometry<Divider> make_geometry(int64_t height, int64_t width, int64_t window_h, int64_t window_w,
                                int64_t shift_h, int64_t shift_w) {
  const int64_t windows_h = height / window_h;
  const int64_t windows_w = width / window_w;
  return {height,          width,           window_h,           window_w,
          windows_h,       windows_w,       shift_h,            shift_w,
          Divider(height), Divider(width),  Divider(window_h),  Divider(window_w),
          Divider(windows_h), Divider(windows_w)};
}

// Threads per pixel row of `vecs` vectors (vecs >= 1): one per vector up to a warp's 32; past
// that, the count <= 32 that spreads the vectors evenly over the fewest passes (48: 24 threads x
// 2, not 32 threads idle for half the second pass). Not a power of two in general (C = 96 fp32 is
// 24 16-byte vectors: 24 threads, where rounding up to 32 left 25% of the lanes idle).
int threads_for_row(int64_t vecs) {
  if (vecs <= 32) return static_cast<int>(vecs);
  const int64_t passes = (vecs + 31) / 32;
  return static_cast<int>((vecs + passes - 1) / passes);
}

template <typename V, typename Divider>
cudaError_t launch(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                   const Geometry<Divider>& g, bool reverse, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  const int threads_per_row = threads_for_row(vecs);
  // A whole number of row groups per block: the kernel's lane (threadIdx.x % threads_per_row)
  // and row (global thread / threads_per_row) then agree, and the grid stride is exact.
  const int threads = kThreads - kThreads % threads_per_row;
  const unsigned int blocks = grid_blocks(rows * threads_per_row, threads);
  const V* s = static_cast<const V*>(src);
  V* d = static_cast<V*>(dst);
  if (reverse) {
    window_gather_kernel<V, true><<<blocks, threads, 0, stream>>>(s, d, rows, vecs,
                                                                   threads_per_row, g);
  } else {
    window_gather_kernel<V, false><<<blocks, threads, 0, stream>>>(s, d, rows, vecs,
                                                                    threads_per_row, g);
  }
  return cudaGetLastError();
}

// The widest access (16, 8, 4 or 2 bytes) that divides the row size and both addresses.
int access_bytes(const void* src, const void* dst, int64_t row_bytes) {
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  for (int bytes = 16; bytes > 2; bytes /= 2) {
    if (row_bytes % bytes == 0 && address(src) % bytes == 0 && address(dst) % bytes == 0) {
      return bytes;
    }
  }
  return 2;
}

template <typename Divider>
cudaError_t dispatch_width(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                           const Geometry<Divider>& g, bool reverse, cudaStream_t stream) {
  switch (access_bytes(src, dst, row_bytes)) {
    case 16:
      return launch<uint4>(src, dst, rows, row_bytes, g, reverse, stream);
    case 8:
      return launch<uint2>(src, dst, rows, row_bytes, g, reverse, stream);
    case 4:
      return launch<uint32_t>(src, dst, rows, row_bytes, g, reverse, stream);
    default:
      return launch<uint16_t>(src, dst, rows, row_bytes, g, reverse, stream);
  }
}

int element_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace

cudaError_t window_gather(const void* src, void* dst, int64_t batch, int64_t height,
                          int64_t width, int64_t channels, int64_t window_h, int64_t window_w,
                          int64_t shift_h, int64_t shift_w, bool reverse, DType dtype,
                          cudaStream_t stream) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return cudaErrorInvalidValue;
  }
  if (window_h < 1 || window_w < 1 || height % window_h || width % window_w ||
      shift_h < 0 || shift_h >= height || shift_w < 0 || shift_w >= width) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows = batch * height * width;
  if (rows == 0 || channels == 0) return cudaSuccess;
  const int64_t row_bytes = channels * element_bytes(dtype);
  if (rows < (int64_t{1} << 31) && height < (int64_t{1} << 31) && width < (int64_t{1} << 31)) {
    const auto g = make_geometry<FastDivider>(height, width, window_h, window_w, shift_h, shift_w);
    return dispatch_width(src, dst, rows, row_bytes, g, reverse, stream);
  }
  const auto g = make_geometry<WideDivider>(height, width, window_h, window_w, shift_h, shift_w);
  return dispatch_width(src, dst, rows, row_bytes, g, reverse, stream);
}

}  // namespace fusedops
