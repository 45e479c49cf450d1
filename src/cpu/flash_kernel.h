// The CPU flash-attention kernel, written once over a SIMD width.
//
// One call of attention_query_block computes kBlockM query rows of one
// (batch, head): it walks the keys in tiles of kBlockN, computes the score tile
// S = Q K^T, folds it into a running max m and running sum l (online softmax),
// and accumulates O = diag(alpha) O + P V, never holding more than a
// kBlockN x kBlockM tile of scores.
//
// Both products are small GEMMs done by register-blocked micro-tiles: kTileRows
// x kTileVecs SIMD registers of accumulators stay in registers while one
// operand streams through as vectors and the other is broadcast one element
// at a time (one FMA per register per step). Scores are kept transposed,
// S^T (keys x queries), with queries along the SIMD lanes:
//  - S^T = K Q^T reads K in place (broadcasts) against Q^T, which is packed
//    once per task, so K is never transposed per tile;
//  - the softmax reductions over keys run down columns, lane-parallel, with
//    no horizontal shuffles;
//  - O += P V broadcasts P^T[j][i] against rows of V.
//
// Every function here is always_inline. cpu_attention.cpp instantiates the
// kernel inside functions marked __attribute__((target(...))) (AVX-512,
// AVX2+FMA, baseline), and GCC compiles the inlined body, GCC vector
// extensions included, for that function's instruction set. That keeps the
// build portable (no -march flags) with run-time dispatch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "waveboost/attention.h"

#define WAVEBOOST_CPU_INLINE inline __attribute__((always_inline))

namespace waveboost::cpu {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2 = 0.6931471805599453094;

// Micro-tile and block sizes for one instruction set and element type.
template <typename T, int kLanes_, int kTileRows_, int kTileVecs_>
struct KernelConfig {
  using Element = T;
  static constexpr int kLanes = kLanes_;        // elements per SIMD register
  static constexpr int kTileRows = kTileRows_;  // micro-tile rows held in registers
  static constexpr int kTileVecs = kTileVecs_;  // micro-tile width, in SIMD registers
  // Query rows per task and keys per tile. For head_dim 128 fp32 the
  // per-thread working set (Q^T, O 32 KiB each; V tile 64 KiB; P^T 32 KiB)
  // sits in L2. On a Zen 5 core (AVX-512, 8x2 tiles, B1 H8 L2048 D128) 64x128
  // measured as fast as 64x64 and 128x128, 5% ahead of 32x128; the GEMMs take
  // ~80% of the time, the softmax most of the rest.
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 128;
};

// Micro-tiles sized to the register file: the accumulators plus kTileVecs
// streamed vectors and a broadcast must fit (32 zmm with AVX-512, 16 ymm/xmm
// otherwise). With AVX-512 on Zen 5, fp32, 8x2 measured 3% ahead of 4x4 and
// 6x4 and 13% ahead of 12x2. Avx2Config (6x2) is in flash_kernel_avx2.h.
template <typename T>
using Avx512Config = KernelConfig<T, 64 / sizeof(T), 8, 2>;
template <typename T>
using BaselineConfig = KernelConfig<T, 16 / sizeof(T), 4, 2>;

enum class Isa { kBaseline, kAvx2, kAvx512 };

// The widest instruction set the host has, for the forward and the backward alike.
// WAVEBOOST_CPU_ISA=avx2|baseline caps the choice (to test the other paths on a machine that
// has AVX-512); it never enables what the CPU lacks.
inline Isa detect_isa() {
  Isa best = Isa::kBaseline;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f")) best = Isa::kAvx512;
#endif
  if (const char* cap = std::getenv("WAVEBOOST_CPU_ISA")) {
    if (std::strcmp(cap, "baseline") == 0) best = Isa::kBaseline;
    if (std::strcmp(cap, "avx2") == 0 && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

template <typename T>
struct FloatBits;
template <>
struct FloatBits<float> {
  using Int = uint32_t;
  static constexpr int kMantissaBits = 23;
  static constexpr int kExponentBias = 127;
  static constexpr int kExp2Degree = 7;  // Taylor truncation error 5e-9 < 0.1 ulp
};
template <>
struct FloatBits<double> {
  using Int = uint64_t;
  static constexpr int kMantissaBits = 52;
  static constexpr int kExponentBias = 1023;
  static constexpr int kExp2Degree = 12;  // Taylor truncation error 1.7e-16 < 1 ulp
};

// kLanes elements of T in one register (GCC vector extension).
template <typename T, int kLanes>
struct Simd {
  typedef T Vec __attribute__((vector_size(sizeof(T) * kLanes)));
  typedef typename FloatBits<T>::Int Bits __attribute__((vector_size(sizeof(T) * kLanes)));

  static WAVEBOOST_CPU_INLINE Vec load(const T* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static WAVEBOOST_CPU_INLINE void store(T* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }
  static WAVEBOOST_CPU_INLINE Vec splat(T x) { return Vec{} + x; }
  // NaN handling is left loose on purpose: a NaN score reaches P through
  // exp2(s - m) whichever value the max picks, so the row still ends NaN.
  static WAVEBOOST_CPU_INLINE Vec max(const Vec& a, const Vec& b) { return a > b ? a : b; }
};

// Coefficients ln(2)^k / k! of e^(f ln 2) = 2^f.
template <typename T, int kDegree>
constexpr std::array<T, kDegree + 1> exp2_taylor_coefficients() {
  std::array<T, kDegree + 1> c{};
  long double term = 1.0L;
  for (int k = 0; k <= kDegree; ++k) {
    c[k] = static_cast<T>(term);
    term = term * 0.693147180559945309417232121458176568L / (k + 1);
  }
  return c;
}

// 2^x per lane, within about 1 ulp. x <= -bias (and -inf) gives exactly 0,
// NaN stays NaN. Splits x = n + f with n = round(x), |f| <= 1/2; 2^f is a
// Taylor polynomial and 2^n is built directly in the exponent bits.
template <typename T, int kLanes>
WAVEBOOST_CPU_INLINE typename Simd<T, kLanes>::Vec exp2_simd(const typename Simd<T, kLanes>::Vec& x_in) {
  using S = Simd<T, kLanes>;
  using Vec = typename S::Vec;
  using Bits = typename S::Bits;
  using F = FloatBits<T>;
  const Vec lowest = S::splat(-F::kExponentBias);  // 2^-bias has a zero exponent field: flushes to 0
  const Vec highest = S::splat(F::kExponentBias);
  Vec x = x_in < lowest ? lowest : x_in;  // a NaN fails both tests and passes through
  x = x > highest ? highest : x;
  // Adding 1.5 * 2^mantissa_bits rounds x to an integer n held in the low
  // mantissa bits of `shifted`; the 1.5 keeps negative n in range.
  const Vec round_shift = S::splat(static_cast<T>(1.5 * std::ldexp(1.0, F::kMantissaBits)));
  const Vec shifted = x + round_shift;
  const Vec n = shifted - round_shift;
  const Vec f = x - n;
  constexpr auto c = exp2_taylor_coefficients<T, F::kExp2Degree>();
  Vec poly = S::splat(c[F::kExp2Degree]);
  for (int k = F::kExp2Degree - 1; k >= 0; --k) poly = poly * f + c[k];
  // (n + bias) << mantissa_bits is the bit pattern of 2^n. The round shift's
  // own bits below the exponent are zero, so only n + bias survives the shift.
  // (Casts between same-size GCC vector types reinterpret the bits.)
  const Bits two_to_n = ((Bits)shifted + static_cast<typename F::Int>(F::kExponentBias)) << F::kMantissaBits;
  return poly * (Vec)two_to_n;
}

// 64-byte aligned per-thread scratch that only grows.
template <typename T>
class ScratchArray {
 public:
  ScratchArray() = default;
  ScratchArray(const ScratchArray&) = delete;
  ScratchArray& operator=(const ScratchArray&) = delete;
  ~ScratchArray() { release(); }

  T* get(size_t count) {
    if (count > capacity_) {
      release();
      data_ = static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t(64)));
      capacity_ = count;
    }
    return data_;
  }

 private:
  void release() {
    if (data_ != nullptr) ::operator delete(data_, std::align_val_t(64));
    data_ = nullptr;
    capacity_ = 0;
  }
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

template <typename T>
struct Scratch {
  // "rows" is the query block rounded up to whole vectors.
  ScratchArray<T> q_t;        // (head_dim, rows): Q^T pre-scaled by softmax_scale * log2(e)
  ScratchArray<T> k;          // (kBlockN, head_dim): a K tile gathered from its pages (paged K only)
  ScratchArray<T> v;          // (kBlockN, head_dim rounded up to whole vectors)
  ScratchArray<T> p_t;        // (kBlockN, rows): scores S^T, then probabilities P^T in place
  ScratchArray<T> o;          // (rows, head_dim rounded up): unnormalized output
  ScratchArray<T> m;          // (rows): running max of the base-2 scores
  ScratchArray<T> l;          // (rows): running sum of 2^(s - m)
  ScratchArray<T> alpha;      // (rows): 2^(m_old - m_new), the rescale of O and l
  ScratchArray<T> key_limit;  // (rows): keys of the current tile each query sees (causal)
};

// The rows one task computes.
struct QueryBlock {
  int64_t batch;
  int64_t head;
  int64_t row_begin;
  int64_t num_rows;
};

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Row `key` of K or V (one head, given by head_base) of the sequence `params` describes: at a
// fixed row stride, or, for a paged cache, row key % page_size of page block_table[key / page_size]
// (params then describes one sequence: block_table points at its row of the table).
template <typename T>
WAVEBOOST_CPU_INLINE const T* key_row(const AttentionParams& params, const T* head_base, int64_t page_stride,
                                      int64_t row_stride, int64_t key) {
  if (params.block_table == nullptr) return head_base + key * row_stride;
  const int64_t page = params.block_table[key / params.page_size];
  return head_base + page * page_stride + (key % params.page_size) * row_stride;
}

// Keys query `row` may see: all of them, or with the bottom-right aligned
// causal mask, j <= row + seqlen_k - seqlen_q.
inline int64_t visible_keys(const AttentionParams& params, int64_t row) {
  if (!params.is_causal) return params.seqlen_k;
  return std::clamp<int64_t>(row + params.seqlen_k - params.seqlen_q + 1, 0, params.seqlen_k);
}

// The epilogue of a query block: out = O / l (O: num_rows accumulator rows, o_stride apart) and
// lse = ln(sum_j e^(scale * q.k_j)) = (m + log2(l)) * ln(2), m and l the base-2 running max and
// sum. A row that sees no key, or whose visible scores are all -inf in the data, has l = 0:
// zeros and LSE -inf, as on every CUDA path and in the reference (tests/reference.py). A NaN
// (or +inf) score makes l NaN: out and LSE NaN. `out`: the block's first output row.
template <typename T>
inline void write_block_output(const AttentionParams& params, const QueryBlock& block, const T* o, int64_t o_stride,
                               const T* m, const T* l, T* out) {
  for (int64_t i = 0; i < block.num_rows; ++i) {
    T* out_row = out + i * params.o_row_stride;
    const bool sees_no_key = visible_keys(params, block.row_begin + i) == 0 || l[i] == T(0);
    const T inv_l = sees_no_key ? T(0) : T(1) / l[i];
    for (int64_t d = 0; d < params.head_dim; ++d) out_row[d] = o[i * o_stride + d] * inv_l;
    if (params.lse != nullptr) {
      const double lse = sees_no_key ? -std::numeric_limits<double>::infinity()
                                     : static_cast<double>(m[i]) * kLn2 + std::log(static_cast<double>(l[i]));
      params.lse[block.batch * params.lse_batch_stride + block.head * params.lse_head_stride + block.row_begin + i] =
          static_cast<float>(lse);
    }
  }
}

// One kKeys x (kVecs * kLanes) tile of the transposed scores,
//   s[j][i] = sum_d k[j][d] * q_t[d][i].
// Keys are read in place (broadcast one element at a time), queries come from
// the transposed Q block, so neither operand needs a per-tile transpose.
template <class C, int kKeys, int kVecs>
WAVEBOOST_CPU_INLINE void scores_microtile(const typename C::Element* k, int64_t k_row_stride,
                                           const typename C::Element* q_t, int64_t ldq, int64_t head_dim,
                                           typename C::Element* s, int64_t lds) {
  using S = Simd<typename C::Element, C::kLanes>;
  typename S::Vec acc[kKeys][kVecs] = {};
  for (int64_t d = 0; d < head_dim; ++d) {
    typename S::Vec query[kVecs];
    for (int w = 0; w < kVecs; ++w) query[w] = S::load(q_t + d * ldq + w * C::kLanes);
    for (int j = 0; j < kKeys; ++j) {
      const typename C::Element k_jd = k[j * k_row_stride + d];
      for (int w = 0; w < kVecs; ++w) acc[j][w] += k_jd * query[w];
    }
  }
  for (int j = 0; j < kKeys; ++j)
    for (int w = 0; w < kVecs; ++w) S::store(s + j * lds + w * C::kLanes, acc[j][w]);
}

// One kRows x (kVecs * kLanes) tile of the output accumulator,
//   o[i][:] = alpha[i] * o[i][:] + sum_j p_t[j][i] * v[j][:];
// the rescale rides on loading the accumulators.
template <class C, int kRows, int kVecs>
WAVEBOOST_CPU_INLINE void pv_microtile(const typename C::Element* p_t, int64_t ldp, const typename C::Element* v,
                                       int64_t ldv, int64_t cols, const typename C::Element* alpha,
                                       typename C::Element* o, int64_t ldo) {
  using S = Simd<typename C::Element, C::kLanes>;
  typename S::Vec acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i)
    for (int w = 0; w < kVecs; ++w) acc[i][w] = S::load(o + i * ldo + w * C::kLanes) * alpha[i];
  for (int64_t j = 0; j < cols; ++j) {
    typename S::Vec value[kVecs];
    for (int w = 0; w < kVecs; ++w) value[w] = S::load(v + j * ldv + w * C::kLanes);
    for (int i = 0; i < kRows; ++i) {
      const typename C::Element p_ji = p_t[j * ldp + i];
      for (int w = 0; w < kVecs; ++w) acc[i][w] += p_ji * value[w];
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int w = 0; w < kVecs; ++w) S::store(o + i * ldo + w * C::kLanes, acc[i][w]);
}

// The last `keys` (< kTileRows) keys of a score tile in one micro-tile of
// exactly that many rows: a 1-row tile has a single FMA chain per register
// and waits on its latency, so r leftover keys cost about r full tiles.
template <class C, int kVecs, int kKeys = C::kTileRows - 1>
WAVEBOOST_CPU_INLINE void scores_leftover(int64_t keys, const typename C::Element* k, int64_t k_row_stride,
                                          const typename C::Element* q_t, int64_t ldq, int64_t head_dim,
                                          typename C::Element* s, int64_t lds) {
  if constexpr (kKeys >= 1) {
    if (keys == kKeys)
      scores_microtile<C, kKeys, kVecs>(k, k_row_stride, q_t, ldq, head_dim, s, lds);
    else
      scores_leftover<C, kVecs, kKeys - 1>(keys, k, k_row_stride, q_t, ldq, head_dim, s, lds);
  }
}

// S^T = K Q^T for `cols` keys x rows_padded queries (a multiple of kLanes).
template <class C>
WAVEBOOST_CPU_INLINE void scores_tile(const typename C::Element* k, int64_t k_row_stride, int64_t cols,
                                      const typename C::Element* q_t, int64_t rows_padded, int64_t head_dim,
                                      typename C::Element* s) {
  constexpr int64_t kWide = C::kTileVecs * C::kLanes;
  for (int64_t j = 0; j < cols;) {
    const int64_t keys = std::min<int64_t>(C::kTileRows, cols - j);
    const bool full = keys == C::kTileRows;
    for (int64_t i = 0; i < rows_padded;) {
      const bool wide = i + kWide <= rows_padded;
      const typename C::Element* k_j = k + j * k_row_stride;
      typename C::Element* s_ji = s + j * rows_padded + i;
      if (full && wide)
        scores_microtile<C, C::kTileRows, C::kTileVecs>(k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji,
                                                        rows_padded);
      else if (full)
        scores_microtile<C, C::kTileRows, 1>(k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji, rows_padded);
      else if (wide)
        scores_leftover<C, C::kTileVecs>(keys, k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji,
                                         rows_padded);
      else
        scores_leftover<C, 1>(keys, k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji, rows_padded);
      i += wide ? kWide : C::kLanes;
    }
    j += keys;
  }
}

// The last `rows` (< kTileRows) query rows of the output in one micro-tile of
// exactly that many rows (see scores_leftover).
template <class C, int kVecs, int kRows = C::kTileRows - 1>
WAVEBOOST_CPU_INLINE void pv_leftover(int64_t rows, const typename C::Element* p_t, int64_t ldp,
                                      const typename C::Element* v, int64_t ldv, int64_t cols,
                                      const typename C::Element* alpha, typename C::Element* o, int64_t ldo) {
  if constexpr (kRows >= 1) {
    if (rows == kRows)
      pv_microtile<C, kRows, kVecs>(p_t, ldp, v, ldv, cols, alpha, o, ldo);
    else
      pv_leftover<C, kVecs, kRows - 1>(rows, p_t, ldp, v, ldv, cols, alpha, o, ldo);
  }
}

// O = diag(alpha) O + P V over the `cols` keys of the tile.
template <class C>
WAVEBOOST_CPU_INLINE void accumulate_pv(const typename C::Element* p_t, const typename C::Element* v, int64_t cols,
                                        const typename C::Element* alpha, int64_t rows_padded, int64_t dim_padded,
                                        typename C::Element* o) {
  constexpr int64_t kWide = C::kTileVecs * C::kLanes;
  for (int64_t d = 0; d < dim_padded;) {
    const bool wide = d + kWide <= dim_padded;
    for (int64_t i = 0; i < rows_padded;) {
      const int64_t rows = std::min<int64_t>(C::kTileRows, rows_padded - i);
      const bool full = rows == C::kTileRows;
      const typename C::Element* p_i = p_t + i;
      typename C::Element* o_id = o + i * dim_padded + d;
      if (full && wide)
        pv_microtile<C, C::kTileRows, C::kTileVecs>(p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id,
                                                    dim_padded);
      else if (full)
        pv_microtile<C, C::kTileRows, 1>(p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id, dim_padded);
      else if (wide)
        pv_leftover<C, C::kTileVecs>(rows, p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id, dim_padded);
      else
        pv_leftover<C, 1>(rows, p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id, dim_padded);
      i += rows;
    }
    d += wide ? kWide : C::kLanes;
  }
}

// Turns the transposed score tile into probabilities in place and updates
// m, l and alpha, kLanes queries at a time (the reductions run down columns,
// so there is no horizontal shuffle):
//   m_new = max(m, max_j S);  alpha = 2^(m - m_new);  P = 2^(S - m_new);
//   l = alpha * l + sum_j P.
// Scores are already in base 2 (Q carries log2(e)). key_limit[i] is how many
// keys of this tile query i sees; keys past it are masked when apply_mask.
// Row j of the tile starts at s + j * lds (lds >= rows_padded).
template <class C>
WAVEBOOST_CPU_INLINE void online_softmax_tile(int64_t cols, int64_t rows_padded, int64_t lds,
                                              const typename C::Element* key_limit,
                                              bool apply_mask, typename C::Element* s, typename C::Element* m,
                                              typename C::Element* l, typename C::Element* alpha) {
  using T = typename C::Element;
  using S = Simd<T, C::kLanes>;
  using Vec = typename S::Vec;
  const Vec neg_inf = S::splat(-std::numeric_limits<T>::infinity());
  for (int64_t i = 0; i < rows_padded; i += C::kLanes) {
    T* s_i = s + i;
    Vec row_max = neg_inf;
    if (apply_mask) {
      const Vec limit = S::load(key_limit + i);
      for (int64_t j = 0; j < cols; ++j) {
        const Vec score = S::splat(static_cast<T>(j)) < limit ? S::load(s_i + j * lds) : neg_inf;
        S::store(s_i + j * lds, score);
        row_max = S::max(row_max, score);
      }
    } else {
      for (int64_t j = 0; j < cols; ++j) row_max = S::max(row_max, S::load(s_i + j * lds));
    }
    const Vec m_old = S::load(m + i);
    const Vec m_new = S::max(m_old, row_max);
    // A query that has seen no key yet keeps m = -inf, and 2^(-inf - -inf)
    // would be NaN: measure from 0 instead, so its P, alpha and l stay 0.
    const Vec m_ref = m_new == neg_inf ? S::splat(0) : m_new;
    const Vec rescale = exp2_simd<T, C::kLanes>(m_old - m_ref);
    Vec row_sum = S::splat(0);
    for (int64_t j = 0; j < cols; ++j) {
      const Vec prob = exp2_simd<T, C::kLanes>(S::load(s_i + j * lds) - m_ref);
      S::store(s_i + j * lds, prob);
      row_sum += prob;
    }
    S::store(alpha + i, rescale);
    S::store(l + i, rescale * S::load(l + i) + row_sum);
    S::store(m + i, m_new);
  }
}

// Copies V rows key_begin .. key_begin + cols into `tile` (row stride ldv), zero-padded to dim_padded.
// V is copied so that P V streams contiguous, zero-padded rows: read in place, a 4 KiB row stride
// (e.g. 8 heads x 128 x fp32) puts every row of the tile in the same L1 set.
template <typename T>
WAVEBOOST_CPU_INLINE void copy_v_tile(const AttentionParams& params, const T* v, int64_t key_begin, int64_t cols,
                                      int64_t head_dim, int64_t dim_padded, int64_t ldv, T* tile) {
  for (int64_t j = 0; j < cols; ++j) {
    const T* v_row = key_row(params, v, params.v_batch_stride, params.v_row_stride, key_begin + j);
    std::copy(v_row, v_row + head_dim, tile + j * ldv);
    std::fill(tile + j * ldv + head_dim, tile + j * ldv + dim_padded, T(0));
  }
}

// The per-tile steps of attention_query_block. By default they are inlined into
// it; a configuration may specialize this class to compile them as functions
// of their own (flash_kernel_avx2.h does for AVX2, where inlining everything into
// one function made GCC spill a micro-tile accumulator inside the P V loop)
// or to add work such as prefetching the next tile.
template <class C>
struct TileSteps {
  using T = typename C::Element;
  // Elements added to each row of the Q^T / S^T and V scratch tiles (their row strides `ld` and
  // `ldv` below); a configuration may pad them so that one column of a tile does not fall into a
  // few cache sets. The inlined steps take no padding: ld = rows_padded, ldv = dim_padded.
  static constexpr int64_t kScratchPad = 0;
  // The V tile of keys key_begin .. key_begin + cols, rows ldv apart: copied into `tile` (see
  // copy_v_tile); a configuration may read V in place where it is laid out so. Returns the tile.
  static WAVEBOOST_CPU_INLINE const T* v_tile(const AttentionParams& params, const T* v, int64_t key_begin,
                                              int64_t cols, int64_t head_dim, int64_t dim_padded, int64_t ldv,
                                              T* tile) {
    copy_v_tile(params, v, key_begin, cols, head_dim, dim_padded, ldv, tile);
    return tile;
  }
  // Called once per tile before scores(), with the rows of the next tile (0 rows and nullptr
  // at the last tile, or when they are not at a fixed stride: a paged cache).
  static WAVEBOOST_CPU_INLINE void prefetch_next(const T* /*k_next*/, int64_t /*k_stride*/, const T* /*v_next*/,
                                                 int64_t /*v_stride*/, int64_t /*rows*/, int64_t /*head_dim*/) {}
  static WAVEBOOST_CPU_INLINE void scores(const T* k, int64_t k_row_stride, int64_t cols, const T* q_t,
                                          int64_t rows_padded, int64_t /*ld*/, int64_t head_dim, T* s) {
    scores_tile<C>(k, k_row_stride, cols, q_t, rows_padded, head_dim, s);
  }
  static WAVEBOOST_CPU_INLINE void softmax(int64_t cols, int64_t rows_padded, int64_t ld, const T* key_limit,
                                           bool apply_mask, T* s, T* m, T* l, T* alpha) {
    online_softmax_tile<C>(cols, rows_padded, ld, key_limit, apply_mask, s, m, l, alpha);
  }
  static WAVEBOOST_CPU_INLINE void pv(const T* p_t, int64_t /*ld*/, const T* v, int64_t /*ldv*/, int64_t cols,
                                      const T* alpha, int64_t rows_padded, int64_t dim_padded, T* o) {
    accumulate_pv<C>(p_t, v, cols, alpha, rows_padded, dim_padded, o);
  }
};

// Computes out (and lse) for one block of query rows of one (batch, head). A paged K/V
// (block_table set) is read through key_row; params must then describe one sequence (batch 1).
template <class C>
WAVEBOOST_CPU_INLINE void attention_query_block(const AttentionParams& params, const QueryBlock& block,
                                                Scratch<typename C::Element>& scratch) {
  using T = typename C::Element;
  const int64_t head_dim = params.head_dim;
  const int64_t dim_padded = round_up(head_dim, C::kLanes);
  const int64_t rows = block.num_rows;
  const int64_t rows_padded = round_up(rows, C::kLanes);
  const int64_t kv_head = block.head / (params.heads / params.heads_kv);

  const T* q = static_cast<const T*>(params.q) + block.batch * params.q_batch_stride +
               block.head * params.q_head_stride + block.row_begin * params.q_row_stride;
  const bool paged = params.block_table != nullptr;
  const int64_t kv_batch = paged ? 0 : block.batch;  // a paged cache's batch stride steps pages
  const T* k = static_cast<const T*>(params.k) + kv_batch * params.k_batch_stride + kv_head * params.k_head_stride;
  const T* v = static_cast<const T*>(params.v) + kv_batch * params.v_batch_stride + kv_head * params.v_head_stride;
  T* out = static_cast<T*>(params.out) + block.batch * params.o_batch_stride + block.head * params.o_head_stride +
           block.row_begin * params.o_row_stride;

  // Row strides of Q^T and S^T (ld) and of the V tile (ldv), see TileSteps::kScratchPad.
  const int64_t ld = rows_padded + TileSteps<C>::kScratchPad;
  const int64_t ldv = dim_padded + TileSteps<C>::kScratchPad;
  T* q_t = scratch.q_t.get(head_dim * ld);
  T* v_tile = scratch.v.get(C::kBlockN * ldv);
  T* p_t = scratch.p_t.get(C::kBlockN * ld);
  T* o = scratch.o.get(rows_padded * dim_padded);
  T* m = scratch.m.get(rows_padded);
  T* l = scratch.l.get(rows_padded);
  T* alpha = scratch.alpha.get(rows_padded);
  T* key_limit = scratch.key_limit.get(rows_padded);
  T* k_tile = paged ? scratch.k.get(C::kBlockN * head_dim) : nullptr;

  // Q^T, pre-scaled so that the softmax is exp2(s - m) on base-2 scores.
  // Padding queries are zero: finite scores, never written out.
  const T q_scale = static_cast<T>(params.softmax_scale * kLog2e);
  // Transposed kLanes queries at a time: reading all 64 rows at once with a
  // 4 KiB stride thrashes one L1 set, writing one query at a time strides
  // across every row of Q^T (4% of the run time, measured).
  std::fill(q_t, q_t + head_dim * ld, T(0));
  for (int64_t i0 = 0; i0 < rows; i0 += C::kLanes) {
    const int64_t lanes = std::min<int64_t>(C::kLanes, rows - i0);
    for (int64_t d = 0; d < head_dim; ++d)
      for (int64_t i = i0; i < i0 + lanes; ++i) q_t[d * ld + i] = q[i * params.q_row_stride + d] * q_scale;
  }
  std::fill(o, o + rows_padded * dim_padded, T(0));
  std::fill(m, m + rows_padded, -std::numeric_limits<T>::infinity());
  std::fill(l, l + rows_padded, T(0));

  // Keys past the last row's causal limit are masked for every row of the
  // block; a tile needs the per-element mask only where it passes the first
  // row's limit.
  const int64_t key_end = visible_keys(params, block.row_begin + rows - 1);
  const int64_t first_row_keys = visible_keys(params, block.row_begin);
  for (int64_t key_begin = 0; key_begin < key_end; key_begin += C::kBlockN) {
    const int64_t cols = std::min<int64_t>(C::kBlockN, key_end - key_begin);
    const bool apply_mask = key_begin + cols > first_row_keys;
    if (apply_mask)
      for (int64_t i = 0; i < rows_padded; ++i)
        key_limit[i] = static_cast<T>(
            std::clamp<int64_t>(visible_keys(params, block.row_begin + i) - key_begin, 0, cols));
    const T* v_rows = TileSteps<C>::v_tile(params, v, key_begin, cols, head_dim, dim_padded, ldv, v_tile);
    // K is read in place, except from a paged cache, whose tile may span several pages.
    const T* k_rows = k + key_begin * params.k_row_stride;
    int64_t k_stride = params.k_row_stride;
    if (paged) {
      for (int64_t j = 0; j < cols; ++j) {
        const T* k_row = key_row(params, k, params.k_batch_stride, params.k_row_stride, key_begin + j);
        std::copy(k_row, k_row + head_dim, k_tile + j * head_dim);
      }
      k_rows = k_tile;
      k_stride = head_dim;
    }

    const int64_t next_begin = key_begin + C::kBlockN;
    const int64_t next_rows = paged ? 0 : std::clamp<int64_t>(key_end - next_begin, 0, C::kBlockN);
    TileSteps<C>::prefetch_next(next_rows > 0 ? k + next_begin * params.k_row_stride : nullptr, params.k_row_stride,
                                next_rows > 0 ? v + next_begin * params.v_row_stride : nullptr, params.v_row_stride,
                                next_rows, head_dim);
    TileSteps<C>::scores(k_rows, k_stride, cols, q_t, rows_padded, ld, head_dim, p_t);
    TileSteps<C>::softmax(cols, rows_padded, ld, key_limit, apply_mask, p_t, m, l, alpha);
    TileSteps<C>::pv(p_t, ld, v_rows, ldv, cols, alpha, rows_padded, dim_padded, o);
  }

  write_block_output(params, block, o, dim_padded, m, l, out);
}

}  // namespace waveboost::cpu
