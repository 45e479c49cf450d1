// Combining attention over disjoint key sets through their log-sum-exps: split-KV pieces of one
// kernel (decode), merge_attention_states' parts, and context-parallel shards all end here.
//
// For each output row, with part LSEs l_s and L = log sum_s exp(l_s):
//   out = sum_s exp(l_s - L) * O_s,   lse = L.
// A part with l_s = -inf saw no key and contributes nothing (its O_s is not read); a row whose
// parts are all -inf is zeros with lse -inf; a NaN LSE makes the row NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "waveboost/attention.h"

namespace waveboost::cuda::core {

/// \brief Parts (num_parts, batch, seqlen, heads, head_dim) and their LSEs
/// (num_parts, batch, heads, seqlen) -> out (batch, seqlen, heads, head_dim), lse (batch, heads,
/// seqlen). Element strides; head_dim is contiguous everywhere. With cu_seqlens, out and lse are
/// packed (total, heads, head_dim) / (heads, total) and row r of sequence b (r < its length) is
/// packed row cu_seqlens[b] + r; the parts stay (.., batch, seqlen, ..) with seqlen the bound.
struct CombineParams {
  const void* parts = nullptr;
  int64_t part_stride = 0, part_batch_stride = 0, part_row_stride = 0, part_head_stride = 0;
  const float* part_lse = nullptr;
  int64_t lse_part_stride = 0, lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  void* out = nullptr;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float* lse = nullptr;  // optional
  int64_t lse_out_batch_stride = 0, lse_out_head_stride = 0;  // row stride 1

  const int32_t* cu_seqlens = nullptr;  // optional (batch + 1)

  int64_t num_parts = 0, batch = 0, seqlen = 0, heads = 0, head_dim = 0;
};

/// The combine of a forward call's split-KV pieces into p.out and p.lse: num_parts fp32 pieces
/// of O, [part][batch][...][head_dim] with the given row and head strides (elements) inside a
/// batch of heads x seqlen_q rows, and their LSEs, [part][batch][head][row].
inline CombineParams split_pieces(const AttentionParams& p, const float* o_parts, const float* lse_parts,
                                  int num_parts, int64_t part_row_stride, int64_t part_head_stride) {
  CombineParams c;
  c.parts = o_parts;
  c.part_row_stride = part_row_stride;
  c.part_head_stride = part_head_stride;
  c.part_batch_stride = p.heads * p.seqlen_q * p.head_dim;
  c.part_stride = p.batch * c.part_batch_stride;
  c.part_lse = lse_parts;
  c.lse_row_stride = 1;
  c.lse_head_stride = p.seqlen_q;
  c.lse_batch_stride = p.heads * p.seqlen_q;
  c.lse_part_stride = p.batch * c.lse_batch_stride;
  c.out = p.out;
  c.o_batch_stride = p.o_batch_stride;
  c.o_row_stride = p.o_row_stride;
  c.o_head_stride = p.o_head_stride;
  c.lse = p.lse;
  c.lse_out_batch_stride = p.lse_batch_stride;
  c.lse_out_head_stride = p.lse_head_stride;
  c.cu_seqlens = p.cu_seqlens_q;
  c.num_parts = num_parts;
  c.batch = p.batch;
  c.seqlen = p.seqlen_q;
  c.heads = p.heads;
  c.head_dim = p.head_dim;
  return c;
}

/// Launches the combine on `stream` (the parts' device must be current). part_dtype and
/// out_dtype: float16, bfloat16 or float32.
Status launch_combine(const CombineParams& params, DType part_dtype, DType out_dtype, cudaStream_t stream);

#ifdef __CUDACC__
namespace combine_detail {

constexpr int kThreads = 256;
// Threads per output row: a warp, 4 elements per lane, covers head dim 128 in one pass.
constexpr int kGroup = 32;
// Parts whose LSEs, then whose O rows, are loaded together before any is used: a row's combine is
// a chain of dependent memory round trips otherwise (33 parts x 2 passes took ~25 us on an H100).
// kPartsInFlight with scalar accesses; kManyParts (below) with 16 B / 8 B vector ones.
constexpr int kPartsInFlight = 8;
// Part LSEs per lane loaded together when a row's LSE is computed.
constexpr int kLsesInFlight = 4;
constexpr int kRowsPerBlock = kThreads / kGroup;
// Rows of more parts than kManyParts take combine_many_kernel: 2-8 warps per row, each loading
// kManyParts parts' O together, for head dims up to kManyMaxDim (the warps' sums meet in shared memory).
constexpr int kManyParts = 16;
constexpr int kManyMaxDim = 256;
constexpr int kManySlices = kManyMaxDim / (4 * kGroup);  // 4-element slices per lane
// Rows of at most kFewParts parts take combine_few_kernel (one round trip per row).
constexpr int kFewParts = 8;

template <typename T>
__device__ __forceinline__ float load_one(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(*p);
  } else {
    return __bfloat162float(*p);
  }
}

// Four consecutive elements' bytes as one vector load: 16 B (fp32) or 8 B (16-bit). A kernel that
// wants several loads in flight loads them all raw before widening any (converted as each lands,
// ptxas keeps 3-4 in flight).
template <typename T>
using Raw4 = std::conditional_t<std::is_same_v<T, float>, float4, uint2>;

template <typename T>
__device__ __forceinline__ Raw4<T> load_raw4(const T* p) {
  return *reinterpret_cast<const Raw4<T>*>(p);
}

template <typename T>
__device__ __forceinline__ float4 widen4(const Raw4<T>& bits) {
  if constexpr (std::is_same_v<T, float>) {
    return bits;
  } else {
    T e[4];
    memcpy(e, &bits, sizeof(bits));
    return make_float4(load_one(e), load_one(e + 1), load_one(e + 2), load_one(e + 3));
  }
}

// Four consecutive elements as floats, one scalar load each (layouts without vector alignment).
template <typename T>
__device__ __forceinline__ float4 load4_scalar(const T* p) {
  return make_float4(load_one(p), load_one(p + 1), load_one(p + 2), load_one(p + 3));
}

template <typename T>
__device__ __forceinline__ T store_one(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

template <typename T, bool kVector>
__device__ __forceinline__ void store4(T* p, float4 v) {
  if constexpr (kVector && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    T e[4] = {store_one<T>(v.x), store_one<T>(v.y), store_one<T>(v.z), store_one<T>(v.w)};
    if constexpr (kVector) {
      uint2 bits;
      memcpy(&bits, e, sizeof(bits));
      *reinterpret_cast<uint2*>(p) = bits;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = e[i];
    }
  }
}

__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
static_assert(kGroup == 32, "a row per warp: the reductions span the whole warp");
static_assert((kLsesInFlight * kGroup & (kLsesInFlight * kGroup - 1)) == 0, "held weights: a power of two");
__device__ __forceinline__ bool group_any(bool x) { return __any_sync(0xffffffffu, x); }

}  // namespace combine_detail

/// \brief Where output row `row` (in (batch, row, head) order) reads its parts and writes its
/// result: live false past the rows, or past its sequence's length under cu_seqlens.
struct RowPlace {
  bool live;
  const float* lses;      // the row's LSE of part 0; part s at s * lse_part_stride
  int64_t parts, out;     // element offsets of the row's part 0 and of its output row
  int64_t lse_at;         // the output LSE's offset
};

__device__ __forceinline__ RowPlace place_row(const CombineParams& p, int64_t row) {
  RowPlace at{};
  const int64_t rows = p.batch * p.seqlen * p.heads;
  at.live = row < rows;
  int64_t h = 0, r = 0, b = 0;
  if (at.live && rows <= UINT32_MAX) {  // 32-bit division where it fits (64-bit division is a long routine)
    const auto row32 = static_cast<uint32_t>(row), heads = static_cast<uint32_t>(p.heads);
    const uint32_t outer = row32 / heads, seqlen = static_cast<uint32_t>(p.seqlen);
    h = row32 - outer * heads;
    r = outer % seqlen;
    b = outer / seqlen;
  } else if (at.live) {
    h = row % p.heads;
    r = (row / p.heads) % p.seqlen;
    b = row / (p.heads * p.seqlen);
  }
  int64_t packed = r;
  if (at.live && p.cu_seqlens != nullptr) {
    const int64_t start = p.cu_seqlens[b];
    at.live = r < p.cu_seqlens[b + 1] - start;
    packed = start + r;
  }
  at.lses = p.part_lse + b * p.lse_batch_stride + h * p.lse_head_stride + r * p.lse_row_stride;
  at.parts = b * p.part_batch_stride + r * p.part_row_stride + h * p.part_head_stride;
  at.out = (p.cu_seqlens != nullptr ? 0 : b * p.o_batch_stride) + packed * p.o_row_stride + h * p.o_head_stride;
  at.lse_at = p.cu_seqlens != nullptr ? h * p.lse_out_head_stride + packed
                                      : b * p.lse_out_batch_stride + h * p.lse_out_head_stride + r;
  return at;
}

/// \brief An output row's place (RowPlace) and its combined LSE: the parts' LSEs spread over the
/// warp's lanes (L = max + log(sum exp(l_s - max))). Every lane takes part in the shuffles; a dead
/// row has live false. The weights exp(l_s - L) of the first kLsesInFlight x 32 parts stay in
/// registers, part s in lane s % 32's weight[s / 32] (held_weight; loaded_weight reads any part's
/// from memory).
struct CombineRow : RowPlace {
  bool nan;
  float max_lse, inv_total, lse;
  float weight[combine_detail::kLsesInFlight];
};

__device__ __forceinline__ CombineRow combine_row(const CombineParams& p, int64_t row, int lane) {
  using namespace combine_detail;
  CombineRow c{};
  static_cast<RowPlace&>(c) = place_row(p, row);
  // kLsesInFlight parts per lane are loaded together (one round trip to memory for up to 128 parts),
  // and the first such batch stays in registers for the sum and the weights.
  float first[kLsesInFlight] = {};
  float max_lse = -INFINITY;
  bool nan = false;
  for (int64_t s0 = 0; s0 < p.num_parts; s0 += kLsesInFlight * kGroup) {
    float l[kLsesInFlight];
#pragma unroll
    for (int u = 0; u < kLsesInFlight; ++u) {
      const int64_t s = s0 + u * kGroup + lane;
      l[u] = c.live && s < p.num_parts ? c.lses[s * p.lse_part_stride] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kLsesInFlight; ++u) {
      nan |= isnan(l[u]);
      max_lse = fmaxf(max_lse, l[u]);
      if (s0 == 0) first[u] = l[u];
    }
  }
  max_lse = group_max(max_lse);
  nan = group_any(nan);
  float total = 0.f;
  if (c.live && !nan && max_lse != -INFINITY) {
#pragma unroll
    for (int u = 0; u < kLsesInFlight; ++u) {
      c.weight[u] = expf(first[u] - max_lse);  // a part past the end: exp(-inf) = 0
      total += c.weight[u];
    }
    for (int64_t s = kLsesInFlight * kGroup + lane; s < p.num_parts; s += kGroup)
      total += expf(c.lses[s * p.lse_part_stride] - max_lse);
  }
  total = group_sum(total);
  c.nan = nan;
  c.max_lse = max_lse;
  if (nan) {
    c.lse = NAN;
  } else if (max_lse == -INFINITY) {
    c.lse = -INFINITY;
  } else {
    c.lse = max_lse + logf(total);
    c.inv_total = 1.f / total;
#pragma unroll
    for (int u = 0; u < kLsesInFlight; ++u) c.weight[u] *= c.inv_total;
  }
  return c;
}

/// \brief Part s's weight exp(l_s - L) from its LSE in memory (any lane, any s).
__device__ __forceinline__ float loaded_weight(const CombineParams& p, const CombineRow& c, int64_t s) {
  return expf(c.lses[s * p.lse_part_stride] - c.max_lse) * c.inv_total;
}

/// \brief Part s's weight exp(l_s - L), s < kLsesInFlight x 32 and the same in every lane of the
/// warp: a shuffle from the lane that holds it.
__device__ __forceinline__ float held_weight(const CombineRow& c, int s) {
  using namespace combine_detail;
  const int slot = s / kGroup;
  float held = c.weight[0];
#pragma unroll
  for (int u = 1; u < kLsesInFlight; ++u) held = slot == u ? c.weight[u] : held;
  return __shfl_sync(0xffffffffu, held, s % kGroup);
}

/// \brief acc += the weighted O of parts [s0, s_end) (at most kIn of them), elements d .. d + 3 of
/// the row: the kIn weights first, then the O loads together. A part that saw no key (or is
/// negligible) is not read: its O may hold anything. Every lane of the warp takes part, with the same
/// s0 and s_end; one whose elements lie past the row (active false) loads nothing.
template <int kIn, typename PartT, bool kVector>
__device__ __forceinline__ void add_parts(const CombineParams& p, const CombineRow& c, const PartT* parts, int64_t s0,
                                          int64_t s_end, int64_t d, bool active, float4& acc) {
  using namespace combine_detail;
  float w[kIn];
  float4 o[kIn];
  if (s_end <= kLsesInFlight * kGroup) {  // every weight held in the warp's registers
#pragma unroll
    for (int u = 0; u < kIn; ++u) {
      const int s = static_cast<int>(s0) + u;
      const float held = held_weight(c, s & (kLsesInFlight * kGroup - 1));
      w[u] = s < s_end ? held : 0.f;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kIn; ++u) {
      const int64_t s = s0 + u;
      w[u] = s >= s_end ? 0.f
             : s < kLsesInFlight * kGroup ? held_weight(c, static_cast<int>(s))
                                          : loaded_weight(p, c, s);
    }
  }
  if constexpr (kVector) {  // every part's raw bytes first, widened once all are loaded
    Raw4<PartT> bits[kIn];
#pragma unroll
    for (int u = 0; u < kIn; ++u)
      bits[u] = active && w[u] != 0.f ? load_raw4(parts + (s0 + u) * p.part_stride + d) : Raw4<PartT>{};
#pragma unroll
    for (int u = 0; u < kIn; ++u) o[u] = widen4<PartT>(bits[u]);
  } else {
#pragma unroll
    for (int u = 0; u < kIn; ++u)
      o[u] = active && w[u] != 0.f ? load4_scalar(parts + (s0 + u) * p.part_stride + d)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kIn; ++u) {
    acc.x += w[u] * o[u].x;
    acc.y += w[u] * o[u].y;
    acc.z += w[u] * o[u].z;
    acc.w += w[u] * o[u].w;
  }
}

/// \brief One output row per warp, rows in (batch, row, head) order so that consecutive warps
/// write consecutive heads. kVector: every base pointer and stride allows
/// 4-element vector accesses and head_dim % 4 == 0; otherwise head_dim is walked 4 (then 1)
/// at a time with scalar accesses. Two blocks per SM: with that bound ptxas issues a batch's
/// kManyParts O loads together (fp32 parts); without it, one or three at a time, each waited for
/// by its FMAs.
template <typename PartT, typename OutT, bool kVector>
__global__ void __launch_bounds__(combine_detail::kThreads, 2) combine_kernel(const __grid_constant__ CombineParams p) {
  using namespace combine_detail;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const CombineRow c = combine_row(p, row, lane);
  if (!c.live) return;
  const PartT* parts = static_cast<const PartT*>(p.parts) + c.parts;
  OutT* out = static_cast<OutT*>(p.out) + c.out;
  const int64_t d4 = p.head_dim / 4 * 4;
  for (int64_t d0 = 0; d0 < d4; d0 += 4 * kGroup) {  // the whole warp in every pass (held_weight's shuffles)
    const int64_t d = d0 + 4 * lane;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c.nan) {
      acc = make_float4(NAN, NAN, NAN, NAN);
    } else if (c.max_lse != -INFINITY) {
      constexpr int kIn = kVector ? kManyParts : kPartsInFlight;
      for (int64_t s0 = 0; s0 < p.num_parts; s0 += kIn)
        add_parts<kIn, PartT, kVector>(p, c, parts, s0, p.num_parts, d, d < d4, acc);
    }
    if (d < d4) store4<OutT, kVector>(out + d, acc);
  }
  for (int64_t d = d4 + lane; d < p.head_dim; d += kGroup) {  // a head_dim tail (not a multiple of 4)
    float acc = c.nan ? NAN : 0.f;
    if (!c.nan && c.max_lse != -INFINITY) {
      for (int64_t s = 0; s < p.num_parts; ++s) {
        const float w = loaded_weight(p, c, s);
        if (w != 0.f) acc += w * load_one(parts + s * p.part_stride + d);
      }
    }
    out[d] = store_one<OutT>(acc);
  }
  if (p.lse != nullptr && lane == 0) p.lse[c.lse_at] = c.lse;
}

/// \brief The combine of rows of at most kParts parts (vector accesses, head_dim <= kManyMaxDim), one
/// row per warp in one round trip to memory: every lane loads the row's kParts LSEs (the same
/// addresses across the warp) together with its slices of every part's O, then weighs them. A part
/// whose weight is 0 (LSE -inf, or negligible) contributes nothing even if its O holds a NaN or an
/// Inf (it is read, but selected away). The other kernels load a row's O only after its LSEs, two
/// round trips: a merge of two parts of 512k rows moved 0.9 TB/s that way, bound by rows, not bytes.
template <int kParts, typename PartT, typename OutT>
__global__ void __launch_bounds__(combine_detail::kThreads) combine_few_kernel(const __grid_constant__ CombineParams p) {
  using namespace combine_detail;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const RowPlace at = place_row(p, row);
  if (!at.live) return;
  const PartT* parts = static_cast<const PartT*>(p.parts) + at.parts;
  float l[kParts];
  Raw4<PartT> bits[kParts][kManySlices];
#pragma unroll
  for (int u = 0; u < kParts; ++u) {
    l[u] = u < p.num_parts ? at.lses[u * p.lse_part_stride] : -INFINITY;
#pragma unroll
    for (int k = 0; k < kManySlices; ++k) {
      const int64_t d = 4 * (lane + k * kGroup);
      bits[u][k] = u < p.num_parts && d < p.head_dim ? load_raw4(parts + u * p.part_stride + d) : Raw4<PartT>{};
    }
  }
  float max_lse = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int u = 0; u < kParts; ++u) {
    nan |= isnan(l[u]);
    max_lse = fmaxf(max_lse, l[u]);
  }
  float w[kParts], total = 0.f;
#pragma unroll
  for (int u = 0; u < kParts; ++u) {
    w[u] = max_lse == -INFINITY ? 0.f : expf(l[u] - max_lse);  // a part past the end: exp(-inf) = 0
    total += w[u];
  }
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  OutT* out = static_cast<OutT*>(p.out) + at.out;
#pragma unroll
  for (int k = 0; k < kManySlices; ++k) {
    const int64_t d = 4 * (lane + k * kGroup);
    if (d >= p.head_dim) break;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int u = 0; u < kParts; ++u) {
      const float wu = w[u] * inv_total;
      const float4 o = widen4<PartT>(bits[u][k]);
      if (wu != 0.f) {
        acc.x += wu * o.x;
        acc.y += wu * o.y;
        acc.z += wu * o.z;
        acc.w += wu * o.w;
      }
    }
    if (nan) acc = make_float4(NAN, NAN, NAN, NAN);
    store4<OutT, true>(out + d, acc);
  }
  if (p.lse != nullptr && lane == 0)
    p.lse[at.lse_at] = nan ? NAN : max_lse == -INFINITY ? -INFINITY : max_lse + logf(total);
}

/// \brief The combine of rows of many parts (more than kManyParts; vector accesses, head_dim <=
/// kManyMaxDim): warps_per_row (2, 4 or 8) warps share each row, warp k of a row summing the weighted
/// O of the row's k-th share of the parts (at most kManyParts loaded together), and the shares meet
/// in shared memory, where the row's first warp adds them in order and writes the row. Each warp
/// computes the row's LSE itself (the LSEs are a small part of the bytes). One warp per row walks
/// its parts as a chain of round trips to memory, each a few parts long: 128 parts on 32 rows (a
/// batch-1 MQA decode step) were ~30 us that way (benchmarks/NOTES.md, "The combine of many parts").
template <typename PartT, typename OutT>
__global__ void __launch_bounds__(combine_detail::kThreads, 2)
    combine_many_kernel(const __grid_constant__ CombineParams p, int warps_per_row) {
  using namespace combine_detail;
  __shared__ float4 share_sum[kThreads / kGroup][kManySlices * kGroup];
  const int warp = threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  const int share = warp % warps_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kGroup / warps_per_row) + warp / warps_per_row;
  const CombineRow c = combine_row(p, row, lane);
  const PartT* parts = static_cast<const PartT*>(p.parts) + c.parts;
  const int64_t per_share = (p.num_parts + warps_per_row - 1) / warps_per_row;
  const int64_t s_begin = share * per_share;
  const int64_t s_end = s_begin + per_share < p.num_parts ? s_begin + per_share : p.num_parts;
#pragma unroll
  for (int k = 0; k < kManySlices; ++k) {
    const int64_t d = 4 * (lane + k * kGroup);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c.live && !c.nan && c.max_lse != -INFINITY && 4 * k * kGroup < p.head_dim) {  // the same in the whole warp
      for (int64_t s0 = s_begin; s0 < s_end; s0 += kManyParts)
        add_parts<kManyParts, PartT, true>(p, c, parts, s0, s_end, d, d < p.head_dim, acc);
    }
    share_sum[warp][lane + k * kGroup] = acc;
  }
  __syncthreads();
  if (!c.live || share != 0) return;
  OutT* out = static_cast<OutT*>(p.out) + c.out;
#pragma unroll
  for (int k = 0; k < kManySlices; ++k) {
    const int64_t d = 4 * (lane + k * kGroup);
    if (d >= p.head_dim) break;
    float4 acc = share_sum[warp][lane + k * kGroup];
    for (int w = 1; w < warps_per_row; ++w) {
      const float4 x = share_sum[warp + w][lane + k * kGroup];
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    if (c.nan) acc = make_float4(NAN, NAN, NAN, NAN);
    store4<OutT, true>(out + d, acc);
  }
  if (p.lse != nullptr && lane == 0) p.lse[c.lse_at] = c.lse;
}

#endif  // __CUDACC__

}  // namespace waveboost::cuda::core
