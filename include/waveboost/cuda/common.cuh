// Shared CUDA helpers for every waveboost kernel path: element conversions, the 16 B copy
// check, launch grids, split-KV sizing, error checks, device guard; through core/, the named
// constants, the block locator (core/sequence.cuh) and the key masks (core/mask.cuh). Kernel
// templates include this; host code that only dispatches includes src/cuda/cuda_paths.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "waveboost/attention.h"
#include "waveboost/cuda/core/constants.cuh"
#include "waveboost/cuda/core/mask.cuh"
#include "waveboost/cuda/core/sequence.cuh"

namespace waveboost::cuda {

// Element type <-> float, the accumulation type of every CUDA path.
template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two floats rounded to a 16-bit element type, `lo` in the low 16 bits (the lower column index).
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  }
  return bits;
}

// The flash paths move tiles in 16 B pieces (cp.async or vector loads in, vector stores out):
// each base pointer must be 16 B aligned and every stride a multiple of `elements_per_16B`
// elements. A stride of a dimension of extent 1 is never applied and does not count.
__host__ __device__ inline bool vector_friendly(const AttentionParams& p, int64_t elements_per_16B) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const auto used = [](int64_t stride, int64_t extent) { return extent > 1 ? stride : int64_t{0}; };
  // Sequence layouts: packed q / out (cu_seqlens_q) step rows across sequences and no batches;
  // likewise packed k / v (cu_seqlens_k); a paged K / V steps pages (num_pages) and page rows.
  const bool packed_q = p.cu_seqlens_q != nullptr;
  const bool packed_k = p.cu_seqlens_k != nullptr;
  const bool paged = p.block_table != nullptr;
  const int64_t q_batches = packed_q ? 1 : p.batch;
  const int64_t q_rows = packed_q && p.batch > 1 ? 2 : p.seqlen_q;
  const int64_t kv_batches = paged ? p.num_pages : (packed_k ? 1 : p.batch);
  const int64_t kv_rows = paged ? p.page_size : (packed_k && p.batch > 1 ? 2 : p.seqlen_k);
  const int64_t strides = used(p.q_batch_stride, q_batches) | used(p.q_row_stride, q_rows) |
                          used(p.q_head_stride, p.heads) | used(p.o_batch_stride, q_batches) |
                          used(p.o_row_stride, q_rows) | used(p.o_head_stride, p.heads) |
                          used(p.k_batch_stride, kv_batches) | used(p.k_row_stride, kv_rows) |
                          used(p.k_head_stride, p.heads_kv) | used(p.v_batch_stride, kv_batches) |
                          used(p.v_row_stride, kv_rows) | used(p.v_head_stride, p.heads_kv);
  return aligned(p.q) && aligned(p.k) && aligned(p.v) && aligned(p.out) && (strides & (elements_per_16B - 1)) == 0;
}

// "8.6" for compute capability 86, for messages.
inline std::string cc_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Ok, or why tensor-core flash path `backend` cannot run p's sequence layout (varlen, seqused_k,
// paged K/V; core/sequence.cuh): those kernels are 16-bit only, address pages with shifts
// (page sizes that are powers of two, multiples of `page_multiple` keys) and index a
// sequence's keys in 32 bits. Dense params: Ok.
inline Status flash_sequence_layout_check(const AttentionParams& p, const char* backend, int64_t page_multiple) {
  if (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.seqused_k == nullptr && p.block_table == nullptr)
    return Status::Ok();
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return Status::NotSupported(std::string("backend '") + backend +
                                "' runs varlen, seqused_k and paged inputs in float16 and bfloat16; got " +
                                dtype_name(p.dtype));
  if (p.block_table != nullptr) {
    if ((p.page_size & (p.page_size - 1)) != 0 || p.page_size % page_multiple != 0)
      return Status::NotSupported(std::string("backend '") + backend + "' needs a page_size that is a power of two" +
                                  (page_multiple > 1 ? " and at least " + std::to_string(page_multiple) : "") +
                                  "; got " + std::to_string(p.page_size));
    if (p.seqlen_k > INT32_MAX)
      return Status::NotSupported(std::string("backend '") + backend +
                                  "' supports paged sequences of up to 2147483647 keys (max_pages * page_size); got " +
                                  std::to_string(p.seqlen_k));
  }
  return Status::Ok();
}

// Launch grid of the mma and wgmma kernels: query blocks of block_m rows in x (at most
// 2^31 - 1), batch * heads folded over y and z (at most 65535 each).
struct FoldedGrid {
  int64_t x = 0, y = 0, z = 0;
  bool fits() const { return x <= INT32_MAX && y <= kMaxGridYZ && z <= kMaxGridYZ; }
};

inline FoldedGrid folded_grid(const AttentionParams& p, int64_t block_m) {
  const int64_t bh = p.batch * p.heads;
  FoldedGrid grid;
  grid.x = (p.seqlen_q + block_m - 1) / block_m;
  grid.y = bh < kMaxGridYZ ? bh : kMaxGridYZ;
  grid.z = grid.y > 0 ? (bh + grid.y - 1) / grid.y : 0;
  return grid;
}

// Ok, or the refusal of `backend` stating the grid limits, when folded_grid(p, block_m) does not fit.
inline Status folded_grid_check(const AttentionParams& p, int64_t block_m, const char* backend) {
  if (folded_grid(p, block_m).fits()) return Status::Ok();
  return Status::NotSupported(std::string("backend '") + backend +
                              "' supports batch * heads up to 4294836225 (65535 x 65535 blocks in grid y and z) "
                              "and ceil(seqlen_q / " + std::to_string(block_m) +
                              ") up to 2147483647 (grid x); got batch * heads " + std::to_string(p.batch * p.heads) +
                              " and seqlen_q " + std::to_string(p.seqlen_q));
}

/// \brief Split-KV: a small grid's key range cut into pieces run by blocks of their own.
/// With num_splits > 1, block (m, split) covers key tiles [split, split + 1) * tiles_per_split
/// of query block m and writes O / l (fp32) and LSE to the workspace; the combine of
/// core/combine.cuh merges the pieces. num_splits == 1 is the plain kernel.
struct SplitKV {
  int num_splits = 1;
  int tiles_per_split = 0x3fffffff;
  float* o_accum = nullptr;    // [num_splits][batch * heads][seqlen_q][head_dim]
  float* lse_accum = nullptr;  // [num_splits][batch * heads][seqlen_q]
};

/// \brief Pieces to cut each block's keys into, for a grid of `blocks` blocks at one per SM:
/// as many as fill the GPU (at most 32, each of at least one tile, none left empty) when the
/// plain grid leaves over half of it idle, and only if the longest piece is more than 4 tiles
/// shorter than the whole: on an H100 (wgmma, benchmarks/small_grid_sweep.py) smaller savings
/// were eaten by the merge kernel and the fuller grid.
inline SplitKV split_kv_pieces(int64_t blocks, int64_t key_tiles, int multiprocessors) {
  SplitKV split;
  if (blocks <= 0 || 2 * blocks > multiprocessors) return split;
  int64_t pieces = multiprocessors / blocks;
  pieces = pieces < key_tiles ? pieces : key_tiles;
  pieces = pieces < 32 ? pieces : 32;
  const int64_t per_piece = pieces > 0 ? (key_tiles + pieces - 1) / pieces : key_tiles;
  if (key_tiles - per_piece <= 4) return split;
  split.num_splits = static_cast<int>((key_tiles + per_piece - 1) / per_piece);
  split.tiles_per_split = static_cast<int>(per_piece);
  return split;
}

// Shared memory one block may opt into on a device, and its number of SMs, each queried once per
// device (defined in src/cuda/device.cu, declared for the host side in src/cuda/cuda_paths.h too).
Status max_shared_memory_per_block(int device_id, int* bytes);
Status multiprocessor_count(int device_id, int* sms);

// Makes params.device_id current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace waveboost::cuda

// Returns a CudaError Status from the enclosing function when `expr` fails.
#define WAVEBOOST_CUDA_RETURN(expr)                                          \
  do {                                                                       \
    const cudaError_t wb_err_ = (expr);                                      \
    if (wb_err_ != cudaSuccess) return ::waveboost::cuda::cuda_status(wb_err_, #expr); \
  } while (0)
