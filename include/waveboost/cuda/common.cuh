// Shared CUDA helpers for every waveboost kernel path: element conversions, where a
// flash kernel's block stands, the 16 B copy check, error checks, device guard. Kernel
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

namespace waveboost::cuda {

// log2(e): exp(x) == exp2(x * kLog2e); kernels fold it into the softmax scale.
constexpr float kLog2e = 1.4426950408889634f;
// ln(2): the kernels keep the row max in log2 units; LSE = max * kLn2 + log(sum).
constexpr float kLn2 = 0.6931471805599453f;
// |c max(S)| (scaled log2 units) from which the mma and wgmma softmax rounds c S before
// subtracting the max (flash_mma.cuh, softmax_step): 2^24, where ulp(m) exceeds 1.
constexpr float kExactExponentFrom = 16777216.f;

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

// DType -> element type, for the dispatch switches in each path's launcher file.
template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> { using type = __half; };
template <>
struct ElementOf<DType::kBFloat16> { using type = __nv_bfloat16; };
template <>
struct ElementOf<DType::kFloat32> { using type = float; };

// First query row that sees key j under the bottom-right causal mask, and the
// number of keys query row i sees (may be <= 0: the row sees nothing).
__host__ __device__ __forceinline__ int64_t causal_keys_visible(int64_t row, const AttentionParams& p) {
  const int64_t n = row + 1 + p.seqlen_k - p.seqlen_q;
  return n < 0 ? 0 : (n > p.seqlen_k ? p.seqlen_k : n);
}

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
  const int64_t strides = used(p.q_batch_stride, p.batch) | used(p.q_row_stride, p.seqlen_q) |
                          used(p.q_head_stride, p.heads) | used(p.o_batch_stride, p.batch) |
                          used(p.o_row_stride, p.seqlen_q) | used(p.o_head_stride, p.heads) |
                          used(p.k_batch_stride, p.batch) | used(p.k_row_stride, p.seqlen_k) |
                          used(p.k_head_stride, p.heads_kv) | used(p.v_batch_stride, p.batch) |
                          used(p.v_row_stride, p.seqlen_k) | used(p.v_head_stride, p.heads_kv);
  return aligned(p.q) && aligned(p.k) && aligned(p.v) && aligned(p.out) && (strides & (elements_per_16B - 1)) == 0;
}

/// \brief Where one block of a flash kernel stands: its (batch, head), the query rows it owns
/// and the key tiles those rows see.
struct FlashBlock {
  int64_t b, h, h_kv;  // batch, query head, the kv head it reads
  int64_t m0;          // first query row
  int64_t rows;        // query rows of the block (the last block may be partial)
  int n_tiles;         // key tiles [0, n_tiles) are seen by some row of the block
  int n_unmasked;      // key tiles [0, n_unmasked) are seen whole by every row

  template <typename T>
  __device__ __forceinline__ const T* q_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* k_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;
  }
};

/// \brief Locates query block m_index (of m_blocks, in launch order) of blocks of block_m rows
/// and key tiles of block_n keys; batch * heads is folded over gridDim.y and gridDim.z (each
/// capped at 65535), and false means a padding block past batch * heads. Causal: the last
/// query blocks see the most keys, so they come first in launch order (a shorter grid tail).
/// Tile counts fit int: 2^31 tiles of >= 32 keys would be 2^36 keys of one sequence.
__device__ __forceinline__ bool locate_flash_block(const AttentionParams& p, bool causal, int64_t m_index,
                                                   int64_t m_blocks, int64_t block_m, int64_t block_n,
                                                   FlashBlock& blk) {
  const int64_t bh = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  if (bh >= p.batch * p.heads) return false;
  blk.b = bh / p.heads;
  blk.h = bh % p.heads;
  blk.h_kv = blk.h / (p.heads / p.heads_kv);
  blk.m0 = (causal ? m_blocks - 1 - m_index : m_index) * block_m;
  blk.rows = min(block_m, p.seqlen_q - blk.m0);
  const int64_t key_end = causal ? causal_keys_visible(blk.m0 + blk.rows - 1, p) : p.seqlen_k;
  const int64_t shared_keys = causal ? causal_keys_visible(blk.m0, p) : p.seqlen_k;
  blk.n_tiles = static_cast<int>((key_end + block_n - 1) / block_n);
  blk.n_unmasked = static_cast<int>(shared_keys / block_n);
  return true;
}

// "8.6" for compute capability 86, for messages.
inline std::string cc_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Launch grid of the mma and wgmma kernels: query blocks of block_m rows in x (at most
// 2^31 - 1), batch * heads folded over y and z (at most 65535 each).
struct FoldedGrid {
  int64_t x = 0, y = 0, z = 0;
  bool fits() const { return x <= INT32_MAX && y <= 65535 && z <= 65535; }
};

inline FoldedGrid folded_grid(const AttentionParams& p, int64_t block_m) {
  constexpr int64_t kMaxGridYZ = 65535;
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
/// of query block m and writes O / l (fp32) and LSE to the workspace; a second kernel merges
/// the pieces. num_splits == 1 is the plain kernel.
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
