// The backward pass on the host (backend "cpu"): the reference backward and the CPU user's
// training path, fp32 and fp64, any head dim.
//
// With S = scale * Q K^T (causal: bottom-right mask), P = softmax(S) row by row, O = P V:
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D + dlse)  with D_i = rowsum(dO_i * O_i),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// (dlse, the gradient flowing into lse = log rowsum(exp S), adds dlse_i * P_ij to dS.)
//
// Nothing of size seqlen_q x seqlen_k is stored: P is recomputed tile by tile, in two phases.
//  1. One task per (batch, head, block of kBlockM query rows): its rows' statistics (lse * log2(e)
//     and D - dlse) into two (batch, heads, seqlen_q) buffers, then dQ for those rows, with the
//     scores transposed (S^T, queries along the SIMD lanes, as in the forward):
//       S^T = (c K) Q^T,  dP^T = V dO^T,  dS^T = P^T * (dP^T - D),  dQ += (dS^T)^T K
//  2. One task per (batch, kv head, block of kBlockN keys): dK and dV for those keys, summing over
//     every query head of the kv head's group (GQA) and every query row, keys along the lanes:
//       S = Q (c K)^T,  dP = dO V^T,  dS = P * (dP - D),  dV += P^T dO,  dK += dS^T Q
//  (c = softmax_scale * log2(e): the scores are base-2, P = 2^(S - lse log2(e)).)
// With enough (batch, kv head) pairs to fill the threads, one pass instead: phase 1 keeps only the
// statistics, and one task per (batch, kv head) walks its key blocks and adds each step's dS K into
// a dQ kept for every row of its query heads (five products instead of seven); the scores, and so
// every gradient, are bitwise those of the two phases (one_pass below).
// Each product runs on the forward's register-blocked micro-tiles (flash_kernel.h: scores_tile for
// the score-shaped ones, TileSteps' P V product for the rest) and the vectorized exp2, compiled
// for AVX2+FMA where the host has it (AVX-512 hosts included), else for the baseline.
// Each element of dq, dk and dv is written by one task, and each task's arithmetic follows a
// fixed order that depends only on its index: the gradients are bitwise reproducible whatever
// the thread count (deterministic by construction; the `deterministic` flag changes nothing).
//
// P is 2^(S - lse log2(e)) with the caller's lse, as on every backend: a caller may pass an lse
// over more keys than this call sees (ring attention passes the merged lse of every KV shard,
// with the merged out), and D then uses that out. The lse is float32, though, which would cap
// float64 gradients at float32 accuracy; so in float64 each row's logsumexp over this call's keys
// is recomputed (one more sweep of S^T), and it replaces the given one when the two agree to
// within float32 rounding (the given one is then that value rounded, and the recomputed one the
// same number more precisely).
// GCC warns that the kernel's helpers returning 32/64-byte vectors would pass them differently
// without AVX enabled; they are always inlined into the target("...") functions below (as in
// cpu_attention.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_attention.h"
#include "flash_kernel.h"
#include "flash_kernel_avx2.h"
#include "thread_pool.h"

// The per-task functions are always inlined (WAVEBOOST_CPU_INLINE, flash_kernel.h) into the wrappers
// below, which are compiled for AVX2+FMA or the baseline instruction set and picked at run time (as
// the forward's kernels are).

namespace waveboost::cpu {
namespace {

constexpr int64_t kBlockM = 64;  // query rows per tile
constexpr int64_t kBlockN = 64;  // keys per tile

// Where one (batch, head) of each tensor starts, and the causal bounds.
template <typename T>
struct Problem {
  const AttentionBackwardParams& p;
  T scale;
  int64_t causal_offset;  // query i sees key j iff j <= i + causal_offset (causal only)

  explicit Problem(const AttentionBackwardParams& params)
      : p(params), scale(static_cast<T>(params.softmax_scale)), causal_offset(params.seqlen_k - params.seqlen_q) {}

  int64_t group() const { return p.heads / p.heads_kv; }

  const T* q_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
  }
  const T* k_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<const T*>(p.k) + b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride;
  }
  const T* v_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<const T*>(p.v) + b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride;
  }
  const T* o_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
  }
  const T* do_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.dout) + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
  }
  T* dq_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<T*>(p.dq) + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride;
  }
  T* dk_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<T*>(p.dk) + b * p.dk_batch_stride + j * p.dk_row_stride + hk * p.dk_head_stride;
  }
  T* dv_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<T*>(p.dv) + b * p.dv_batch_stride + j * p.dv_row_stride + hk * p.dv_head_stride;
  }
  T dlse(int64_t b, int64_t h, int64_t i) const {
    if (p.dlse == nullptr) return T(0);
    return static_cast<T>(p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + i]);
  }

  float lse(int64_t b, int64_t h, int64_t i) const {
    return p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i];
  }

  // Keys [0, visible_keys(i)) are those query i sees.
  int64_t visible_keys(int64_t i) const {
    if (!p.is_causal) return p.seqlen_k;
    return std::clamp<int64_t>(i + causal_offset + 1, 0, p.seqlen_k);
  }
  // Queries [first_query(j), seqlen_q) are those that see key j.
  int64_t first_query(int64_t j) const {
    if (!p.is_causal) return 0;
    return std::clamp<int64_t>(j - causal_offset, 0, p.seqlen_q);
  }
};

// The lse a row's P uses: the caller's float32 `given`, or `local` (this call's keys, in the
// working precision) where `given` is `local` rounded to float32 (two float32 ulps allow for
// the rounding of the forward's own arithmetic).
template <typename T>
WAVEBOOST_CPU_INLINE T refined_lse(float given, T local) {
  if (!std::isfinite(given) || !std::isfinite(local)) return static_cast<T>(given);
  const float magnitude = std::fabs(given);
  const T ulp = static_cast<T>(std::nextafter(magnitude, std::numeric_limits<float>::infinity()) - magnitude);
  return std::fabs(static_cast<T>(given) - local) <= 2 * ulp ? local : static_cast<T>(given);
}

// Per-thread scratch of the two phases (flash_kernel.h's ScratchArray: 64-byte aligned, grows only).
template <typename T>
struct BackwardScratch {
  ScratchArray<T> rows_t;   // (head_dim, padded): c Q^T (phase 1) or c K^T (phase 2)
  ScratchArray<T> grads_t;  // (head_dim, padded): dO^T (phase 1) or V^T (phase 2)
  ScratchArray<T> s;        // scores, then P
  ScratchArray<T> ds;       // dP, then dS
  ScratchArray<T> tile;     // rows copied with zero-padded head dims: K (phase 1), Q (phase 2)
  ScratchArray<T> tile2;    // and dO (phase 2)
  ScratchArray<T> acc;      // dQ (phase 1), dK (phase 2)
  ScratchArray<T> acc2;     // dV (phase 2)
  ScratchArray<T> k_tile;   // K rows scaled by c (phase 1), or zero-padded for dQ (one pass)
  ScratchArray<T> ds_t;     // dS^T of one step (one pass)
  ScratchArray<T> dq_all;   // dQ of every row of the kv head's query heads (one pass)
  ScratchArray<T> vec[6];   // per-row vectors
};

template <typename T>
BackwardScratch<T>& thread_scratch() {
  thread_local BackwardScratch<T> scratch;
  return scratch;
}

// dst (head_dim, ld) = scale * src rows^T; columns n .. ld - 1 zero.
template <typename T>
WAVEBOOST_CPU_INLINE void pack_transposed(const T* rows, int64_t row_stride, int64_t n, int64_t head_dim, T scale, int64_t ld,
                                    T* dst) {
  std::fill(dst, dst + head_dim * ld, T(0));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < head_dim; ++d) dst[d * ld + j] = rows[j * row_stride + d] * scale;
}

// dst (n, dim_padded) = src rows, zero-padded past head_dim.
template <typename T>
WAVEBOOST_CPU_INLINE void copy_rows(const T* rows, int64_t row_stride, int64_t n, int64_t head_dim, int64_t dim_padded,
                              T* dst) {
  for (int64_t j = 0; j < n; ++j) {
    std::copy(rows + j * row_stride, rows + j * row_stride + head_dim, dst + j * dim_padded);
    std::fill(dst + j * dim_padded + head_dim, dst + (j + 1) * dim_padded, T(0));
  }
}

// P = 2^(s - lse2) and dS = P * (dp - shift) in place over one vector of `ld`-strided entries:
// `limit` (per lane, as T) is how many entries along the other axis are visible, `index` the
// lane's position along it. lse2 = +inf (a row that sees no key) gives P = 0.
template <class C, typename Mask>
WAVEBOOST_CPU_INLINE void probabilities(typename Simd<typename C::Element, C::kLanes>::Vec score_shift,
                                  typename Simd<typename C::Element, C::kLanes>::Vec d_shift, Mask visible,
                                  typename C::Element* s, typename C::Element* dp) {
  using T = typename C::Element;
  using S = Simd<T, C::kLanes>;
  const typename S::Vec prob = exp2_simd<T, C::kLanes>(S::load(s) - score_shift);
  const typename S::Vec masked = visible ? prob : S::splat(0);  // a comparison's lanes: all ones or zero
  S::store(s, masked);
  S::store(dp, masked * (S::load(dp) - d_shift));
}

// Task of phase 1: statistics of query rows [i0, i0 + m) of head h and, kDq, their dQ.
template <class C, bool kDq>
WAVEBOOST_CPU_INLINE void query_block(const Problem<typename C::Element>& pr, int64_t b, int64_t h, int64_t i0, int64_t m,
                                typename C::Element* lse2_buf, typename C::Element* shift_buf) {
  using T = typename C::Element;
  using S = Simd<T, C::kLanes>;
  using Vec = typename S::Vec;
  const AttentionBackwardParams& p = pr.p;
  const int64_t head_dim = p.head_dim, hk = h / pr.group();
  const int64_t dim_padded = round_up(head_dim, C::kLanes), mp = round_up(m, C::kLanes);
  const int64_t stat = (b * p.heads + h) * p.seqlen_q + i0;  // this block's offset in the statistics buffers
  const int64_t keys_needed = pr.visible_keys(i0 + m - 1);  // the block's last row sees the most keys
  const int64_t first_row_keys = pr.visible_keys(i0);
  const T c = static_cast<T>(p.softmax_scale * kLog2e);
  BackwardScratch<T>& sc = thread_scratch<T>();
  T* q_t = sc.rows_t.get(head_dim * mp);
  T* do_t = sc.grads_t.get(head_dim * mp);
  T* st = sc.s.get(kBlockN * mp);
  T* dpt = sc.ds.get(kBlockN * mp);
  T* k_pad = sc.tile.get(kBlockN * dim_padded);
  T* k_scaled = sc.k_tile.get(kBlockN * head_dim);
  T* dq = sc.acc.get(mp * dim_padded);
  T* lse2 = sc.vec[0].get(mp);
  T* shift = sc.vec[1].get(mp);
  T* ones = sc.vec[2].get(mp);
  T* key_limit = sc.vec[3].get(mp);
  const T* k = pr.k_row(b, hk, 0);
  const T* v = pr.v_row(b, hk, 0);
  std::fill(ones, ones + mp, T(1));
  const auto set_key_limits = [&](int64_t j0, int64_t n) {
    for (int64_t r = 0; r < mp; ++r)
      key_limit[r] = static_cast<T>(r < m ? std::clamp<int64_t>(pr.visible_keys(i0 + r) - j0, 0, n) : 0);
  };
  // S^T = (c K) Q^T: the scale rides on K, as in the key blocks' S = Q (c K)^T, so that both give
  // every score bitwise alike (one pass's dQ is then the two-phase dQ, bit for bit).
  const auto scaled_keys = [&](int64_t j0, int64_t n) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < head_dim; ++d) k_scaled[j * head_dim + d] = k[(j0 + j) * p.k_row_stride + d] * c;
    return k_scaled;
  };
  pack_transposed(pr.q_row(b, h, i0), p.q_row_stride, m, head_dim, T(1), mp, q_t);

  // Row statistics: lse * log2(e) (+inf where lse is -inf: P = 0) and D - dlse.
  for (int64_t r = 0; r < mp; ++r) {
    lse2[r] = std::numeric_limits<T>::infinity();
    shift[r] = T(0);
  }
  if constexpr (std::is_same_v<T, double>) {
    // float64: this call's logsumexp per row (the forward's online softmax over S^T), to refine the
    // float32 lse with.
    T* row_max = sc.vec[4].get(mp);
    T* row_sum = sc.vec[5].get(mp);
    T* alpha = dq;  // scratch until the dQ sweep
    std::fill(row_max, row_max + mp, -std::numeric_limits<T>::infinity());
    std::fill(row_sum, row_sum + mp, T(0));
    for (int64_t j0 = 0; j0 < keys_needed; j0 += kBlockN) {
      const int64_t n = std::min(kBlockN, keys_needed - j0);
      TileSteps<C>::scores(scaled_keys(j0, n), head_dim, n, q_t, mp, mp, head_dim, st);
      set_key_limits(j0, n);
      online_softmax_tile<C>(n, mp, mp, key_limit, true, st, row_max, row_sum, alpha);
    }
    for (int64_t r = 0; r < m; ++r) {
      const T local = row_sum[r] > T(0) ? row_max[r] * static_cast<T>(kLn2) + std::log(row_sum[r])
                                        : -std::numeric_limits<T>::infinity();
      lse2[r] = refined_lse(pr.lse(b, h, i0 + r), local);
    }
  } else {
    for (int64_t r = 0; r < m; ++r) lse2[r] = pr.lse(b, h, i0 + r);
  }
  for (int64_t r = 0; r < m; ++r) {
    lse2[r] = std::isinf(lse2[r]) && lse2[r] < 0 ? std::numeric_limits<T>::infinity() : lse2[r] * static_cast<T>(kLog2e);
    const T* o = pr.o_row(b, h, i0 + r);
    const T* dout = pr.do_row(b, h, i0 + r);
    T dot = 0;
    for (int64_t d = 0; d < head_dim; ++d) dot += dout[d] * o[d];
    shift[r] = dot - pr.dlse(b, h, i0 + r);
    lse2_buf[stat + r] = lse2[r];
    shift_buf[stat + r] = shift[r];
  }
  if constexpr (!kDq) return;

  // dQ / scale = sum over key tiles of dS^T^T K.
  pack_transposed(pr.do_row(b, h, i0), p.do_row_stride, m, head_dim, T(1), mp, do_t);
  std::fill(dq, dq + mp * dim_padded, T(0));
  for (int64_t j0 = 0; j0 < keys_needed; j0 += kBlockN) {
    const int64_t n = std::min(kBlockN, keys_needed - j0);
    TileSteps<C>::scores(scaled_keys(j0, n), head_dim, n, q_t, mp, mp, head_dim, st);
    TileSteps<C>::scores(v + j0 * p.v_row_stride, p.v_row_stride, n, do_t, mp, mp, head_dim, dpt);
    const bool apply_mask = j0 + n > first_row_keys;
    if (apply_mask) set_key_limits(j0, n);
    for (int64_t i = 0; i < mp; i += C::kLanes) {
      const Vec lse_i = S::load(lse2 + i), shift_i = S::load(shift + i);
      const Vec limit = apply_mask ? S::load(key_limit + i) : S::splat(static_cast<T>(n));
      for (int64_t j = 0; j < n; ++j) {
        const auto visible = S::splat(static_cast<T>(j)) < limit;
        probabilities<C>(lse_i, shift_i, visible, st + j * mp + i, dpt + j * mp + i);
      }
    }
    copy_rows(k + j0 * p.k_row_stride, p.k_row_stride, n, head_dim, dim_padded, k_pad);
    TileSteps<C>::pv(dpt, mp, k_pad, dim_padded, n, ones, mp, dim_padded, dq);
  }
  for (int64_t r = 0; r < m; ++r) {
    T* dq_row = pr.dq_row(b, h, i0 + r);
    for (int64_t d = 0; d < head_dim; ++d) dq_row[d] = dq[r * dim_padded + d] * pr.scale;
  }
}

// dK and dV of keys [j0, j0 + n) of kv head hk, over its query heads, in query blocks of kBlockM
// aligned as phase 1's. kDq (one pass): also adds each block's dS K into dq_all, dQ / scale of
// every row of the query heads of hk, rows_per_head (padded) rows of dim_padded per head.
template <class C, bool kDq>
WAVEBOOST_CPU_INLINE void key_block(const Problem<typename C::Element>& pr, int64_t b, int64_t hk, int64_t j0, int64_t n,
                              const typename C::Element* lse2_buf, const typename C::Element* shift_buf,
                              typename C::Element* dq_all, int64_t rows_per_head) {
  using T = typename C::Element;
  using S = Simd<T, C::kLanes>;
  using Vec = typename S::Vec;
  const AttentionBackwardParams& p = pr.p;
  const int64_t head_dim = p.head_dim;
  const int64_t dim_padded = round_up(head_dim, C::kLanes), np = round_up(n, C::kLanes);
  const T c = static_cast<T>(p.softmax_scale * kLog2e);
  BackwardScratch<T>& sc = thread_scratch<T>();
  T* k_t = sc.rows_t.get(head_dim * np);
  T* v_t = sc.grads_t.get(head_dim * np);
  T* s = sc.s.get(kBlockM * np);
  T* ds = sc.ds.get(kBlockM * np);
  T* q_tile = sc.tile.get(kBlockM * dim_padded);
  T* do_tile = sc.tile2.get(kBlockM * dim_padded);
  T* dk = sc.acc.get(np * dim_padded);
  T* dv = sc.acc2.get(np * dim_padded);
  T* ones = sc.vec[0].get(std::max(np, kBlockM));
  pack_transposed(pr.k_row(b, hk, j0), p.k_row_stride, n, head_dim, c, np, k_t);
  pack_transposed(pr.v_row(b, hk, j0), p.v_row_stride, n, head_dim, T(1), np, v_t);
  std::fill(dk, dk + np * dim_padded, T(0));
  std::fill(dv, dv + np * dim_padded, T(0));
  std::fill(ones, ones + std::max(np, kBlockM), T(1));
  T* k_pad = kDq ? sc.k_tile.get(kBlockN * dim_padded) : nullptr;
  T* ds_t = kDq ? sc.ds_t.get(kBlockN * kBlockM) : nullptr;
  if constexpr (kDq) copy_rows(pr.k_row(b, hk, j0), p.k_row_stride, n, head_dim, dim_padded, k_pad);
  Vec lane_index;
  for (int l = 0; l < C::kLanes; ++l) lane_index[l] = static_cast<T>(l);

  // Query blocks whose last row sees key j0 (phase 1 visits the same (query block, key tile) pairs).
  const int64_t first_block = pr.first_query(j0) / kBlockM * kBlockM;
  for (int64_t h = hk * pr.group(); h < (hk + 1) * pr.group(); ++h) {
    const int64_t stat = (b * p.heads + h) * p.seqlen_q;
    for (int64_t i0 = first_block; i0 < p.seqlen_q; i0 += kBlockM) {
      const int64_t m = std::min(kBlockM, p.seqlen_q - i0);
      const T* q = pr.q_row(b, h, i0);
      const T* dout = pr.do_row(b, h, i0);
      TileSteps<C>::scores(q, p.q_row_stride, m, k_t, np, np, head_dim, s);
      TileSteps<C>::scores(dout, p.do_row_stride, m, v_t, np, np, head_dim, ds);
      for (int64_t r = 0; r < m; ++r) {
        const Vec lse_r = S::splat(lse2_buf[stat + i0 + r]), shift_r = S::splat(shift_buf[stat + i0 + r]);
        const Vec limit = S::splat(static_cast<T>(std::clamp<int64_t>(pr.visible_keys(i0 + r) - j0, 0, n)));
        for (int64_t j = 0; j < np; j += C::kLanes) {
          const auto visible = lane_index + static_cast<T>(j) < limit;
          probabilities<C>(lse_r, shift_r, visible, s + r * np + j, ds + r * np + j);
        }
      }
      copy_rows(q, p.q_row_stride, m, head_dim, dim_padded, q_tile);
      copy_rows(dout, p.do_row_stride, m, head_dim, dim_padded, do_tile);
      TileSteps<C>::pv(s, np, do_tile, dim_padded, m, ones, np, dim_padded, dv);
      TileSteps<C>::pv(ds, np, q_tile, dim_padded, m, ones, np, dim_padded, dk);
      if constexpr (kDq) {
        // dS^T (keys x queries, padded queries zero), then dQ += dS K as phase 1 adds it.
        const int64_t mp = round_up(m, C::kLanes);
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t r = 0; r < m; ++r) ds_t[j * mp + r] = ds[r * np + j];
          std::fill(ds_t + j * mp + m, ds_t + (j + 1) * mp, T(0));
        }
        T* dq = dq_all + ((h - hk * pr.group()) * rows_per_head + i0) * dim_padded;
        TileSteps<C>::pv(ds_t, mp, k_pad, dim_padded, n, ones, mp, dim_padded, dq);
      }
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    T* dk_row = pr.dk_row(b, hk, j0 + j);
    T* dv_row = pr.dv_row(b, hk, j0 + j);
    for (int64_t d = 0; d < head_dim; ++d) {
      dk_row[d] = dk[j * dim_padded + d] * pr.scale;
      dv_row[d] = dv[j * dim_padded + d];
    }
  }
}

// One pass: every key block of kv head hk with the dQ of its query heads (after phase 1's statistics).
template <class C>
WAVEBOOST_CPU_INLINE void kv_head(const Problem<typename C::Element>& pr, int64_t b, int64_t hk,
                            const typename C::Element* lse2_buf, const typename C::Element* shift_buf) {
  using T = typename C::Element;
  const AttentionBackwardParams& p = pr.p;
  const int64_t dim_padded = round_up(p.head_dim, C::kLanes);
  const int64_t rows_per_head = round_up(p.seqlen_q, kBlockM);
  T* dq_all = thread_scratch<T>().dq_all.get(pr.group() * rows_per_head * dim_padded);
  std::fill(dq_all, dq_all + pr.group() * rows_per_head * dim_padded, T(0));
  for (int64_t j0 = 0; j0 < p.seqlen_k; j0 += kBlockN)
    key_block<C, true>(pr, b, hk, j0, std::min(kBlockN, p.seqlen_k - j0), lse2_buf, shift_buf, dq_all, rows_per_head);
  for (int64_t g = 0; g < pr.group(); ++g) {
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      T* dq_row = pr.dq_row(b, hk * pr.group() + g, i);
      const T* acc = dq_all + (g * rows_per_head + i) * dim_padded;
      for (int64_t d = 0; d < p.head_dim; ++d) dq_row[d] = acc[d] * pr.scale;
    }
  }
}

// One task of either schedule, dispatched inside the instruction-set wrappers below.
template <typename T>
struct Task {
  enum Kind { kQueryBlock, kQueryStatistics, kKeyBlock, kKvHead } kind;
  int64_t b, head, begin, count;
  T* lse2;
  T* shift;
};

template <class C>
WAVEBOOST_CPU_INLINE void run_task(const Problem<typename C::Element>& pr, const Task<typename C::Element>& t) {
  switch (t.kind) {
    case Task<typename C::Element>::kQueryBlock:
      return query_block<C, true>(pr, t.b, t.head, t.begin, t.count, t.lse2, t.shift);
    case Task<typename C::Element>::kQueryStatistics:
      return query_block<C, false>(pr, t.b, t.head, t.begin, t.count, t.lse2, t.shift);
    case Task<typename C::Element>::kKeyBlock:
      return key_block<C, false>(pr, t.b, t.head, t.begin, t.count, t.lse2, t.shift, nullptr, 0);
    case Task<typename C::Element>::kKvHead:
      return kv_head<C>(pr, t.b, t.head, t.lse2, t.shift);
  }
}

template <class C>
void run_task_baseline(const Problem<typename C::Element>& pr, const Task<typename C::Element>& t) {
  run_task<C>(pr, t);
}
#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_BWD_X86 1
template <class C>
__attribute__((target("avx2,fma"))) void run_task_avx2(const Problem<typename C::Element>& pr,
                                                        const Task<typename C::Element>& t) {
  run_task<C>(pr, t);
}
#endif

template <typename T>
using TaskRunner = void (*)(const Problem<T>&, const Task<T>&);

// The forward's instruction set detection and micro-tile configurations (flash_kernel.h). A host with
// AVX-512 runs the AVX2 configuration of the backward: an AVX-512 one would need its own tests and
// measurements on such a host.
template <typename T>
TaskRunner<T> select_runner() {
  switch (detect_isa()) {
#ifdef WAVEBOOST_CPU_BWD_X86
    case Isa::kAvx512:
    case Isa::kAvx2: return run_task_avx2<Avx2Config<T>>;
#endif
    default: return run_task_baseline<BaselineConfig<T>>;
  }
}

// The one-pass schedule (a task per (batch, kv head), dQ kept for its query heads' rows) skips
// phase 1's recomputation of S^T and dP^T (two of seven products) but has batch x heads_kv tasks:
// taken where that fills the threads twice over and the dQ scratch stays small. Both schedules give
// bitwise the same gradients (tests/test_backward.py), so the choice never shows in the results.
// WAVEBOOST_CPU_BACKWARD=one-pass|two-phase forces one (for tests and measurement).
constexpr int64_t kOnePassMaxScratchBytes = int64_t(64) << 20;

template <typename T>
bool one_pass(const AttentionBackwardParams& p, int threads) {
  if (const char* force = std::getenv("WAVEBOOST_CPU_BACKWARD")) {
    if (std::strcmp(force, "one-pass") == 0) return true;
    if (std::strcmp(force, "two-phase") == 0) return false;
  }
  const int64_t scratch = (p.heads / p.heads_kv) * round_up(p.seqlen_q, kBlockM) *
                          round_up(p.head_dim, 16) * static_cast<int64_t>(sizeof(T));
  return p.batch * p.heads_kv >= 2 * static_cast<int64_t>(threads) && scratch <= kOnePassMaxScratchBytes;
}

template <typename T>
Status run_backward(const AttentionBackwardParams& p) {
  static const TaskRunner<T> run = select_runner<T>();
  const Problem<T> pr(p);
  std::vector<T> lse2_buf, shift_buf;
  try {
    lse2_buf.resize(static_cast<size_t>(p.batch * p.heads * p.seqlen_q));
    shift_buf.resize(lse2_buf.size());
  } catch (const std::exception&) {
    return Status::Internal("backend 'cpu': out of memory for the backward's row statistics");
  }
  std::atomic<bool> failed{false};
  ThreadPool& pool = global_thread_pool();
  const bool whole_heads = one_pass<T>(p, pool.num_threads());
  const auto run_all = [&](int64_t count, auto make_task) {
    pool.parallel_for(count, [&](int64_t index) {
      try {
        run(pr, make_task(index));
      } catch (const std::exception&) {
        failed.store(true);
      }
    });
    return !failed.load();
  };

  // Phase 1: statistics (and, two-phase, dQ) per query block; causal: the last blocks see the most
  // keys, handed out first.
  const int64_t q_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const bool ok1 = run_all(p.batch * p.heads * q_blocks, [&](int64_t index) {
    const int64_t block = q_blocks - 1 - index % q_blocks, bh = index / q_blocks, i0 = block * kBlockM;
    return Task<T>{whole_heads ? Task<T>::kQueryStatistics : Task<T>::kQueryBlock, bh / p.heads, bh % p.heads, i0,
                   std::min(kBlockM, p.seqlen_q - i0), lse2_buf.data(), shift_buf.data()};
  });
  if (!ok1) return Status::Internal("backend 'cpu': out of memory for the backward's scratch");

  // Phase 2: dK and dV per key block (causal: the first blocks are seen by the most rows, handed
  // out first), or everything else per kv head.
  const int64_t k_blocks = whole_heads ? 1 : (p.seqlen_k + kBlockN - 1) / kBlockN;
  const bool ok2 = run_all(p.batch * p.heads_kv * k_blocks, [&](int64_t index) {
    const int64_t bh = index / k_blocks, j0 = index % k_blocks * kBlockN;
    if (whole_heads)
      return Task<T>{Task<T>::kKvHead, bh / p.heads_kv, bh % p.heads_kv, 0, p.seqlen_k, lse2_buf.data(),
                     shift_buf.data()};
    return Task<T>{Task<T>::kKeyBlock, bh / p.heads_kv, bh % p.heads_kv, j0, std::min(kBlockN, p.seqlen_k - j0),
                   lse2_buf.data(), shift_buf.data()};
  });
  if (!ok2) return Status::Internal("backend 'cpu': out of memory for the backward's scratch");
  return Status::Ok();
}

}  // namespace

Status can_implement_backward(const AttentionBackwardParams& params) {
  if (params.device_type != DeviceType::kCPU)
    return Status::NotSupported("backend 'cpu' runs on host memory; got tensors on a CUDA device");
  if (params.dtype != DType::kFloat32 && params.dtype != DType::kFloat64)
    return Status::NotSupported(std::string("backend 'cpu' computes the backward pass in float32 and float64; got ") +
                                dtype_name(params.dtype) + " (use a CUDA backend for half precision, or upcast)");
  return Status::Ok();
}

Status attention_backward(const AttentionBackwardParams& params) {
  if (Status s = can_implement_backward(params); !s.ok()) return s;
  if (params.batch == 0 || params.heads == 0) return Status::Ok();
  return params.dtype == DType::kFloat32 ? run_backward<float>(params) : run_backward<double>(params);
}

}  // namespace waveboost::cpu
