// Sequence info and the block locator of the flash kernels: which (batch, head) and query rows
// a block owns, how long that block's sequence is, and where its Q rows, K/V tiles, O rows and
// LSE entries live.
//
// This is the one place that answers "where is row r of sequence b", for every layout of
// AttentionParams: dense BSHD batches (every sequence seqlen_q x seqlen_k, batch strides),
// varlen (cu_seqlens_q / cu_seqlens_k: sequence_lengths and the packed row offsets of
// FlashBlock), seqused_k (the key length) and paged K/V (block_table: paged_key_offset,
// FlashBlock::paged_key). Kernels read lengths and addresses only through FlashBlock (the
// flash paths) or core/kv_iterator.cuh, which builds on it (decode), never p.seqlen_q /
// p.seqlen_k or strides of their own. The flash kernels compile the dense case apart
// (locate_query_block<false>: every layout offset folds away); sequence_lengths itself takes
// the dense case as a uniform branch on the parameters.
#pragma once

#include <cstdint>

#include "waveboost/attention.h"
#include "waveboost/cuda/core/schedule.cuh"

namespace waveboost::cuda {

/// \brief Query rows and keys of one sequence of the batch, and where its rows start.
struct SequenceLengths {
  int64_t q;            // query rows
  int64_t k;            // keys (seqused_k when given)
  int64_t q_start = 0;  // first packed row of q / out with cu_seqlens_q, else 0
  int64_t k_start = 0;  // first packed key of k / v with cu_seqlens_k, else 0
};

/// \brief Lengths and packed offsets of sequence b: dense (every sequence seqlen_q x seqlen_k),
/// varlen (cu_seqlens_q / cu_seqlens_k), seqused_k. Device arrays are read here and nowhere else
/// on the flash and decode paths. The grid is sized by the bounds p.seqlen_q / p.seqlen_k, so
/// lengths are clamped to them, whatever the arrays say.
__device__ __forceinline__ SequenceLengths sequence_lengths(const AttentionParams& p, int64_t b) {
  SequenceLengths len{p.seqlen_q, p.seqlen_k};
  // A uniform branch on the parameters: the dense case reads nothing.
  if (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.seqused_k == nullptr) return len;
  if (p.cu_seqlens_q != nullptr) {
    len.q_start = p.cu_seqlens_q[b];
    len.q = p.cu_seqlens_q[b + 1] - len.q_start;
  }
  if (p.cu_seqlens_k != nullptr) {
    len.k_start = p.cu_seqlens_k[b];
    len.k = p.cu_seqlens_k[b + 1] - len.k_start;
  }
  if (p.seqused_k != nullptr) len.k = p.seqused_k[b];
  len.q = len.q < 0 ? 0 : (len.q > p.seqlen_q ? p.seqlen_q : len.q);
  len.k = len.k < 0 ? 0 : (len.k > p.seqlen_k ? p.seqlen_k : len.k);
  return len;
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

/// \brief Key j of one sequence in a paged K or V tensor: row j % page_size of page
/// table_row[j / page_size] (table_row: the sequence's block_table row), as an element offset
/// from the head's base, pages page_stride and rows row_stride elements apart. false: the page
/// id is outside [0, num_pages) (a corrupt table); the caller reads zeros instead. The
/// tensor-core paths accept page sizes that are powers of two only (shifts, no division), and
/// sequences of fewer than 2^31 keys (32-bit key indices).
__device__ __forceinline__ bool paged_key_offset(const AttentionParams& p, const int32_t* table_row, int j,
                                                 int64_t page_stride, int64_t row_stride, int64_t& offset) {
  const int page = __ldg(table_row + (j >> (__ffsll(p.page_size) - 1)));
  offset = page * page_stride + (j & static_cast<int>(p.page_size - 1)) * row_stride;
  return static_cast<uint32_t>(page) < static_cast<uint64_t>(p.num_pages);
}

/// \brief Where one block of a flash kernel stands: its (batch, head), the query rows it owns,
/// its sequence's lengths, the key tiles those rows see, and the addresses of all of it.
///
/// Addresses: with cu_seqlens_q the batch strides of q / out / lse are not applied (q_batch
/// is 0) and rows start at the sequence's packed offset; likewise for k / v with cu_seqlens_k.
/// A paged K / V (p.block_table) has no contiguous rows: k_rows / v_rows give the head's base
/// and paged_key the offset of each key from it through the block table.
struct FlashBlock {
  int64_t b, h, h_kv;  // batch, query head, the kv head it reads
  int64_t m0;          // first query row (within the sequence)
  int64_t rows;        // query rows of the block (the last block may be partial)
  int64_t seqlen_q;    // query rows of this block's sequence
  int64_t seqlen_k;    // keys of this block's sequence
  int64_t q_batch;     // batch index applied to q / out / lse batch strides (0 when packed)
  int64_t q_start;     // packed row of the sequence's query row 0 (0 when dense)
  int64_t k_batch;     // batch index applied to k / v batch strides (0 when packed or paged)
  int64_t k_start;     // packed row of the sequence's key 0 (0 when dense or paged)
  int n_tiles;         // key tiles [0, n_tiles) are seen by some row of the block
  int n_unmasked;      // key tiles [0, n_unmasked) are seen whole by every row

  // Query row m0 of the block.
  template <typename T>
  __device__ __forceinline__ const T* q_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.q) + q_batch * p.q_batch_stride + h * p.q_head_stride +
           (q_start + m0) * p.q_row_stride;
  }
  // Key / value row 0 of the sequence (rows p.k_row_stride / p.v_row_stride apart); with a
  // paged K / V, the head's base in page 0 (keys through paged_key).
  template <typename T>
  __device__ __forceinline__ const T* k_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.k) + k_batch * p.k_batch_stride + h_kv * p.k_head_stride +
           k_start * p.k_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_rows(const AttentionParams& p) const {
    return static_cast<const T*>(p.v) + k_batch * p.v_batch_stride + h_kv * p.v_head_stride +
           k_start * p.v_row_stride;
  }
  // Key / value row n0 of the sequence, the start of a K or V tile of contiguous rows (not
  // paged); `k` / `v` is what k_rows / v_rows returned (kernels keep it in a register rather
  // than recompute the head offset).
  template <typename T>
  __device__ __forceinline__ const T* k_tile(const AttentionParams& p, const T* k, int64_t n0) const {
    return k + n0 * p.k_row_stride;
  }
  template <typename T>
  __device__ __forceinline__ const T* v_tile(const AttentionParams& p, const T* v, int64_t n0) const {
    return v + n0 * p.v_row_stride;
  }
  // The block_table row of this block's sequence (p.block_table must be set).
  __device__ __forceinline__ const int32_t* page_table(const AttentionParams& p) const {
    return p.block_table + b * p.block_table_batch_stride;
  }
  // Offset of key j in a paged K (kValue false) or V from the head's base (k_rows / v_rows);
  // false for a corrupt page id (see paged_key_offset).
  template <bool kValue>
  __device__ __forceinline__ bool paged_key(const AttentionParams& p, const int32_t* table_row, int j,
                                            int64_t& offset) const {
    return paged_key_offset(p, table_row, j, kValue ? p.v_batch_stride : p.k_batch_stride,
                            kValue ? p.v_row_stride : p.k_row_stride, offset);
  }
  // Re-reads the sequence's query length and packed offset (after a kernel's main loop, so that
  // they need not stay in registers through it).
  __device__ __forceinline__ void reload_query_rows(const AttentionParams& p) {
    const SequenceLengths len = sequence_lengths(p, b);
    seqlen_q = len.q;
    q_start = len.q_start;
  }
  // Output row `row` of the sequence.
  template <typename T>
  __device__ __forceinline__ T* o_row(const AttentionParams& p, int64_t row) const {
    return static_cast<T*>(p.out) + q_batch * p.o_batch_stride + h * p.o_head_stride +
           (q_start + row) * p.o_row_stride;
  }
  // LSE entry of query row `row` of the sequence (p.lse must be set): (batch, heads, seqlen_q),
  // or (heads, total_q) with cu_seqlens_q.
  __device__ __forceinline__ float* lse_at(const AttentionParams& p, int64_t row) const {
    return p.lse + q_batch * p.lse_batch_stride + h * p.lse_head_stride + q_start + row;
  }
};

/// \brief Locates the query block at launch position `at` (its tile: query block at.tile of
/// m_blocks in launch order; its head: at.head of batch * heads, which a grid folds over gridDim.y
/// and gridDim.z, each capped at 65535) of blocks of block_m rows. Fills every
/// field but the key tiles (the mask's business, core/mask.cuh). false: a padding block past
/// batch * heads, or a block past its sequence's query rows (the grid covers the longest
/// sequence, p.seqlen_q, as FlashAttention-2's varlen grid does). longest_first: query blocks
/// are taken last to first (under a causal mask the last ones see the most keys: a shorter
/// grid tail), the grid's last heads tile by tile (core/schedule.cuh). kSequences: p may carry a
/// sequence layout (varlen, seqused_k, paged); without it the layout is dense at compile time,
/// and every offset the layout adds folds away.
template <bool kSequences>
__device__ __forceinline__ bool locate_query_block_at(const AttentionParams& p, bool longest_first, GridTile at,
                                                      int64_t m_blocks, int64_t block_m, FlashBlock& blk) {
  const int64_t m_index = at.tile;
  const int64_t bh = at.head;
  if (bh >= p.batch * p.heads) return false;
  blk.b = bh / p.heads;
  blk.h = bh % p.heads;
  blk.h_kv = blk.h / (p.heads / p.heads_kv);
  const SequenceLengths len = kSequences ? sequence_lengths(p, blk.b) : SequenceLengths{p.seqlen_q, p.seqlen_k};
  blk.seqlen_q = len.q;
  blk.seqlen_k = len.k;
  blk.q_batch = kSequences && p.cu_seqlens_q != nullptr ? 0 : blk.b;
  blk.q_start = len.q_start;
  blk.k_batch = kSequences && (p.cu_seqlens_k != nullptr || p.block_table != nullptr) ? 0 : blk.b;
  blk.k_start = len.k_start;
  blk.m0 = (longest_first ? m_blocks - 1 - m_index : m_index) * block_m;
  blk.rows = min(block_m, blk.seqlen_q - blk.m0);
  return !kSequences || blk.rows > 0;
}

/// \brief locate_query_block_at for launch position (m_index, this block's y and z) of the grid.
template <bool kSequences>
__device__ __forceinline__ bool locate_query_block(const AttentionParams& p, bool longest_first, int64_t m_index,
                                                   int64_t m_blocks, int64_t block_m, FlashBlock& blk) {
  return locate_query_block_at<kSequences>(p, longest_first, grid_tile(m_index, m_blocks, longest_first), m_blocks,
                                           block_m, blk);
}

}  // namespace waveboost::cuda
