// Serving pieces on the host: merging partial attention states, appending to a KV cache.
// Both are copies or elementwise maps, so they take every dtype (fp16/bf16 through the
// compiler's _Float16 and bit-level bfloat16 conversions) and accumulate in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "cpu_attention.h"
#include "thread_pool.h"

namespace waveboost::cpu {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

float bfloat16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stay a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

double load(const void* base, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return static_cast<double>(static_cast<const _Float16*>(base)[index]);
    case DType::kBFloat16: return bfloat16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kFloat32: return static_cast<const float*>(base)[index];
    case DType::kFloat64: return static_cast<const double*>(base)[index];
    case DType::kFloat8E4M3: break;  // refused by merge_attention_states
  }
  return 0;
}

void store(void* base, int64_t index, DType dtype, double value) {
  switch (dtype) {
    // bfloat16 is rounded from the float value (as every framework's conversion does).
    case DType::kFloat16: static_cast<_Float16*>(base)[index] = static_cast<_Float16>(value); return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[index] = float_to_bfloat16(static_cast<float>(value));
      return;
    case DType::kFloat32: static_cast<float*>(base)[index] = static_cast<float>(value); return;
    case DType::kFloat64: static_cast<double*>(base)[index] = value; return;
    case DType::kFloat8E4M3: return;  // refused by merge_attention_states
  }
}

}  // namespace

Status merge_attention_states(const MergeStatesParams& p) {
  if (dtype_size(p.dtype) == 0 || dtype_size(p.outs_dtype) == 0 || p.dtype == DType::kFloat8E4M3 ||
      p.outs_dtype == DType::kFloat8E4M3)
    return Status::InvalidArgument("merge_attention_states: dtype is not one of float16, bfloat16, float32, float64");
  for (auto [value, name] : {std::pair{p.num_parts, "num_parts"}, {p.batch, "batch"}, {p.seqlen, "seqlen"},
                             {p.heads, "heads"}, {p.head_dim, "head_dim"}})
    if (value < 0) return Status::InvalidArgument(std::string(name) + " must be >= 0; got " + str(value));
  const int64_t rows = p.batch * p.seqlen;
  if (rows == 0 || p.heads == 0) return Status::Ok();
  if (p.num_parts > 0 && (p.outs == nullptr || p.lses == nullptr))
    return Status::InvalidArgument("merge_attention_states: outs or lses is a null pointer");
  if (p.out == nullptr) return Status::InvalidArgument("merge_attention_states: out is a null pointer");

  // One task per (batch, row): every output element is written by one task in a fixed order.
  global_thread_pool().parallel_for(rows, [&](int64_t task) {
    const int64_t b = task / p.seqlen, row = task % p.seqlen;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t lse_at = b * p.lses_batch_stride + h * p.lses_head_stride + row * p.lses_row_stride;
      // max over parts; a NaN anywhere wins (!(x <= m)) so that it reaches out and lse.
      double lse_max = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < p.num_parts; ++i) {
        const double x = p.lses[i * p.lses_part_stride + lse_at];
        if (!(x <= lse_max)) lse_max = x;
      }
      const int64_t o_at = b * p.o_batch_stride + row * p.o_row_stride + h * p.o_head_stride;
      const int64_t outs_at = b * p.outs_batch_stride + row * p.outs_row_stride + h * p.outs_head_stride;
      double merged_lse;
      if (lse_max == -std::numeric_limits<double>::infinity()) {  // no part saw a key
        for (int64_t d = 0; d < p.head_dim; ++d) store(p.out, o_at + d, p.dtype, 0.0);
        merged_lse = lse_max;
      } else {
        double weight_sum = 0;
        for (int64_t i = 0; i < p.num_parts; ++i)
          weight_sum += std::exp(static_cast<double>(p.lses[i * p.lses_part_stride + lse_at]) - lse_max);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          double acc = 0;
          for (int64_t i = 0; i < p.num_parts; ++i) {
            const double w = std::exp(static_cast<double>(p.lses[i * p.lses_part_stride + lse_at]) - lse_max);
            // A part that saw no key has weight 0 whatever its (unwritten or zero) output holds.
            if (w != 0 || std::isnan(w)) acc += w * load(p.outs, i * p.outs_part_stride + outs_at + d, p.outs_dtype);
          }
          store(p.out, o_at + d, p.dtype, acc / weight_sum);
        }
        merged_lse = lse_max + std::log(weight_sum);
      }
      if (p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + row] = static_cast<float>(merged_lse);
    }
  });
  return Status::Ok();
}

Status kv_cache_append(const KVCacheAppendParams& p) {
  const int64_t elem = dtype_size(p.dtype);
  if (elem == 0) return Status::InvalidArgument("kv_cache_append: dtype is not one of float16, bfloat16, float32, float64");
  for (auto [value, name] : {std::pair{p.batch, "batch"}, {p.seqlen_new, "seqlen_new"}, {p.heads_kv, "heads_kv"},
                             {p.head_dim, "head_dim"}, {p.capacity, "capacity"}})
    if (value < 0) return Status::InvalidArgument(std::string(name) + " must be >= 0; got " + str(value));
  if (p.batch > 0 && p.cache_seqlens == nullptr)
    return Status::InvalidArgument("kv_cache_append: cache_seqlens is a null pointer");
  if (p.block_table != nullptr && p.page_size < 1)
    return Status::InvalidArgument("page_size must be >= 1 with a block_table; got " + str(p.page_size));

  // Every index is checked before anything is written: a bad one leaves the cache untouched.
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t start = p.cache_seqlens[b], end = start + p.seqlen_new;
    if (start < 0 || end > p.capacity)
      return Status::InvalidArgument("cache_seqlens[" + str(b) + "] = " + str(start) + " plus " + str(p.seqlen_new) +
                                     " new keys does not fit the cache's " + str(p.capacity) + " positions");
    if (p.block_table != nullptr && p.seqlen_new > 0) {
      const int32_t* pages = p.block_table + b * p.block_table_batch_stride;
      for (int64_t i = start / p.page_size; i <= (end - 1) / p.page_size; ++i)
        if (pages[i] < 0 || pages[i] >= p.num_pages)
          return Status::InvalidArgument("block_table[" + str(b) + ", " + str(i) + "] = " + str(pages[i]) +
                                         " is not a page id in [0, " + str(p.num_pages) + ")");
    }
  }
  const size_t row_bytes = static_cast<size_t>(p.head_dim * elem);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t start = p.cache_seqlens[b];
    for (int64_t i = 0; i < p.seqlen_new; ++i) {
      const int64_t pos = start + i;
      int64_t k_row = b * p.kc_batch_stride + pos * p.kc_row_stride;
      int64_t v_row = b * p.vc_batch_stride + pos * p.vc_row_stride;
      if (p.block_table != nullptr) {
        const int64_t page = p.block_table[b * p.block_table_batch_stride + pos / p.page_size];
        k_row = page * p.kc_batch_stride + (pos % p.page_size) * p.kc_row_stride;
        v_row = page * p.vc_batch_stride + (pos % p.page_size) * p.vc_row_stride;
      }
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        std::memcpy(static_cast<char*>(p.k_cache) + (k_row + h * p.kc_head_stride) * elem,
                    static_cast<const char*>(p.k_new) + (b * p.kn_batch_stride + i * p.kn_row_stride + h * p.kn_head_stride) * elem,
                    row_bytes);
        std::memcpy(static_cast<char*>(p.v_cache) + (v_row + h * p.vc_head_stride) * elem,
                    static_cast<const char*>(p.v_new) + (b * p.vn_batch_stride + i * p.vn_row_stride + h * p.vn_head_stride) * elem,
                    row_bytes);
      }
    }
    if (p.seqused_out != nullptr) p.seqused_out[b] = static_cast<int32_t>(start + p.seqlen_new);
  }
  return Status::Ok();
}

}  // namespace waveboost::cpu
