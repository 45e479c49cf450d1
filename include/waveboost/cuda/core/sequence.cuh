// Sequence info and the block locator of the flash kernels: which (batch, head) and query rows
// a block owns, how long that block's sequence is, and where its Q rows, K/V tiles, O rows and
// LSE entries live.
//
// This is the one place that answers "where is row r of sequence b". Dense BSHD batches are
// answered now (every sequence seqlen_q x seqlen_k, batch strides); the sequence-layout fields
// of AttentionParams enter here and nowhere else: varlen (cu_seqlens_q/k) changes
// sequence_lengths and the row offsets of FlashBlock, seqused_k changes the key length, and
// paged K/V (block_table) changes k_tile / v_tile. Kernels read lengths and addresses only
// through FlashBlock, never p.seqlen_q / p.seqlen_k or strides of their own.
#pragma once

#include <cstdint>

#include "waveboost/attention.h"

namespace waveboost::cuda {

/// \brief Query rows and keys of one sequence of the batch.
struct SequenceLengths {
  int64_t q;  // query rows
  int64_t k;  // keys
};

/// \brief Lengths of sequence b (dense: the same for every b).
__host__ __device__ __forceinline__ SequenceLengths sequence_lengths(const AttentionParams& p, int64_t /*b*/) {
  return {p.seqlen_q, p.seqlen_k};
}

// Number of keys query row `row` sees under the bottom-right causal mask, clamped to
// [0, len_k] (0: the row sees nothing).
__host__ __device__ __forceinline__ int64_t causal_keys_visible(int64_t row, int64_t len_q, int64_t len_k) {
  const int64_t n = row + 1 + len_k - len_q;
  return n < 0 ? 0 : (n > len_k ? len_k : n);
}

// As above for a dense batch of params p.
__host__ __device__ __forceinline__ int64_t causal_keys_visible(int64_t row, const AttentionParams& p) {
  return causal_keys_visible(row, p.seqlen_q, p.seqlen_k);
}

/// \brief Where one block of a flash kernel stands: its (batch, head), the query rows it owns,
/// its sequence's lengths, the key tiles those rows see, and the addresses of all of it.
struct FlashBlock {
  int64_t b, h, h_kv;  // batch, query head, the kv head it reads
  int64_t m0;          // first query row (within the sequence)
  int64_t rows;        // query rows of the block (the last block may be partial)
  int64_t seqlen_q;    // query rows of this block's sequence
  int64_t seqlen_k;    // keys of this block's sequence
  int n_tiles;         // key tiles [0, n_tiles) are seen by some row of the block
  int n_unmasked;      // key tiles [0, n_unmasked) are seen whole by every row

  // Query row m0 of the block.
  template <typename T>
  __device__ __forceinline__ const T* q_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_row_stride;
  }
  // Key / value row 0 of the sequence (rows p.k_row_stride / p.v_row_stride apart).
  template <typename T>
  __device__ __forceinline__ const T* k_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;
  }
  // Key / value row n0 of the sequence, the start of a K or V tile; `k` / `v` is what k_rows /
  // v_rows returned (kernels keep it in a register rather than recompute the head offset).
  template <typename T>
  __device__ __forceinline__ const T* k_tile(const AttentionParams& p, const T* k, int64_t n0) const {
    return k + n0 * p.k_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_tile(const AttentionParams& p, const T* v, int64_t n0) const {
    return v + n0 * p.v_row_stride;
  }
  // Output row `row` of the sequence.
  template <typename T>
  __device__ __forceinline__ T* o_row(const AttentionParams& p, int64_t row) const {
    return static_cast<T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + row * p.o_row_stride;
  }
  // LSE entry of query row `row` of the sequence (p.lse must be set).
  __device__ __forceinline__ float* lse_at(const AttentionParams& p, int64_t row) const {
    return p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + row;
  }
};

/// \brief Locates query block m_index (of m_blocks, in launch order) of blocks of block_m rows:
/// batch * heads is folded over gridDim.y and gridDim.z (each capped at 65535). Fills every
/// field but the key tiles (the mask's business, core/mask.cuh). false: a padding block past
/// batch * heads (dense batches size grid x to seqlen_q, so no block starts past its rows;
/// sequences shorter than the grid will end blocks there too). longest_first: query blocks are taken
/// last to first (under a causal mask the last ones see the most keys: a shorter grid tail).
__device__ __forceinline__ bool locate_query_block(const AttentionParams& p, bool longest_first, int64_t m_index,
                                                   int64_t m_blocks, int64_t block_m, FlashBlock& blk) {
  const int64_t bh = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  if (bh >= p.batch * p.heads) return false;
  blk.b = bh / p.heads;
  blk.h = bh % p.heads;
  blk.h_kv = blk.h / (p.heads / p.heads_kv);
  const SequenceLengths len = sequence_lengths(p, blk.b);
  blk.seqlen_q = len.q;
  blk.seqlen_k = len.k;
  blk.m0 = (longest_first ? m_blocks - 1 - m_index : m_index) * block_m;
  blk.rows = min(block_m, blk.seqlen_q - blk.m0);
  return true;
}

}  // namespace waveboost::cuda
