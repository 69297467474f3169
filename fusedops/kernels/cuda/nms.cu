// NMS and soft-NMS (the cores of fusedops/ops/nms.py; outputs as in ops/nms_reference.py).
//
// IoU in fp32 with round-to-nearest intrinsics (no fused multiply-add), the same operations in
// the same order as the reference, so IoU, nms and the naive / linear soft-NMS decays are
// bit-identical to it (the gaussian decay's expf differs from torch's exp in the last bits:
// within float rounding there):
//   area = (x2 - x1 + offset) * (y2 - y1 + offset)
//   iou  = inter / ((area_a + area_b) - inter),  inter = max(w, 0) * max(h, 0)
//
// nms: nms_mask_kernel writes, for every box i (rows, processing order), 64-bit words whose bit
// j says IoU(i, j) > threshold for a later box j of i's class; only words of the upper triangle
// and, with classes, of column blocks before col_end[row block] are written (and read).
// nms_walk_kernel (one block) walks the boxes 64 at a time: warp 0 skips blocks whose boxes
// are all removed, resolves a block's boxes against its diagonal words with warp shuffles and
// writes the kept positions; then all threads OR the kept rows into the removed words (shared
// memory) of the later columns. Two barriers per block holding a kept box; no host round trip.
//
// soft-NMS: one block per class segment, the segment's boxes, areas and scores in shared memory
// (in a global workspace when the segment does not fit). Each step is one pass: decay every
// live score by the previous pick, drop those below min_score (NaN marks a dropped box) and
// find the best live score (lowest position on ties); a butterfly reduction and one barrier
// give every thread the pick. When fewer than half of the stored boxes are live they are
// compacted (stable, so position order stays index order).
#include <climits>
#include <cmath>
#include <cstdint>

#include "device.cuh"
#include "nms.h"

namespace fusedops {
namespace {

constexpr int kWord = 64;
constexpr int kMaskThreads = 64;
constexpr int kMaskColumnGroups = 16;
constexpr int kWalkThreads = 512;
constexpr int kSoftThreads = 512;
constexpr int kSoftWarps = kSoftThreads / 32;
constexpr int64_t kSoftBytesPerBox = 7 * sizeof(float);  // x1 y1 x2 y2 area score position
constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float box_area(float x1, float y1, float x2, float y2, float offset) {
  return __fmul_rn(__fadd_rn(__fsub_rn(x2, x1), offset), __fadd_rn(__fsub_rn(y2, y1), offset));
}

// Intersection area of two boxes (max(w, 0) * max(h, 0)).
__device__ __forceinline__ float intersection(float ax1, float ay1, float ax2, float ay2,
                                              float bx1, float by1, float bx2, float by2,
                                              float offset) {
  const float w = __fadd_rn(__fsub_rn(fminf(ax2, bx2), fmaxf(ax1, bx1)), offset);
  const float h = __fadd_rn(__fsub_rn(fminf(ay2, by2), fmaxf(ay1, by1)), offset);
  return __fmul_rn(fmaxf(w, 0.0f), fmaxf(h, 0.0f));
}

__device__ __forceinline__ float iou_of(float inter, float area_a, float area_b) {
  return __fdiv_rn(inter, __fsub_rn(__fadd_rn(area_a, area_b), inter));
}

// Bits of the boxes that exist in 64-box block `block` of n boxes.
__device__ __forceinline__ uint64_t valid_bits(int64_t block, int64_t n) {
  const int64_t left = n - block * kWord;
  return left >= kWord ? ~0ull : (1ull << left) - 1;
}

// ---------------------------------------------------------------------------------------------
// nms

// Grid: (row blocks, column groups). Block (rb, g) computes the tiles (rb, cb) for
// cb = rb + g, rb + g + groups, ... below end; thread t owns row rb * 64 + t.
template <typename T, bool kBatched>
__global__ void __launch_bounds__(kMaskThreads)
    nms_mask_kernel(const T* __restrict__ boxes, const int64_t* __restrict__ classes,
                    const int64_t* __restrict__ col_end, uint64_t* __restrict__ mask, int64_t n,
                    int64_t col_blocks, float iou_threshold, float offset) {
  __shared__ float cols[kWord][5];
  __shared__ int64_t col_class[kWord];
  const int64_t rb = blockIdx.x;
  const int64_t end = kBatched ? col_end[rb] : col_blocks;
  const int64_t row = rb * kWord + threadIdx.x;
  const bool has_row = row < n;
  float rx1 = 0.f, ry1 = 0.f, rx2 = 0.f, ry2 = 0.f;
  if (has_row) {
    rx1 = to_float(boxes[row * 4]);
    ry1 = to_float(boxes[row * 4 + 1]);
    rx2 = to_float(boxes[row * 4 + 2]);
    ry2 = to_float(boxes[row * 4 + 3]);
  }
  const float r_area = box_area(rx1, ry1, rx2, ry2, offset);
  const int64_t r_class = kBatched && has_row ? classes[row] : 0;
  // IoU 0 (or NaN) never exceeds a threshold >= 0: skip the division when nothing overlaps.
  const bool skip_empty = iou_threshold >= 0.f;
  for (int64_t cb = rb + blockIdx.y; cb < end; cb += gridDim.y) {
    const int64_t col = cb * kWord + threadIdx.x;
    __syncthreads();  // the previous tile's columns are no longer read
    if (col < n) {
      const float x1 = to_float(boxes[col * 4]), y1 = to_float(boxes[col * 4 + 1]);
      const float x2 = to_float(boxes[col * 4 + 2]), y2 = to_float(boxes[col * 4 + 3]);
      cols[threadIdx.x][0] = x1;
      cols[threadIdx.x][1] = y1;
      cols[threadIdx.x][2] = x2;
      cols[threadIdx.x][3] = y2;
      cols[threadIdx.x][4] = box_area(x1, y1, x2, y2, offset);
      if (kBatched) col_class[threadIdx.x] = classes[col];
    }
    __syncthreads();
    if (!has_row) continue;
    const int64_t left = n - cb * kWord;
    const int count = left < kWord ? static_cast<int>(left) : kWord;
    uint64_t word = 0;
    for (int j = cb == rb ? threadIdx.x + 1 : 0; j < count; ++j) {
      if (kBatched && col_class[j] != r_class) continue;
      const float inter = intersection(rx1, ry1, rx2, ry2, cols[j][0], cols[j][1], cols[j][2],
                                       cols[j][3], offset);
      if (skip_empty && inter == 0.f) continue;
      if (iou_of(inter, r_area, cols[j][4]) > iou_threshold) word |= 1ull << j;
    }
    mask[row * col_blocks + cb] = word;
  }
}

template <bool kBatched>
__global__ void __launch_bounds__(kWalkThreads)
    nms_walk_kernel(const uint64_t* __restrict__ mask, const int64_t* __restrict__ col_end,
                    int64_t n, int64_t col_blocks, int64_t* __restrict__ positions,
                    int64_t* __restrict__ count_out) {
  extern __shared__ uint64_t removed[];
  __shared__ int64_t shared_block, shared_end, shared_count;
  __shared__ uint64_t shared_kept;
  for (int64_t c = threadIdx.x; c < col_blocks; c += blockDim.x) removed[c] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  int64_t block = 0, count = 0;  // used by warp 0
  while (true) {
    if (threadIdx.x < 32) {
      while (block < col_blocks) {  // next block holding a box not yet removed
        const int64_t c = block + lane;
        const bool open = c < col_blocks && (~removed[c] & valid_bits(c, n)) != 0;
        const unsigned ballot = __ballot_sync(kFullWarp, open);
        if (ballot) {
          block += __ffs(ballot) - 1;
          break;
        }
        block += 32;
      }
      uint64_t kept = 0;
      if (block < col_blocks) {
        const int64_t row0 = block * kWord;
        const uint64_t* diagonal = mask + block;
        const uint64_t low = row0 + lane < n ? diagonal[(row0 + lane) * col_blocks] : 0;
        const uint64_t high = row0 + 32 + lane < n ? diagonal[(row0 + 32 + lane) * col_blocks] : 0;
        uint64_t gone = removed[block] | ~valid_bits(block, n);
        while (~gone) {  // the same on every lane: kept boxes in order
          const int i = __ffsll(static_cast<long long>(~gone)) - 1;
          kept |= 1ull << i;
          gone |= __shfl_sync(kFullWarp, i < 32 ? low : high, i & 31) | (1ull << i);
        }
        for (int bit = lane; bit < kWord; bit += 32) {
          if ((kept >> bit) & 1) {
            positions[count + __popcll(kept & ((1ull << bit) - 1))] = row0 + bit;
          }
        }
        count += __popcll(kept);
      }
      if (lane == 0) {
        shared_block = block;
        shared_kept = kept;
        shared_end = block < col_blocks ? (kBatched ? col_end[block] : col_blocks) : 0;
        shared_count = count;
      }
    }
    __syncthreads();
    const int64_t current = shared_block;
    if (current >= col_blocks) break;
    const uint64_t kept = shared_kept;
    const int64_t end = shared_end;
    const uint64_t* rows = mask + current * kWord * col_blocks;
    for (int64_t c = current + 1 + threadIdx.x; c < end; c += blockDim.x) {
      uint64_t word = removed[c];
      for (uint64_t bits = kept; bits; bits &= bits - 1) {
        word |= rows[(__ffsll(static_cast<long long>(bits)) - 1) * col_blocks + c];
      }
      removed[c] = word;
    }
    __syncthreads();
    block = current + 1;
  }
  const int64_t total = shared_count;
  for (int64_t p = total + threadIdx.x; p < n; p += blockDim.x) positions[p] = n;
  if (threadIdx.x == 0) *count_out = total;
}

template <typename T, bool kBatched>
cudaError_t launch_nms(const void* boxes, const int64_t* classes, const int64_t* col_end,
                       uint64_t* mask, int64_t n, float iou_threshold, float offset,
                       int64_t* positions, int64_t* count, cudaStream_t stream) {
  const int64_t col_blocks = (n + kWord - 1) / kWord;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(col_blocks < kMaskColumnGroups ? col_blocks
                                                                       : kMaskColumnGroups));
  nms_mask_kernel<T, kBatched><<<grid, kMaskThreads, 0, stream>>>(
      static_cast<const T*>(boxes), classes, col_end, mask, n, col_blocks, iou_threshold, offset);
  const size_t shared = static_cast<size_t>(col_blocks) * sizeof(uint64_t);
  if (shared > 48 * 1024) {
    const cudaError_t status = cudaFuncSetAttribute(
        nms_walk_kernel<kBatched>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared));
    if (status != cudaSuccess) return status;
  }
  nms_walk_kernel<kBatched><<<1, kWalkThreads, shared, stream>>>(mask, col_end, n, col_blocks,
                                                                 positions, count);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// soft-NMS

// A segment's boxes as arrays of `capacity` entries in shared memory or the workspace.
struct SoftStore {
  float *x1, *y1, *x2, *y2, *area, *score;
  int* position;

  __device__ SoftStore(float* base, int64_t capacity)
      : x1(base),
        y1(base + capacity),
        x2(base + 2 * capacity),
        y2(base + 3 * capacity),
        area(base + 4 * capacity),
        score(base + 5 * capacity),
        position(reinterpret_cast<int*>(base + 6 * capacity)) {}
};

__device__ __forceinline__ float soft_weight(float iou, const SoftNmsOptions& options) {
  if (options.method == 2) return expf(__fdiv_rn(-__fmul_rn(iou, iou), options.sigma));
  if (iou >= options.iou_threshold) return options.method == 1 ? __fsub_rn(1.0f, iou) : 0.0f;
  return 1.0f;
}

// (score, item) of the better candidate: higher score, then lower item.
struct Best {
  float score;
  int item;
  int live;

  __device__ void take(float other_score, int other_item) {
    if (other_score > score || (other_score == score && other_item < item)) {
      score = other_score;
      item = other_item;
    }
  }

  __device__ void reduce_warp() {
    for (int shift = 16; shift > 0; shift >>= 1) {
      const float other_score = __shfl_xor_sync(kFullWarp, score, shift);
      const int other_item = __shfl_xor_sync(kFullWarp, item, shift);
      live += __shfl_xor_sync(kFullWarp, live, shift);
      take(other_score, other_item);
    }
  }
};

// Moves the live boxes (not NaN, not `skip`) of `store` to its front, in order; returns their
// number. scan: kSoftWarps ints of shared memory.
__device__ int compact(SoftStore& store, int items, int skip, int* scan) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int written = 0;
  for (int base = 0; base < items; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const bool keep = i < items && i != skip && !isnan(store.score[i]);
    const unsigned ballot = __ballot_sync(kFullWarp, keep);
    if (lane == 0) scan[warp] = __popc(ballot);
    __syncthreads();  // every thread has read its box's score
    int before = 0, total = 0;
    for (int w = 0; w < kSoftWarps; ++w) {
      before += w < warp ? scan[w] : 0;
      total += scan[w];
    }
    float x1 = 0.f, y1 = 0.f, x2 = 0.f, y2 = 0.f, area = 0.f, score = 0.f;
    int position = 0;
    if (keep) {
      x1 = store.x1[i], y1 = store.y1[i], x2 = store.x2[i], y2 = store.y2[i];
      area = store.area[i], score = store.score[i], position = store.position[i];
    }
    __syncthreads();  // the chunk is read before any of it is overwritten
    if (keep) {
      const int to = written + before + __popc(ballot & ((1u << lane) - 1));
      store.x1[to] = x1, store.y1[to] = y1, store.x2[to] = x2, store.y2[to] = y2;
      store.area[to] = area, store.score[to] = score, store.position[to] = position;
    }
    written += total;
  }
  __syncthreads();
  return written;
}

template <typename T>
__global__ void __launch_bounds__(kSoftThreads)
    soft_nms_kernel(const T* __restrict__ boxes, const float* __restrict__ scores,
                    const int64_t* __restrict__ seg_starts, int64_t shared_items,
                    float* __restrict__ workspace, int64_t n, SoftNmsOptions options,
                    int64_t* __restrict__ positions, float* __restrict__ picked,
                    int64_t* __restrict__ counts) {
  extern __shared__ float shared[];
  __shared__ float best_score[2][kSoftWarps];
  __shared__ int best_item[2][kSoftWarps], best_live[2][kSoftWarps], scan[kSoftWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t start = seg_starts[blockIdx.x];
  const int length = static_cast<int>(seg_starts[blockIdx.x + 1] - start);
  SoftStore store(length <= shared_items ? shared : workspace + 7 * start, length);
  for (int i = threadIdx.x; i < length; i += blockDim.x) {
    const T* box = boxes + (start + i) * 4;
    const float x1 = to_float(box[0]), y1 = to_float(box[1]);
    const float x2 = to_float(box[2]), y2 = to_float(box[3]);
    store.x1[i] = x1, store.y1[i] = y1, store.x2[i] = x2, store.y2[i] = y2;
    store.area[i] = box_area(x1, y1, x2, y2, options.offset);
    store.score[i] = scores[start + i];
    store.position[i] = i;
  }
  __syncthreads();
  int items = length, pick = -1, emitted = 0, buffer = 0;
  float px1 = 0.f, py1 = 0.f, px2 = 0.f, py2 = 0.f, p_area = 0.f;
  while (true) {
    Best best{-INFINITY, INT_MAX, 0};
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
      float score = store.score[i];
      if (isnan(score)) continue;
      if (emitted > 0) {  // decay by the previous pick, drop below min_score
        if (i == pick) {
          store.score[i] = NAN;
          continue;
        }
        const float inter = intersection(px1, py1, px2, py2, store.x1[i], store.y1[i],
                                         store.x2[i], store.y2[i], options.offset);
        float iou = iou_of(inter, p_area, store.area[i]);
        if (isnan(iou)) iou = 0.0f;
        const float weight = soft_weight(iou, options);
        if (weight != 1.0f) score = __fmul_rn(score, weight);
        if (!(score >= options.min_score)) {
          store.score[i] = NAN;
          continue;
        }
        if (weight != 1.0f) store.score[i] = score;
      }
      ++best.live;
      best.take(score, i);
    }
    best.reduce_warp();
    if (lane == 0) {
      best_score[buffer][warp] = best.score;
      best_item[buffer][warp] = best.item;
      best_live[buffer][warp] = best.live;
    }
    __syncthreads();
    const bool has = lane < kSoftWarps;
    Best block{has ? best_score[buffer][lane] : -INFINITY, has ? best_item[buffer][lane] : INT_MAX,
               has ? best_live[buffer][lane] : 0};
    block.reduce_warp();
    buffer ^= 1;
    if (block.item == INT_MAX) break;
    pick = block.item;
    if (threadIdx.x == 0) {
      positions[start + emitted] = start + store.position[pick];
      picked[start + emitted] = block.score;
    }
    ++emitted;
    px1 = store.x1[pick], py1 = store.y1[pick], px2 = store.x2[pick], py2 = store.y2[pick];
    p_area = store.area[pick];
    if (2 * block.live < items && items > 2 * kSoftThreads) {
      items = compact(store, items, pick, scan);
      pick = -1;
    }
  }
  for (int i = emitted + threadIdx.x; i < length; i += blockDim.x) {
    positions[start + i] = n;
    picked[start + i] = 0.0f;
  }
  if (threadIdx.x == 0) counts[blockIdx.x] = emitted;
}

template <typename T>
cudaError_t launch_soft_nms(const void* boxes, const float* scores, const int64_t* seg_starts,
                            int64_t n_segments, int64_t n, int64_t longest, float* workspace,
                            int64_t* positions, float* picked, int64_t* counts,
                            const SoftNmsOptions& options, cudaStream_t stream) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const int64_t capacity = soft_nms_shared_items(device);
  const int64_t shared_items = longest < capacity ? longest : capacity;
  if (longest > shared_items && workspace == nullptr) return cudaErrorInvalidValue;
  const size_t shared = static_cast<size_t>(shared_items) * kSoftBytesPerBox;
  if (shared > 48 * 1024) {
    status = cudaFuncSetAttribute(soft_nms_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(shared));
    if (status != cudaSuccess) return status;
  }
  soft_nms_kernel<T><<<static_cast<unsigned>(n_segments), kSoftThreads, shared, stream>>>(
      static_cast<const T*>(boxes), scores, seg_starts, shared_items, workspace, n, options,
      positions, picked, counts);
  return cudaGetLastError();
}

}  // namespace

int64_t soft_nms_shared_items(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
      cudaSuccess) {
    bytes = 48 * 1024;
  }
  const int64_t reserved = 1024;  // the kernel's static shared memory
  return (bytes - reserved) / kSoftBytesPerBox;
}

cudaError_t nms_walk(const void* boxes, const int64_t* classes, const int64_t* col_end,
                     uint64_t* mask, int64_t n, float iou_threshold, float offset,
                     int64_t* positions, int64_t* count, DType dtype, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (classes != nullptr) {
    FUSEDOPS_DISPATCH_FLOAT(dtype, return (launch_nms<scalar_t, true>(
                                       boxes, classes, col_end, mask, n, iou_threshold, offset,
                                       positions, count, stream)));
  }
  FUSEDOPS_DISPATCH_FLOAT(dtype, return (launch_nms<scalar_t, false>(
                                     boxes, nullptr, nullptr, mask, n, iou_threshold, offset,
                                     positions, count, stream)));
  return cudaErrorInvalidValue;
}

cudaError_t soft_nms_segments(const void* boxes, const float* scores, const int64_t* seg_starts,
                              int64_t n_segments, int64_t n, int64_t longest, float* workspace,
                              int64_t* positions, float* picked, int64_t* counts,
                              const SoftNmsOptions& options, DType dtype, cudaStream_t stream) {
  if (n == 0 || n_segments == 0) return cudaSuccess;
  FUSEDOPS_DISPATCH_FLOAT(dtype, return launch_soft_nms<scalar_t>(
                                     boxes, scores, seg_starts, n_segments, n, longest,
                                     workspace, positions, picked, counts, options, stream));
  return cudaErrorInvalidValue;
}

}  // namespace fusedops
