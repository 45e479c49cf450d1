// Appending new keys and values to a KV cache (dense or paged) at each sequence's end.
//
// Row i of sequence b lands at position cache_seqlens[b] + i; every row of head_dim elements is
// a memory-bound copy, in 16 B pieces where the pointers and strides allow. Positions past the
// capacity, and page ids outside [0, num_pages), are skipped rather than written (the Python
// layer's validate=True reports them): a bad index never writes out of bounds.
#pragma once

#include <cstdint>

#include "waveboost/attention.h"

namespace waveboost::cuda {

namespace kv_append_detail {
constexpr int kThreads = 256;
constexpr int kGroup = 16;  // threads per copied row
constexpr int kRowsPerBlock = kThreads / kGroup;
}  // namespace kv_append_detail

/// \brief One row (b, i, kv head) per group of 16 threads. Word: the unit each thread moves (16 B
/// when every base and stride allows it, else one element of kElementBytes).
template <typename Word, int kElementBytes>
__global__ void __launch_bounds__(kv_append_detail::kThreads)
    kv_cache_append_kernel(const __grid_constant__ KVCacheAppendParams p) {
  using namespace kv_append_detail;
  const int64_t rows = p.batch * p.seqlen_new * p.heads_kv;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup;
  if (row >= rows) return;
  const int lane = threadIdx.x % kGroup;
  const int64_t h = row % p.heads_kv;
  const int64_t i = (row / p.heads_kv) % p.seqlen_new;
  const int64_t b = row / (p.heads_kv * p.seqlen_new);
  const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + i;
  // The new length, here unless seqused_out is cache_seqlens itself (then a second kernel
  // writes it, after every row has read the old one).
  if (p.seqused_out != nullptr && p.seqused_out != p.cache_seqlens && i == 0 && h == 0 && lane == 0)
    p.seqused_out[b] = static_cast<int32_t>(pos + p.seqlen_new);
  if (pos < 0 || pos >= p.capacity) return;
  int64_t k_at, v_at;
  if (p.block_table != nullptr) {
    const int64_t page = p.block_table[b * p.block_table_batch_stride + pos / p.page_size];
    if (page < 0 || page >= p.num_pages) return;
    const int64_t r = pos % p.page_size;
    k_at = page * p.kc_batch_stride + r * p.kc_row_stride + h * p.kc_head_stride;
    v_at = page * p.vc_batch_stride + r * p.vc_row_stride + h * p.vc_head_stride;
  } else {
    k_at = b * p.kc_batch_stride + pos * p.kc_row_stride + h * p.kc_head_stride;
    v_at = b * p.vc_batch_stride + pos * p.vc_row_stride + h * p.vc_head_stride;
  }
  const int64_t kn_at = b * p.kn_batch_stride + i * p.kn_row_stride + h * p.kn_head_stride;
  const int64_t vn_at = b * p.vn_batch_stride + i * p.vn_row_stride + h * p.vn_head_stride;
  using Bytes = char;
  const auto word = [](const void* base, int64_t element) {
    return reinterpret_cast<const Word*>(static_cast<const Bytes*>(base) + element * kElementBytes);
  };
  const auto word_out = [](void* base, int64_t element) {
    return reinterpret_cast<Word*>(static_cast<Bytes*>(base) + element * kElementBytes);
  };
  const int64_t words = p.head_dim * kElementBytes / int64_t{sizeof(Word)};
  const Word* kn = word(p.k_new, kn_at);
  const Word* vn = word(p.v_new, vn_at);
  Word* kc = word_out(p.k_cache, k_at);
  Word* vc = word_out(p.v_cache, v_at);
  for (int64_t w = lane; w < words; w += kGroup) {
    kc[w] = kn[w];
    vc[w] = vn[w];
  }
}

/// \brief seqused_out[b] = cache_seqlens[b] + seqlen_new, for when the two alias or no row is copied.
template <typename Index>
__global__ void kv_cache_lengths_kernel(const Index* cache_seqlens, Index* seqused_out, int64_t batch,
                                        int64_t seqlen_new) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < batch) seqused_out[b] = static_cast<Index>(cache_seqlens[b] + seqlen_new);
}

}  // namespace waveboost::cuda
