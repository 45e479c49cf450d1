// The pieces every flash backward shares (the mma.sync kernel, flash_bwd_mma.cuh, and the wgmma
// kernel, flash_bwd_wgmma.cuh): the fp32 workspace, where a block of keys stands and which
// (query head, query block) steps it walks, the masked probability, the per-step lse/D copies,
// the dQ reductions of an accumulator fragment, the dK/dV stores, and the main kernel's grid.
//
// Accumulator fragments here are those of mma.sync's C and, per warp, of wgmma's D: a quad of
// four floats (rows g and g + 8, columns 2t and 2t + 1 of an 8-column group).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/schedule.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

/// \brief The backward's fp32 workspace, [batch * heads][m_pad] rows (m_pad: seqlen_q rounded
/// up to the query block).
struct FlashBwdWorkspace {
  float* dq_accum = nullptr;  // [batch * heads][m_pad][head_dim]
  float* lse_log2 = nullptr;  // [batch * heads][m_pad]: lse * log2(e); -inf lse and padding: +inf
  float* d_rows = nullptr;    // [batch * heads][m_pad]: rowsum(dO * O) - dlse; padding: 0
  int* semaphores = nullptr;  // deterministic only: [batch * heads][m_pad / kBlockM], zeroed
  int64_t m_pad = 0;
};

/// \brief Shared memory of a flash backward block, in this order: K, V (kBlockN rows), Q[2], dO[2]
/// (kBlockM rows, double-buffered), dS (kBlockN x kBlockM), and the step vectors lse * log2(e)[2]
/// and D[2] (kBlockM floats each). Tiles hold kElementBytes per element; kLayoutBytes is the end.
template <int kBlockN, int kBlockM, int kHeadDim, int kElementBytes>
struct BackwardSmemLayout {
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * kElementBytes;
  static constexpr int kQTileBytes = kBlockM * kHeadDim * kElementBytes;
  static constexpr int kDsTileBytes = kBlockN * kBlockM * kElementBytes;
  static constexpr int kVecBytes = kBlockM * 4;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVTileBytes;
  static constexpr int kQOffset = kVOffset + kKVTileBytes;
  static constexpr int kDoOffset = kQOffset + 2 * kQTileBytes;
  static constexpr int kDsOffset = kDoOffset + 2 * kQTileBytes;
  static constexpr int kLseOffset = kDsOffset + kDsTileBytes;
  static constexpr int kDOffset = kLseOffset + 2 * kVecBytes;
  static constexpr int kLayoutBytes = kDOffset + 2 * kVecBytes;
};

/// \brief One block of a flash backward: block_n keys from n0 of one (batch, kv head), and the
/// steps it walks: for each query head of the kv head's group, the query blocks that see a key
/// of the block (all, or under the causal mask those from the one holding the first row that
/// sees key n0).
struct BackwardBlock {
  int64_t b, h_kv, group;
  int64_t n0;
  int64_t causal_offset;  // seqlen_k - seqlen_q: row i sees keys <= i + causal_offset
  int64_t m_begin, m_count;
  int64_t steps;  // group * m_count
  // Step s: query head head(s), query block m_block(s).
  __device__ __forceinline__ int64_t head(int64_t s) const { return h_kv * group + s / m_count; }
  __device__ __forceinline__ int64_t m_block(int64_t s) const { return m_begin + s % m_count; }

  // Addresses: K / V row n0 of the block; Q / dO row m0 of query head h; the workspace row of
  // (h, m0) (rows of m_pad per batch and head).
  template <typename T>
  __device__ __forceinline__ const T* k_rows(const AttentionBackwardParams& p) const {
    return static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride + n0 * p.k_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_rows(const AttentionBackwardParams& p) const {
    return static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride + n0 * p.v_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* q_rows(const AttentionBackwardParams& p, int64_t h, int64_t m0) const {
    return static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* dout_rows(const AttentionBackwardParams& p, int64_t h, int64_t m0) const {
    return static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride + m0 * p.do_row_stride;
  }
  __device__ __forceinline__ int64_t workspace_row(const AttentionBackwardParams& p, int64_t m_pad, int64_t h,
                                                   int64_t m0) const {
    return (b * p.heads + h) * m_pad + m0;
  }
};

/// \brief The key block and the (batch, kv head) a backward block owns, from its place in the
/// grid (backward_grid: x = key blocks, batch * heads_kv folded over y and z). x runs fastest in the
/// launch order, so the key blocks of one (batch, kv head) run side by side and share its Q, dO and
/// dQ rows in L2. Causal, the first key block sees the most query blocks: the grid's last kv heads
/// are taken key block by key block (core/schedule.cuh), so that their heavy blocks do not start
/// in the grid's last wave. Deterministic and causal, the last key block launches first instead:
/// the order of the dQ turns (dq_turn), so that every block's predecessors in its turns were
/// launched before it.
struct BackwardBlockIndex {
  int64_t n_block;
  int64_t bhk;  // batch index * heads_kv + kv head; from p.batch * p.heads_kv on a padding block
};

template <bool kCausal>
__device__ __forceinline__ BackwardBlockIndex backward_block_index(bool deterministic) {
  const bool turns = kCausal && deterministic;
  const GridTile at = grid_tile(blockIdx.x, gridDim.x, kCausal && !turns);
  return {turns ? gridDim.x - 1 - at.tile : at.tile, at.head};
}

/// \brief Locates key block index.n_block of (batch, kv head) index.bhk; false for a padding
/// block past batch * heads_kv.
template <bool kCausal>
__device__ __forceinline__ bool locate_backward_block(const AttentionBackwardParams& p, BackwardBlockIndex index,
                                                      int64_t block_n, int64_t block_m, BackwardBlock& blk) {
  const int64_t bhk = index.bhk;
  if (bhk >= p.batch * p.heads_kv) return false;
  blk.b = bhk / p.heads_kv;
  blk.h_kv = bhk % p.heads_kv;
  blk.group = p.heads / p.heads_kv;
  blk.n0 = index.n_block * block_n;
  blk.causal_offset = p.seqlen_k - p.seqlen_q;
  const int64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  blk.m_begin = kCausal ? (blk.n0 - blk.causal_offset > 0 ? (blk.n0 - blk.causal_offset) / block_m : 0) : 0;
  blk.m_count = m_blocks > blk.m_begin ? m_blocks - blk.m_begin : 0;
  blk.steps = blk.group * blk.m_count;
  return true;
}

// ---- The deterministic dQ: a fixed order of the key blocks adding into each query block ----
//
// One int32 semaphore per (batch * head, query block) counts the key blocks that have added their
// share; key block n adds when the count equals its turn, then counts itself. Non-causal: the turn
// is n, every block walks the query blocks in the same order and waits for block n - 1, so the
// blocks of a head settle into a staircase, each a dQ add behind the one before it, and run at the
// pace of the slowest (a block that cannot start its next step before its add has landed pays the
// add per step; the wgmma writer warp adds while its block computes). Causal (launched last key
// block first, backward_block_index): descending from the last key block that sees the query
// block, since block n + 1 starts at a later query block than block n and gets to each one first.
// The key blocks that see a query block are always 0 .. that last one (the causal mask keeps a
// prefix of the keys), so no turn is skipped. Each block waits only for blocks launched before it.

/// \brief Key block n_block's turn at query block m_index (block_m rows; block_n keys per block).
template <bool kCausal>
__device__ __forceinline__ int dq_turn(int64_t n_block, int64_t m_index, int64_t block_m, int64_t block_n,
                                       int64_t causal_offset) {
  if constexpr (kCausal) {
    const int64_t last_seeing = ((m_index + 1) * block_m + causal_offset - 1) / block_n;
    return static_cast<int>(min(last_seeing, static_cast<int64_t>(gridDim.x) - 1) - n_block);
  }
  return static_cast<int>(n_block);
}

/// \brief Spins (one thread) until *semaphore == turn, reading with acquire at gpu scope.
__device__ __forceinline__ void spin_until_turn(const int* semaphore, int turn) {
  int now;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(semaphore) : "memory");
  } while (now != turn);
}

/// \brief Counts this key block's add (one thread), with release at gpu scope.
__device__ __forceinline__ void count_turn(int* semaphore) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(semaphore) : "memory");
}

/// \brief Whether a (key block, query block) pair needs the per-element mask: keys past the
/// sequence or (causal) keys some row of the query block does not see.
template <bool kCausal>
__device__ __forceinline__ bool backward_tile_masked(const AttentionBackwardParams& p, const BackwardBlock& blk,
                                                     int64_t block_n, int64_t m0) {
  return blk.n0 + block_n > p.seqlen_k || (kCausal && blk.n0 + block_n - 1 > m0 + blk.causal_offset);
}

/// \brief Calls fn(std::true_type{}) for a step that needs the per-element mask
/// (backward_tile_masked) and fn(std::false_type{}) otherwise: one uniform branch per step, so the
/// per-element tests of backward_probability exist only in the masked copy of the step's code.
/// kSplit false: one copy, fn(masked) with the flag at run time (ptxas then predicates the tests
/// into every step). The wgmma backward splits (causal 1.06-1.24x at L >= 4k); the mma backward at
/// head dim 64 does not: there the second copy raised its spills from 16-20 to 60-96 bytes and
/// cost 3-6% (benchmarks/NOTES.md, "The backward's masked steps").
template <bool kSplit, typename Fn>
__device__ __forceinline__ void with_step_mask(bool masked, Fn&& fn) {
  if constexpr (kSplit) {
    if (masked) {
      fn(std::true_type{});
    } else {
      fn(std::false_type{});
    }
  } else {
    fn(masked);
  }
}

/// \brief P of one score: exp2(s * scale_log2 - lse * log2(e)), 0 where (masked) the key is past
/// the sequence or the query row does not see it. Padded query rows have lse * log2(e) = +inf,
/// so P = 0 there without a test.
template <bool kCausal>
__device__ __forceinline__ float backward_probability(float s, float scale_log2, float lse_log2, bool masked,
                                                      int64_t key, int64_t row, const AttentionBackwardParams& p,
                                                      int64_t causal_offset) {
  const float prob = mma::exp2(s * scale_log2 - lse_log2);
  if (!masked) return prob;
  const bool visible = key < p.seqlen_k && (!kCausal || key <= row + causal_offset);
  return visible ? prob : 0.f;
}

/// \brief cp.async of the lse * log2(e) and D rows of one step (kBlockM floats each, workspace
/// row row0) to shared memory; threads 0 .. kBlockM / 2 - 1 issue one 16 B copy each.
template <int kBlockM>
__device__ __forceinline__ void copy_step_vectors(const FlashBwdWorkspace& ws, int64_t row0, uint32_t lse_dst,
                                                  uint32_t d_dst) {
  constexpr int kVecChunks = kBlockM / 4;  // 16 B chunks of one row vector
  if (threadIdx.x < 2 * kVecChunks) {
    const int c = threadIdx.x % kVecChunks;
    const bool is_lse = threadIdx.x < kVecChunks;
    const float* src = (is_lse ? ws.lse_log2 : ws.d_rows) + row0 + 4 * c;
    mma::copy_async_16B((is_lse ? lse_dst : d_dst) + 16 * c, src, true);
  }
}

/// \brief Four consecutive dQ columns of one row, gathered from a quad of accumulators: even t
/// takes row g, columns 2t .. 2t + 3 (its own pair and t + 1's), odd t row g + 8, columns
/// 2t - 2 .. 2t + 1. Every lane of the warp must call it (shuffles).
struct DqQuad {
  int row;  // g or g + 8
  int col;  // first of the four columns within the 8-column group
  float4 sum;
};
__device__ __forceinline__ DqQuad dq_quad(float c0, float c1, float c2, float c3, int g, int t) {
  const bool even = t % 2 == 0;
  const float got0 = __shfl_xor_sync(0xffffffffu, even ? c2 : c0, 1);
  const float got1 = __shfl_xor_sync(0xffffffffu, even ? c3 : c1, 1);
  return {even ? g : g + 8, 2 * (t & ~1),
          even ? make_float4(c0, c1, got0, got1) : make_float4(got0, got1, c2, c3)};
}

/// \brief *at += x, atomically per element (a 16 B vector reduction on sm_90).
__device__ __forceinline__ void reduce_add_16B(float4* at, float4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at), "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w)
               : "memory");
#else
  float* p = reinterpret_cast<float*>(at);
  atomicAdd(p, x.x);
  atomicAdd(p + 1, x.y);
  atomicAdd(p + 2, x.z);
  atomicAdd(p + 3, x.w);
#endif
}

/// \brief at[0..1] += (x, y), atomically per element (an 8 B vector reduction on sm_90).
__device__ __forceinline__ void reduce_add_8B(float* at, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(at, x);
  atomicAdd(at + 1, y);
#endif
}

/// \brief dQ += x at `at` (16 B): a reduction, or, deterministic (the block holds the query block's
/// dQ turn), a plain read, add and write that bypass L1.
template <bool kDeterministic>
__device__ __forceinline__ void add_dq_16B(float4* at, float4 x) {
  if constexpr (kDeterministic) {
    const float4 old = __ldcg(at);
    __stcg(at, make_float4(old.x + x.x, old.y + x.y, old.z + x.z, old.w + x.w));
  } else {
    reduce_add_16B(at, x);
  }
}

/// \brief dK (times softmax_scale) and dV of 16 keys from key0 and kDimTiles x 8 dims from col0, straight
/// from a warp's m16 accumulators: dk(i, j) is accumulator j of 8-column group i (rows g + 8 (j / 2));
/// 4 B stores of two columns. Keys past the sequence are not stored.
template <typename Element, int kDimTiles, typename DkAt, typename DvAt>
__device__ __forceinline__ void store_key_rows(const AttentionBackwardParams& p, const BackwardBlock& blk,
                                               int64_t key0, int col0, int g, int t, DkAt dk, DvAt dv) {
  const float scale = static_cast<float>(p.softmax_scale);
  Element* dk_out = static_cast<Element*>(p.dk) + blk.b * p.dk_batch_stride + blk.h_kv * p.dk_head_stride;
  Element* dv_out = static_cast<Element*>(p.dv) + blk.b * p.dv_batch_stride + blk.h_kv * p.dv_head_stride;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t key = key0 + g + 8 * half;
    if (key < p.seqlen_k) {
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        const int col = col0 + 8 * i + 2 * t;
        *reinterpret_cast<uint32_t*>(dk_out + key * p.dk_row_stride + col) =
            pack_pair<Element>(dk(i, 2 * half) * scale, dk(i, 2 * half + 1) * scale);
        *reinterpret_cast<uint32_t*>(dv_out + key * p.dv_row_stride + col) =
            pack_pair<Element>(dv(i, 2 * half), dv(i, 2 * half + 1));
      }
    }
  }
}

/// \brief The main kernel's grid: x = key blocks, batch * heads_kv folded over y and z.
inline Status backward_grid(const AttentionBackwardParams& p, int64_t block_n, const char* backend, dim3* grid) {
  constexpr int64_t kMaxGridYZ = 65535;
  const int64_t bhk = p.batch * p.heads_kv;
  const int64_t grid_x = (p.seqlen_k + block_n - 1) / block_n;
  const int64_t grid_y = bhk < kMaxGridYZ ? bhk : kMaxGridYZ;
  const int64_t grid_z = (bhk + grid_y - 1) / grid_y;
  if (grid_x > INT32_MAX || grid_z > kMaxGridYZ) {
    return Status::NotSupported(std::string("backend '") + backend +
                                "' (backward) supports batch * heads_kv up to 4294836225 and ceil(seqlen_k / " +
                                std::to_string(block_n) + ") up to 2147483647");
  }
  *grid = dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y), static_cast<unsigned>(grid_z));
  return Status::Ok();
}

}  // namespace waveboost::cuda
