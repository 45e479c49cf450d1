// Sequence geometry shared by the CUDA kernels that read the sequence-layout fields of
// AttentionParams (varlen cu_seqlens, seqused_k, paged block_table): how long sequence b is on
// each side, where its query rows live, and where key j of a kv head lives in K and V, dense,
// packed or paged. The kv-cache append kernel uses the same address arithmetic to write. The
// lengths come from core/sequence.cuh's sequence_lengths, which the flash paths read too.
//
// Everything is read on the device (lengths, tables): nothing here makes the host wait, so
// calls stay capturable in CUDA graphs.
#pragma once

#include <cstdint>

#include "waveboost/attention.h"
#include "waveboost/cuda/core/sequence.cuh"

namespace waveboost::cuda::core {

using cuda::SequenceLengths;
using cuda::sequence_lengths;

/// \brief Lengths and packed offsets of one sequence of a (possibly varlen / seqused) batch.
struct SequenceInfo {
  int64_t len_q = 0;    // query rows of the sequence
  int64_t len_k = 0;    // keys it attends to (seqused_k when given)
  int64_t q_start = 0;  // first packed row with cu_seqlens_q, else 0
  int64_t k_start = 0;  // first packed key with cu_seqlens_k, else 0

  __device__ __forceinline__ static SequenceInfo of(const AttentionParams& p, int64_t b) {
    const SequenceLengths len = sequence_lengths(p, b);  // core/sequence.cuh: the one reader of the arrays
    SequenceInfo s;
    s.len_q = len.q;
    s.len_k = len.k;
    s.q_start = len.q_start;
    s.k_start = len.k_start;
    return s;
  }

  // Keys query row i sees: all of them, or under the bottom-right causal mask those
  // j <= i + len_k - len_q (possibly none).
  __device__ __forceinline__ int64_t keys_visible(int64_t i, bool causal) const {
    return causal ? causal_keys_visible(i, len_q, len_k) : len_k;
  }

  // Element offsets of query row i of head h in q, out, and of its LSE.
  __device__ __forceinline__ int64_t q_offset(const AttentionParams& p, int64_t b, int64_t i, int64_t h) const {
    const int64_t row = p.cu_seqlens_q != nullptr ? q_start + i : i;
    return (p.cu_seqlens_q != nullptr ? 0 : b * p.q_batch_stride) + row * p.q_row_stride + h * p.q_head_stride;
  }
  __device__ __forceinline__ int64_t o_offset(const AttentionParams& p, int64_t b, int64_t i, int64_t h) const {
    const int64_t row = p.cu_seqlens_q != nullptr ? q_start + i : i;
    return (p.cu_seqlens_q != nullptr ? 0 : b * p.o_batch_stride) + row * p.o_row_stride + h * p.o_head_stride;
  }
  // lse is (batch, heads, seqlen_q), or (heads, total_q) with cu_seqlens_q.
  __device__ __forceinline__ int64_t lse_offset(const AttentionParams& p, int64_t b, int64_t i, int64_t h) const {
    if (p.cu_seqlens_q != nullptr) return h * p.lse_head_stride + q_start + i;
    return b * p.lse_batch_stride + h * p.lse_head_stride + i;
  }
};

/// \brief Where the keys of one (sequence, kv head) live: key j's element offset in K and in V.
/// Dense: batch and row strides; packed (cu_seqlens_k): rows from the sequence's first key;
/// paged: row j % page_size of page table_row[j / page_size], the batch strides stepping a page.
struct KVAddress {
  const int32_t* table_row = nullptr;  // the sequence's block_table row, or nullptr
  int64_t k_base = 0, v_base = 0;      // offset of key 0 (dense, packed) or of the head (paged)
  int64_t k_row_stride = 0, v_row_stride = 0;
  int64_t k_page_stride = 0, v_page_stride = 0;
  int64_t page_size = 1;
  int64_t num_pages = 0;
  int page_shift = -1;  // log2(page_size) when it is a power of two: shifts instead of 64-bit divisions

  __device__ __forceinline__ static KVAddress of(const AttentionParams& p, const SequenceInfo& seq, int64_t b,
                                                 int64_t h_kv) {
    KVAddress a;
    a.k_row_stride = p.k_row_stride;
    a.v_row_stride = p.v_row_stride;
    a.k_base = h_kv * p.k_head_stride;
    a.v_base = h_kv * p.v_head_stride;
    if (p.block_table != nullptr) {
      a.table_row = p.block_table + b * p.block_table_batch_stride;
      a.k_page_stride = p.k_batch_stride;
      a.v_page_stride = p.v_batch_stride;
      a.page_size = p.page_size;
      a.num_pages = p.num_pages;
      if ((p.page_size & (p.page_size - 1)) == 0) a.page_shift = __ffsll(p.page_size) - 1;
    } else if (p.cu_seqlens_k != nullptr) {
      a.k_base += seq.k_start * p.k_row_stride;
      a.v_base += seq.k_start * p.v_row_stride;
    } else {
      a.k_base += b * p.k_batch_stride;
      a.v_base += b * p.v_batch_stride;
    }
    return a;
  }

  // Offsets of key j (0 <= j < the sequence's keys) in K and V. A page id outside
  // [0, num_pages) (a corrupt table) yields false: the caller reads zeros instead.
  __device__ __forceinline__ bool locate(int64_t j, int64_t& k_off, int64_t& v_off) const {
    if (table_row == nullptr) {
      k_off = k_base + j * k_row_stride;
      v_off = v_base + j * v_row_stride;
      return true;
    }
    const int64_t page = __ldg(table_row + (page_shift >= 0 ? j >> page_shift : j / page_size));
    const int64_t row = page_shift >= 0 ? j & (page_size - 1) : j % page_size;
    k_off = k_base + page * k_page_stride + row * k_row_stride;
    v_off = v_base + page * v_page_stride + row * v_row_stride;
    return page >= 0 && page < num_pages;
  }

  // Paged, power-of-two pages (page_shift >= 0): key j as (page id, row in its page), the
  // coordinates of a tensor map over the pages (decode's TMA loads). A page id outside
  // [0, num_pages) (a corrupt table) is clamped into it: a real page is read, never past the pool.
  struct PageCoordinates {
    int64_t page;
    int row;
  };
  __device__ __forceinline__ PageCoordinates page_coordinates(int64_t j) const {
    const int64_t page = __ldg(table_row + (j >> page_shift));
    return {page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page), static_cast<int>(j & (page_size - 1))};
  }
};

}  // namespace waveboost::cuda::core
