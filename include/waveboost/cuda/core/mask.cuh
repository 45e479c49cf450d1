// Key masks of the tensor-core flash paths: which key tiles a block of query rows visits, and
// which scores inside a tile are dropped (-inf).
//
// A mask is a small policy object, a kernel template parameter (every kernel compiles its
// mask in, so an unmasked tile carries no mask arithmetic). The interface:
//   kLongestFirst                 query blocks run last to first (they see the most keys)
//   tiles(m0, rows, block_n)      key tiles [0, end) seen by some row, [0, unmasked) by all
//   partial_tile(n0, block_n)     the tile starting at key n0 runs past the sequence
//   row_limits<kRows, kBlockN>    per thread row: keys of a tile the row sees
//   apply<Fragments>(s, limits)   scores of keys at or past the limit become -inf
// A new variant (sliding window, softcap, ALiBi, sinks) is a new policy with this interface,
// not new branches in the kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "waveboost/cuda/core/sequence.cuh"

namespace waveboost::cuda {

/// \brief Key tiles a block of query rows visits.
struct KeyTileRange {
  int end;       // tiles [0, end) are seen by some row of the block
  int unmasked;  // tiles [0, unmasked) are seen whole by every row
};

/// \brief The sequence end and, with kCausal, the bottom-right causal mask: query row i of a
/// sequence of len_q rows and len_k keys sees key j iff j < len_k and (not kCausal or
/// j <= i + len_k - len_q).
template <bool kCausal_>
struct CausalMask {
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kLongestFirst = kCausal;

  int64_t len_q;
  int64_t len_k;

  __device__ __forceinline__ static CausalMask of(const FlashBlock& blk) { return {blk.seqlen_q, blk.seqlen_k}; }

  // Keys [0, n) that query row `row` sees.
  __device__ __forceinline__ int64_t keys_visible(int64_t row) const {
    return kCausal ? causal_keys_visible(row, len_q, len_k) : len_k;
  }

  // Tile counts fit int: 2^31 tiles of >= 32 keys would be 2^36 keys of one sequence.
  __device__ __forceinline__ KeyTileRange tiles(int64_t m0, int64_t rows, int64_t block_n) const {
    const int64_t key_end = keys_visible(m0 + rows - 1);
    const int64_t shared_keys = keys_visible(m0);
    return {static_cast<int>((key_end + block_n - 1) / block_n), static_cast<int>(shared_keys / block_n)};
  }

  __device__ __forceinline__ bool partial_tile(int64_t n0, int64_t block_n) const { return n0 + block_n > len_k; }

  // limit[r]: keys of the tile starting at key n0 that this thread's row r (query row
  // row0 + 8 r) sees, 0..kBlockN: min(row + 1 + len_k - len_q, len_k) - n0, clamped. Clamping
  // the 64-bit row0 term to [-8 kRows, kBlockN] first changes no clamped result and keeps
  // the rest in int.
  template <int kRows, int kBlockN>
  __device__ __forceinline__ void row_limits(int (&limit)[kRows], int64_t row0, int64_t n0) const {
    const int tail_limit = static_cast<int>(min(len_k - n0, int64_t{kBlockN}));
    int causal_limit = kBlockN;
    if constexpr (kCausal) {
      const int64_t r0_limit = row0 + 1 + len_k - len_q - n0;
      causal_limit = static_cast<int>(max(int64_t{-8 * kRows}, min(r0_limit, int64_t{kBlockN})));
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int causal = kCausal ? causal_limit + 8 * r : kBlockN;
      limit[r] = max(0, min(causal, tail_limit));
    }
  }

  // Scores of keys at or beyond their row's limit become -inf (t: the thread in its quad).
  template <typename Fragments>
  __device__ __forceinline__ static void apply(typename Fragments::Array& s, const int (&limit)[Fragments::kRows],
                                               int t) {
#pragma unroll
    for (int r = 0; r < Fragments::kRows; ++r) {
#pragma unroll
      for (int nt = 0; nt < Fragments::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (nt * 8 + 2 * t + e >= limit[r]) Fragments::at(s, r, nt, e) = -INFINITY;
        }
      }
    }
  }

  // The mask of one tile: row limits, then apply.
  template <typename Fragments, int kBlockN>
  __device__ __forceinline__ void mask_tile(typename Fragments::Array& s, int64_t row0, int64_t n0, int t) const {
    int limit[Fragments::kRows];
    row_limits<Fragments::kRows, kBlockN>(limit, row0, n0);
    apply<Fragments>(s, limit, t);
  }
};

/// \brief Locates the query block at launch position `at` (core/sequence.cuh, locate_query_block_at)
/// of block_m rows, with key tiles of block_n keys under `Mask`; false for a block with nothing to do
/// (also for kSequences). A persistent grid's items come as launch positions (core/schedule.cuh).
template <typename Mask, bool kSequences = false>
__device__ __forceinline__ bool locate_flash_item(const AttentionParams& p, GridTile at, int64_t m_blocks,
                                                  int64_t block_m, int64_t block_n, FlashBlock& blk) {
  if (!locate_query_block_at<kSequences>(p, Mask::kLongestFirst, at, m_blocks, block_m, blk)) return false;
  const KeyTileRange tiles = Mask::of(blk).tiles(blk.m0, blk.rows, block_n);
  blk.n_tiles = tiles.end;
  blk.n_unmasked = tiles.unmasked;
  return true;
}

/// \brief As above for query block m_index (of m_blocks, in launch order) of this block's head.
template <typename Mask, bool kSequences = false>
__device__ __forceinline__ bool locate_flash_block(const AttentionParams& p, int64_t m_index, int64_t m_blocks,
                                                   int64_t block_m, int64_t block_n, FlashBlock& blk) {
  return locate_flash_item<Mask, kSequences>(p, grid_tile(m_index, m_blocks, Mask::kLongestFirst), m_blocks, block_m,
                                             block_n, blk);
}

/// \brief As above with the causal flag at run time (the wmma path).
__device__ __forceinline__ bool locate_flash_block(const AttentionParams& p, bool causal, int64_t m_index,
                                                   int64_t m_blocks, int64_t block_m, int64_t block_n,
                                                   FlashBlock& blk) {
  if (!locate_query_block<false>(p, causal, m_index, m_blocks, block_m, blk)) return false;
  const int64_t key_end = causal ? causal_keys_visible(blk.m0 + blk.rows - 1, blk.seqlen_q, blk.seqlen_k) : blk.seqlen_k;
  const int64_t shared_keys = causal ? causal_keys_visible(blk.m0, blk.seqlen_q, blk.seqlen_k) : blk.seqlen_k;
  blk.n_tiles = static_cast<int>((key_end + block_n - 1) / block_n);
  blk.n_unmasked = static_cast<int>(shared_keys / block_n);
  return true;
}

}  // namespace waveboost::cuda
