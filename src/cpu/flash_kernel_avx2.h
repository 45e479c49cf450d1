// The AVX2 + FMA configuration of the CPU kernel (x86 without AVX-512).
//
// Sixteen ymm registers hold a 6 x 2 micro-tile: 12 accumulators, the two
// streamed vectors and one broadcast. The tile steps are compiled as functions
// of their own (TileSteps below): inlined into attention_query_block, GCC kept
// one accumulator of the P V micro-tile on the stack, a store-to-load chain
// through every iteration (slower than the spill-free loop). Measured on
// a 2-core Zen 3 (benchmarks/NOTES.md): packing K per tile into 6-key groups,
// copying Q^T columns contiguous, kBlockM 128/256 and kBlockN 64/96/256 gained
// nothing above the run-to-run noise, so none of them is here.
#pragma once

#include "flash_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace waveboost::cpu {

template <typename T>
using Avx2Config = KernelConfig<T, 32 / sizeof(T), 6, 2>;

#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_AVX2 __attribute__((target("avx2,fma"), noinline))
#define WAVEBOOST_CPU_AVX2_INLINE inline __attribute__((target("avx2,fma"), always_inline))

// One ymm register of T, in intrinsics. The micro-tiles below are the generic ones
// (scores_microtile, pv_microtile: the same FMAs in the same order, so bitwise the same
// results) written with them: from the generic code GCC zeroed each score micro-tile's
// accumulators through a stack array (`rep stos`) and stored both micro-tiles' accumulators
// through one, copied on in 16-byte moves (benchmarks/NOTES.md).
template <typename T>
struct Ymm;
template <>
struct Ymm<float> {
  using V = __m256;
  static WAVEBOOST_CPU_AVX2_INLINE V zero() { return _mm256_setzero_ps(); }
  static WAVEBOOST_CPU_AVX2_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  static WAVEBOOST_CPU_AVX2_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static WAVEBOOST_CPU_AVX2_INLINE V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static WAVEBOOST_CPU_AVX2_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static WAVEBOOST_CPU_AVX2_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};
template <>
struct Ymm<double> {
  using V = __m256d;
  static WAVEBOOST_CPU_AVX2_INLINE V zero() { return _mm256_setzero_pd(); }
  static WAVEBOOST_CPU_AVX2_INLINE V load(const double* p) { return _mm256_loadu_pd(p); }
  static WAVEBOOST_CPU_AVX2_INLINE void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static WAVEBOOST_CPU_AVX2_INLINE V broadcast(const double* p) { return _mm256_broadcast_sd(p); }
  static WAVEBOOST_CPU_AVX2_INLINE V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static WAVEBOOST_CPU_AVX2_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
};

// The micro-tiles' inner loops are unrolled four times (WAVEBOOST_CPU_AVX2_UNROLL). Rolled, each
// step of a 6 x 2 tile was 12 FMAs, 8 loads and 4 loop instructions (3 pointer or index increments,
// a fused compare and branch); on a Zen 3 core, which issues two FMAs per clock, the whole fp32
// kernel ran 4-9% faster unrolled, the fp64 one 11-13% (one core, paired; 2 and 8 times: 0.4-2%
// slower than 4; benchmarks/NOTES.md). The FMAs and their order are unchanged: bitwise the same.
#define WAVEBOOST_CPU_AVX2_UNROLL _Pragma("GCC unroll 4")

// scores_microtile: s[j][i] = sum_d k[j][d] * q_t[d][i] for kKeys x kVecs registers.
template <class C, int kKeys, int kVecs>
WAVEBOOST_CPU_AVX2_INLINE void scores_microtile_avx2(const typename C::Element* k, int64_t k_row_stride,
                                                     const typename C::Element* q_t, int64_t ldq, int64_t head_dim,
                                                     typename C::Element* s, int64_t lds) {
  using Y = Ymm<typename C::Element>;
  typename Y::V acc[kKeys][kVecs];
  for (int j = 0; j < kKeys; ++j)
    for (int w = 0; w < kVecs; ++w) acc[j][w] = Y::zero();
  WAVEBOOST_CPU_AVX2_UNROLL
  for (int64_t d = 0; d < head_dim; ++d) {
    typename Y::V query[kVecs];
    for (int w = 0; w < kVecs; ++w) query[w] = Y::load(q_t + d * ldq + w * C::kLanes);
    for (int j = 0; j < kKeys; ++j) {
      const typename Y::V k_jd = Y::broadcast(k + j * k_row_stride + d);
      for (int w = 0; w < kVecs; ++w) acc[j][w] = Y::fma(k_jd, query[w], acc[j][w]);
    }
  }
  for (int j = 0; j < kKeys; ++j)
    for (int w = 0; w < kVecs; ++w) Y::store(s + j * lds + w * C::kLanes, acc[j][w]);
}

// pv_microtile: o[i][:] = alpha[i] * o[i][:] + sum_j p_t[j][i] * v[j][:] for kRows x kVecs registers.
// kPByRows: the probabilities are p_t[i][j] instead, rows of ldp (flash_rows_avx2.h).
template <class C, int kRows, int kVecs, bool kPByRows = false>
WAVEBOOST_CPU_AVX2_INLINE void pv_microtile_avx2(const typename C::Element* p_t, int64_t ldp,
                                                 const typename C::Element* v, int64_t ldv, int64_t cols,
                                                 const typename C::Element* alpha, typename C::Element* o,
                                                 int64_t ldo) {
  using Y = Ymm<typename C::Element>;
  typename Y::V acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i) {
    const typename Y::V rescale = Y::broadcast(alpha + i);
    for (int w = 0; w < kVecs; ++w) acc[i][w] = Y::mul(Y::load(o + i * ldo + w * C::kLanes), rescale);
  }
  WAVEBOOST_CPU_AVX2_UNROLL
  for (int64_t j = 0; j < cols; ++j) {
    typename Y::V value[kVecs];
    for (int w = 0; w < kVecs; ++w) value[w] = Y::load(v + j * ldv + w * C::kLanes);
    for (int i = 0; i < kRows; ++i) {
      const typename Y::V p_ji = Y::broadcast(kPByRows ? p_t + i * ldp + j : p_t + j * ldp + i);
      for (int w = 0; w < kVecs; ++w) acc[i][w] = Y::fma(p_ji, value[w], acc[i][w]);
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int w = 0; w < kVecs; ++w) Y::store(o + i * ldo + w * C::kLanes, acc[i][w]);
}

// The last `keys` (< kTileRows) keys of a score tile in one micro-tile of exactly that many rows.
template <class C, int kVecs, int kKeys = C::kTileRows - 1>
WAVEBOOST_CPU_AVX2_INLINE void scores_leftover_avx2(int64_t keys, const typename C::Element* k, int64_t k_row_stride,
                                                    const typename C::Element* q_t, int64_t ldq, int64_t head_dim,
                                                    typename C::Element* s, int64_t lds) {
  if constexpr (kKeys >= 1) {
    if (keys == kKeys)
      scores_microtile_avx2<C, kKeys, kVecs>(k, k_row_stride, q_t, ldq, head_dim, s, lds);
    else
      scores_leftover_avx2<C, kVecs, kKeys - 1>(keys, k, k_row_stride, q_t, ldq, head_dim, s, lds);
  }
}

// The last `rows` (< kTileRows) query rows of the output in one micro-tile of exactly that many rows.
template <class C, int kVecs, int kRows = C::kTileRows - 1, bool kPByRows = false>
WAVEBOOST_CPU_AVX2_INLINE void pv_leftover_avx2(int64_t rows, const typename C::Element* p_t, int64_t ldp,
                                                const typename C::Element* v, int64_t ldv, int64_t cols,
                                                const typename C::Element* alpha, typename C::Element* o,
                                                int64_t ldo) {
  if constexpr (kRows >= 1) {
    if (rows == kRows)
      pv_microtile_avx2<C, kRows, kVecs, kPByRows>(p_t, ldp, v, ldv, cols, alpha, o, ldo);
    else
      pv_leftover_avx2<C, kVecs, kRows - 1, kPByRows>(rows, p_t, ldp, v, ldv, cols, alpha, o, ldo);
  }
}

// 2^(x - r) of kCount registers at once, for an integer reference r (|r| < 2^22) and x <= r or
// NaN: the softmax's scores against their row's maximum rounded up (s <= m whenever s is a
// number), or, with r = 0, s - m and m_old - m_new. The generic exp2_simd clamps both ends with
// compare + blend and runs a degree-7 Taylor polynomial one register at a time; its 7 dependent
// FMAs, with the FP scheduler holding about two iterations, made the softmax latency-bound: 12 us
// per 64 x 128 tile on a Zen 1 core, ~29 cycles per register. Here the steps of kCount independent
// registers are interleaved, the lower clamp is one max (x = NaN passes: vmaxps returns its second
// operand), r and the exponent bias ride in the rounding constant (so that s - m costs no
// subtraction: 1 cycle of ~14 per register), and 2^f on [-1/2, 1/2] is a degree-6 polynomial with
// 1 as its constant term (2^0 = 1 exactly) and the other coefficients minimax for relative error:
// 3.9e-9 in exact arithmetic, 1e-7 (under one float ulp) evaluated in float (the Taylor degree 7
// of exp2_simd: 5e-9). x <= r - 127 (and -inf) gives exactly 0, as exp2_simd does.
template <int kCount>
WAVEBOOST_CPU_AVX2_INLINE void exp2_below(__m256 (&x)[kCount], float reference) {
  constexpr float kPoly[] = {1.0f,           0.6931472254f,    0.24022651084f,   0.055502973142f,
                             0.0096180307825f, 0.0013410000966f, 0.00015469731977f};  // lowest degree first
  constexpr int kDegree = 6;
  // Adding 1.5 * 2^23 rounds x to an integer in the low mantissa bits; with 127 - r added as
  // well (exact: an integer below 2^23), those bits hold n + 127 for n = round(x) - r, and
  // shifted into the exponent field they are 2^n (0 for n = -127).
  const __m256 round_shift = _mm256_set1_ps(12582912.0f + 127.0f - reference);
  const __m256 lowest = _mm256_set1_ps(reference - 127.0f);
  __m256 shifted[kCount], f[kCount], poly[kCount];
  for (int k = 0; k < kCount; ++k) x[k] = _mm256_max_ps(lowest, x[k]);
  for (int k = 0; k < kCount; ++k) shifted[k] = _mm256_add_ps(x[k], round_shift);
  for (int k = 0; k < kCount; ++k) f[k] = _mm256_sub_ps(x[k], _mm256_sub_ps(shifted[k], round_shift));
  for (int k = 0; k < kCount; ++k) poly[k] = _mm256_set1_ps(kPoly[kDegree]);
  for (int d = kDegree - 1; d >= 0; --d)
    for (int k = 0; k < kCount; ++k) poly[k] = _mm256_fmadd_ps(poly[k], f[k], _mm256_set1_ps(kPoly[d]));
  for (int k = 0; k < kCount; ++k)
    x[k] = _mm256_mul_ps(poly[k], _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(shifted[k]), 23)));
}

// 2^x for x <= 0 or NaN.
template <int kCount>
WAVEBOOST_CPU_AVX2_INLINE void exp2_nonpositive(__m256 (&x)[kCount]) {
  exp2_below<kCount>(x, 0.0f);
}

// online_softmax_tile for fp32, with exp2_nonpositive on four keys at a time (their partial row
// sums added pairwise at the end). Same masking and -inf handling.
WAVEBOOST_CPU_AVX2_INLINE void online_softmax_tile_avx2(int64_t cols, int64_t rows_padded, int64_t lds,
                                                        const float* key_limit, bool apply_mask, float* s, float* m,
                                                        float* l, float* alpha) {
  constexpr int kLanes = 8;
  constexpr int kKeys = 4;  // exponentials in flight
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < rows_padded; i += kLanes) {
    float* s_i = s + i;
    __m256 row_max = neg_inf;
    if (apply_mask) {
      const __m256 limit = _mm256_loadu_ps(key_limit + i);
      for (int64_t j = 0; j < cols; ++j) {
        const __m256 visible = _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(j)), limit, _CMP_LT_OQ);
        const __m256 score = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s_i + j * lds), visible);
        _mm256_storeu_ps(s_i + j * lds, score);
        row_max = _mm256_max_ps(row_max, score);
      }
    } else {
      for (int64_t j = 0; j < cols; ++j) row_max = _mm256_max_ps(row_max, _mm256_loadu_ps(s_i + j * lds));
    }
    const __m256 m_old = _mm256_loadu_ps(m + i);
    const __m256 m_new = _mm256_max_ps(m_old, row_max);
    // A query that has seen no key yet keeps m = -inf: measure from 0 (see online_softmax_tile).
    const __m256 m_ref = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
    __m256 rescale[1] = {_mm256_sub_ps(m_old, m_ref)};
    exp2_nonpositive<1>(rescale);
    __m256 sums[kKeys];
    for (int k = 0; k < kKeys; ++k) sums[k] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + kKeys <= cols; j += kKeys) {
      __m256 prob[kKeys];
      for (int k = 0; k < kKeys; ++k) prob[k] = _mm256_sub_ps(_mm256_loadu_ps(s_i + (j + k) * lds), m_ref);
      exp2_nonpositive<kKeys>(prob);
      for (int k = 0; k < kKeys; ++k) {
        _mm256_storeu_ps(s_i + (j + k) * lds, prob[k]);
        sums[k] = _mm256_add_ps(sums[k], prob[k]);
      }
    }
    for (; j < cols; ++j) {
      __m256 prob[1] = {_mm256_sub_ps(_mm256_loadu_ps(s_i + j * lds), m_ref)};
      exp2_nonpositive<1>(prob);
      _mm256_storeu_ps(s_i + j * lds, prob[0]);
      sums[0] = _mm256_add_ps(sums[0], prob[0]);
    }
    const __m256 row_sum = _mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3]));
    _mm256_storeu_ps(alpha + i, rescale[0]);
    _mm256_storeu_ps(l + i, _mm256_fmadd_ps(rescale[0], _mm256_loadu_ps(l + i), row_sum));
    _mm256_storeu_ps(m + i, m_new);
  }
}

// Requests for the next tile's K and V rows, handed out a few at a time
// between micro-tiles. Issued all at once at the start of the tile (2048 lines
// for 128 keys x 512 B of K and of V, far more than the L1's miss buffers),
// they gained nothing measurable; spread out, they did (benchmarks/NOTES.md). Each thread's queue
// is a thread_local (Avx2TileSteps::queue); the tile steps work on a local copy and store it back,
// since in the Python module (a shared library) GCC fetched the thread_local's address with a
// __tls_get_addr call at every row of every issue (0.4% of the run's samples).
struct PrefetchQueue {
  const char* k = nullptr;  // the current row of K and of V
  const char* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;  // bytes
  int64_t row_bytes = 0;
  int64_t rows_left = 0;
  int64_t offset = 0;  // next line of the current rows, in bytes

  WAVEBOOST_CPU_INLINE void issue(int lines) {
    for (int c = 0; c < lines && rows_left > 0; c += 2) {
      __builtin_prefetch(k + offset, 0, 2);
      __builtin_prefetch(v + offset, 0, 2);
      offset += 64;
      if (offset >= row_bytes) {
        offset = 0;
        k += k_stride;
        v += v_stride;
        --rows_left;
      }
    }
  }
};

template <class C>
struct Avx2TileSteps {
  using T = typename C::Element;
  static constexpr int kPrefetchPerMicroTile = 16;
  // One cache line more per scratch row: with 256 B rows (64 queries) a 16-query column of Q^T
  // sits in 16 of the 64 L1 sets, 8 lines deep, and shares them with the K rows (4 KiB apart);
  // with 512 B rows a 16-wide strip of the V tile covers 8 sets 16 lines deep and left L1 between
  // micro-tiles. Rows of 5 and 9 lines spread over every set (+3%, benchmarks/NOTES.md).
  static constexpr int64_t kScratchPad = 64 / sizeof(T);

  static PrefetchQueue& queue() {
    thread_local PrefetchQueue q;
    return q;
  }

  // V read in place where its rows are laid out as the tile's (row stride ldv, no padding
  // columns: nothing past a row is read), as the AVX2 path packs it (pack_kv, cpu_attention.cpp);
  // otherwise copied.
  static WAVEBOOST_CPU_AVX2 const T* v_tile(const AttentionParams& params, const T* v, int64_t key_begin,
                                            int64_t cols, int64_t head_dim, int64_t dim_padded, int64_t ldv,
                                            T* tile) {
    if (params.block_table == nullptr && params.v_row_stride == ldv && head_dim == dim_padded)
      return v + key_begin * ldv;
    copy_v_tile(params, v, key_begin, cols, head_dim, dim_padded, ldv, tile);
    return tile;
  }

  // K and V rows of a head sit one row stride apart (4 KiB for 8 heads x 128 x fp32), each in
  // its own page, where the hardware prefetchers do not follow them: the next tile's rows are
  // requested while this tile computes.
  static WAVEBOOST_CPU_AVX2 void prefetch_next(const T* k_next, int64_t k_stride, const T* v_next, int64_t v_stride,
                                               int64_t rows, int64_t head_dim) {
    PrefetchQueue& q = queue();
    q.k = reinterpret_cast<const char*>(k_next);
    q.v = reinterpret_cast<const char*>(v_next);
    q.k_stride = k_stride * static_cast<int64_t>(sizeof(T));
    q.v_stride = v_stride * static_cast<int64_t>(sizeof(T));
    q.row_bytes = head_dim * static_cast<int64_t>(sizeof(T));
    q.rows_left = rows;
    q.offset = 0;
  }

  // S^T = K Q^T (scores_tile's micro-tiles), query columns outer (measured level
  // with keys outer), with prefetches between micro-tiles.
  static WAVEBOOST_CPU_AVX2 void scores(const T* k, int64_t k_row_stride, int64_t cols, const T* q_t,
                                        int64_t rows_padded, int64_t ld, int64_t head_dim, T* s) {
    PrefetchQueue q = queue();  // a local copy (see PrefetchQueue), stored back below
    constexpr int64_t kWide = C::kTileVecs * C::kLanes;
    for (int64_t i = 0; i < rows_padded;) {
      const bool wide = i + kWide <= rows_padded;
      for (int64_t j = 0; j < cols;) {
        const int64_t keys = std::min<int64_t>(C::kTileRows, cols - j);
        const T* k_j = k + j * k_row_stride;
        T* s_ji = s + j * ld + i;
        if (keys == C::kTileRows && wide)
          scores_microtile_avx2<C, C::kTileRows, C::kTileVecs>(k_j, k_row_stride, q_t + i, ld, head_dim, s_ji, ld);
        else if (keys == C::kTileRows)
          scores_microtile_avx2<C, C::kTileRows, 1>(k_j, k_row_stride, q_t + i, ld, head_dim, s_ji, ld);
        else if (wide)
          scores_leftover_avx2<C, C::kTileVecs>(keys, k_j, k_row_stride, q_t + i, ld, head_dim, s_ji, ld);
        else
          scores_leftover_avx2<C, 1>(keys, k_j, k_row_stride, q_t + i, ld, head_dim, s_ji, ld);
        q.issue(kPrefetchPerMicroTile);
        j += keys;
      }
      i += wide ? kWide : C::kLanes;
    }
    queue() = q;
  }

  static WAVEBOOST_CPU_AVX2 void softmax(int64_t cols, int64_t rows_padded, int64_t ld, const T* key_limit,
                                         bool apply_mask, T* s, T* m, T* l, T* alpha) {
    if constexpr (std::is_same_v<T, float>)
      online_softmax_tile_avx2(cols, rows_padded, ld, key_limit, apply_mask, s, m, l, alpha);
    else
      online_softmax_tile<C>(cols, rows_padded, ld, key_limit, apply_mask, s, m, l, alpha);
  }

  // O = diag(alpha) O + P V (accumulate_pv).
  static WAVEBOOST_CPU_AVX2 void pv(const T* p_t, int64_t ld, const T* v, int64_t ldv, int64_t cols, const T* alpha,
                                    int64_t rows_padded, int64_t dim_padded, T* o) {
    PrefetchQueue q = queue();  // a local copy (see PrefetchQueue), stored back below
    constexpr int64_t kWide = C::kTileVecs * C::kLanes;
    for (int64_t d = 0; d < dim_padded;) {
      const bool wide = d + kWide <= dim_padded;
      for (int64_t i = 0; i < rows_padded;) {
        const int64_t rows = std::min<int64_t>(C::kTileRows, rows_padded - i);
        const T* p_i = p_t + i;
        T* o_id = o + i * dim_padded + d;
        if (rows == C::kTileRows && wide)
          pv_microtile_avx2<C, C::kTileRows, C::kTileVecs>(p_i, ld, v + d, ldv, cols, alpha + i, o_id, dim_padded);
        else if (rows == C::kTileRows)
          pv_microtile_avx2<C, C::kTileRows, 1>(p_i, ld, v + d, ldv, cols, alpha + i, o_id, dim_padded);
        else if (wide)
          pv_leftover_avx2<C, C::kTileVecs>(rows, p_i, ld, v + d, ldv, cols, alpha + i, o_id, dim_padded);
        else
          pv_leftover_avx2<C, 1>(rows, p_i, ld, v + d, ldv, cols, alpha + i, o_id, dim_padded);
        q.issue(kPrefetchPerMicroTile);
        i += rows;
      }
      d += wide ? kWide : C::kLanes;
    }
    queue() = q;
  }
};

template <>
struct TileSteps<Avx2Config<float>> : Avx2TileSteps<Avx2Config<float>> {};
template <>
struct TileSteps<Avx2Config<double>> : Avx2TileSteps<Avx2Config<double>> {};
#endif

}  // namespace waveboost::cpu
