// The AVX2 + FMA fp32 forward on packed keys: scores, probabilities and output all in query rows.
//
// attention_query_block (flash_kernel.h) keeps the scores transposed (keys x queries) so that K
// is read in place and the softmax needs no horizontal reduction. Once K and V are packed per
// (batch, kv head) before the run (pack_kv, cpu_attention.cpp), K can be packed transposed instead,
// in panels of kPanelKeys keys ([panel][d][key], 16 floats per d), and the whole block can work on
// query rows:
//  - S = Q K^T: a 6-row x 16-key micro-tile broadcasts Q[i][d] from six query rows and loads one
//    panel row K^T[d][j .. j + 15] per step (scores_microtile_avx2 with the roles of its operands
//    swapped: queries broadcast, keys streamed);
//  - the online softmax runs along each row: one horizontal max and one horizontal sum per row
//    and tile;
//  - O += P V: a 6-row x 16-column micro-tile broadcasts P[i][j] from six probability rows and
//    loads V[j][d .. d + 15] (pv_microtile_avx2 reading P by rows).
// Both products then broadcast from six contiguous row streams and load one streamed operand.
// On one Zen 1 core (64 x 128 tile in L1/L2) P V ran at 0.95 -> 0.98 of the FMA peak at head dim
// 128 and 0.84 -> 0.97 at head dim 64 against the transposed tile (where each step reads a new
// line of P^T: 128 lines per micro-tile), S level or +1%. The whole kernel, one head, paired
// against the transposed kernel with the same softmax: +0-0.7% at head dim 128, +1-2% at 64 with
// 128-key tiles; 256-key tiles (kRowTileKeys) and causal row groups that stop at their last
// visible key add +1% and, causal, +3-5% (benchmarks/NOTES.md).
#pragma once

#include "flash_kernel_avx2.h"

#if defined(__x86_64__) || defined(__i386__)

namespace waveboost::cpu {

// Keys per panel of packed K^T: the micro-tile's width (two ymm registers of fp32).
constexpr int64_t kPanelKeys = 16;

// K^T of every (batch, kv head) in panels of kPanelKeys keys: key j, dim d of a head at
// head + (j / kPanelKeys) * kPanelKeys * head_dim + d * kPanelKeys + j % kPanelKeys; keys past
// seqlen_k in the last panel are zero.
struct KeyPanels {
  const float* data = nullptr;
  int64_t head_stride = 0;   // elements between kv heads
  int64_t batch_stride = 0;  // elements between batches
};

// The 8 x 8 block at rows[0..7][0..7] transposed into out[c * ldo + 0..7] for c = 0..7.
WAVEBOOST_CPU_AVX2_INLINE void transpose_8x8(const float* const (&rows)[8], float* out, int64_t ldo) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i]);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      r[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(out + c * ldo, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
    _mm256_storeu_ps(out + (c + 4) * ldo, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
  }
}

// K^T of one head's keys [0, seqlen_k) (rows row_stride apart) into KeyPanels' layout
// (round_up(seqlen_k, kPanelKeys) * head_dim floats). Whole panels go by 8 x 8 transposes in
// registers: element by element, K of B=1 H=8 L=2048 D=128 took 2.1 ms on a Zen 3 core (1% of
// the call's CPU time), transposed 0.9 ms. Needs head_dim % 8 == 0, as the rows kernel does.
WAVEBOOST_CPU_AVX2 inline void pack_key_panels(const float* k, int64_t row_stride, int64_t seqlen_k, int64_t head_dim,
                                               float* panels) {
  for (int64_t j0 = 0; j0 < seqlen_k; j0 += kPanelKeys) {
    float* panel = panels + j0 * head_dim;
    const int64_t keys = std::min(kPanelKeys, seqlen_k - j0);
    if (keys == kPanelKeys) {
      for (int64_t t0 = 0; t0 < kPanelKeys; t0 += 8)
        for (int64_t d = 0; d < head_dim; d += 8) {
          const float* rows[8];
          for (int r = 0; r < 8; ++r) rows[r] = k + (j0 + t0 + r) * row_stride + d;
          transpose_8x8(rows, panel + d * kPanelKeys + t0, kPanelKeys);
        }
      continue;
    }
    for (int64_t t = 0; t < kPanelKeys; ++t)
      for (int64_t d = 0; d < head_dim; ++d) panel[d * kPanelKeys + t] = t < keys ? k[(j0 + t) * row_stride + d] : 0.0f;
  }
}

// Per-thread scratch of the row kernel (64-byte aligned, grown on demand).
struct RowScratch {
  ScratchArray<float> q;      // (kBlockM, ldq): Q pre-scaled by softmax_scale * log2(e)
  ScratchArray<float> s;      // (kBlockM, lds): scores, then probabilities in place
  ScratchArray<float> o;      // (kBlockM, head_dim): unnormalized output
  ScratchArray<float> m;      // (kBlockM): running max of the base-2 scores
  ScratchArray<float> l;      // (kBlockM): running sum of 2^(s - m)
  ScratchArray<float> alpha;  // (kBlockM): 2^(m_old - m_new), the rescale of O and l
};

// The largest and the sum of the 8 lanes.
WAVEBOOST_CPU_AVX2_INLINE float horizontal_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
WAVEBOOST_CPU_AVX2_INLINE float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// Keys per tile of the row kernel: twice the transposed kernel's kBlockN. With P in rows a P V
// micro-tile runs one step per key, so longer rows halve its accumulator load, rescale and store
// per key, and the softmax's two horizontal reductions per row and tile: +1% at head dims 64 and
// 128 on a Zen 1 core; the tile's K^T and V (272 KiB at head dim 128) still sit in L2 beside the
// next tile's.
constexpr int64_t kRowTileKeys = 256;

// Scores above 2^22 in magnitude (base 2) make the rounding constant of exp2_below inexact.
constexpr float kLargestExactReference = 4194304.0f;

// 2^(s - reference) over vecs vectors of one row, in place, four at a time; returns their sum.
// kSubtract: the reference is subtracted first (any finite reference); else it rides in the
// rounding constant of exp2_below (an integer below 2^22 in magnitude).
template <bool kSubtract>
WAVEBOOST_CPU_AVX2_INLINE __m256 exponentiate_row(float* s, int64_t vecs, float reference) {
  constexpr int kKeys = 4;  // vectors of exponentials in flight
  const __m256 shift = _mm256_set1_ps(reference);
  const float folded = kSubtract ? 0.0f : reference;
  __m256 sums[kKeys];
  for (int k = 0; k < kKeys; ++k) sums[k] = _mm256_setzero_ps();
  int64_t v = 0;
  for (; v + kKeys <= vecs; v += kKeys) {
    __m256 prob[kKeys];
    for (int k = 0; k < kKeys; ++k) {
      prob[k] = _mm256_loadu_ps(s + (v + k) * 8);
      if constexpr (kSubtract) prob[k] = _mm256_sub_ps(prob[k], shift);
    }
    exp2_below<kKeys>(prob, folded);
    for (int k = 0; k < kKeys; ++k) {
      _mm256_storeu_ps(s + (v + k) * 8, prob[k]);
      sums[k] = _mm256_add_ps(sums[k], prob[k]);
    }
  }
  for (; v < vecs; ++v) {
    __m256 prob[1] = {_mm256_loadu_ps(s + v * 8)};
    if constexpr (kSubtract) prob[0] = _mm256_sub_ps(prob[0], shift);
    exp2_below<1>(prob, folded);
    _mm256_storeu_ps(s + v * 8, prob[0]);
    sums[0] = _mm256_add_ps(sums[0], prob[0]);
  }
  return _mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3]));
}

// One row of base-2 scores s[0 .. cols) turned into probabilities in place, keys from `visible`
// on masked (P = 0); the row's m and l updated. Returns alpha = 2^(m_old - m_new), the rescale of
// its O and l. The scores of the last vector past `cols` count as masked.
// m is the row's running maximum rounded up to an integer (P <= 1 still; alpha is then an exact
// power of two), the reference exp2_below takes without a subtraction; a row that has seen no
// key yet keeps m = -inf and measures from 0, as online_softmax_tile does.
WAVEBOOST_CPU_AVX2_INLINE float online_softmax_row(float* s, int64_t cols, int64_t visible, float& m, float& l) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const __m256 neg_inf = _mm256_set1_ps(-kInf);
  const int64_t vecs = (cols + 7) / 8;
  if (visible < vecs * 8) {
    const __m256 limit = _mm256_set1_ps(static_cast<float>(visible));
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t v = visible / 8; v < vecs; ++v) {
      const __m256 key = _mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(v * 8)));
      const __m256 score = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s + v * 8), _mm256_cmp_ps(key, limit, _CMP_LT_OQ));
      _mm256_storeu_ps(s + v * 8, score);
    }
  }
  __m256 maxes[4] = {neg_inf, neg_inf, neg_inf, neg_inf};  // four chains: vmaxps latency
  int64_t v = 0;
  for (; v + 4 <= vecs; v += 4)
    for (int k = 0; k < 4; ++k) maxes[k] = _mm256_max_ps(maxes[k], _mm256_loadu_ps(s + (v + k) * 8));
  for (; v < vecs; ++v) maxes[0] = _mm256_max_ps(maxes[0], _mm256_loadu_ps(s + v * 8));
  const float row_max = horizontal_max(_mm256_max_ps(_mm256_max_ps(maxes[0], maxes[1]), _mm256_max_ps(maxes[2], maxes[3])));
  const float m_old = m;
  const float m_new = std::max(m_old, row_max);
  const bool seen = m_new != -kInf;
  const float reference = seen ? std::ceil(m_new) : 0.0f;
  const bool exact = std::fabs(reference) < kLargestExactReference;
  __m256 rescale[1] = {_mm256_set1_ps(m_old - (exact ? reference : m_new))};
  exp2_nonpositive<1>(rescale);
  const __m256 sums = exact ? exponentiate_row<false>(s, vecs, reference) : exponentiate_row<true>(s, vecs, m_new);
  const float alpha = _mm256_cvtss_f32(rescale[0]);
  l = alpha * l + horizontal_sum(sums);
  m = !seen ? -kInf : exact ? reference : m_new;
  return alpha;
}

// The per-tile steps of the row kernel, compiled as functions of their own (see Avx2TileSteps).
// Query rows go in groups of C::kTileRows (a micro-tile's rows); group_keys[g] is how many of the
// tile's keys group g's last (most-seeing) row sees, so that causal tiles skip the micro-tiles
// above the diagonal and P V stops at each group's last visible key.
struct Avx2RowSteps {
  using C = Avx2Config<float>;
  static constexpr int kPrefetchPerMicroTile = Avx2TileSteps<C>::kPrefetchPerMicroTile;

  // S[i][j] = sum_d q[i][d] K^T[d][j] over whole panels, query rows outer: a group's six Q rows
  // stay in L1 across the tile's panels.
  static WAVEBOOST_CPU_AVX2 void scores(const float* q, int64_t ldq, int64_t rows, const float* panels,
                                        const int64_t* group_keys, int64_t head_dim, float* s, int64_t lds) {
    PrefetchQueue prefetch = Avx2TileSteps<C>::queue();  // a local copy, stored back below
    for (int64_t i = 0, g = 0; i < rows; i += C::kTileRows, ++g) {
      const int64_t group = std::min<int64_t>(C::kTileRows, rows - i);
      for (int64_t j = 0; j < group_keys[g]; j += kPanelKeys) {
        const float* panel = panels + j * head_dim;
        if (group == C::kTileRows)
          scores_microtile_avx2<C, C::kTileRows, 2>(q + i * ldq, ldq, panel, kPanelKeys, head_dim, s + i * lds + j, lds);
        else
          scores_leftover_avx2<C, 2>(group, q + i * ldq, ldq, panel, kPanelKeys, head_dim, s + i * lds + j, lds);
        prefetch.issue(kPrefetchPerMicroTile);
      }
    }
    Avx2TileSteps<C>::queue() = prefetch;
  }

  // The online softmax of each row; visible(i) is how many of the tile's keys row i sees. The
  // rows of a group that sees no key of the tile keep their m and l (pv skips the group).
  template <class Visible>
  static WAVEBOOST_CPU_AVX2_INLINE void softmax(int64_t rows, const int64_t* group_keys, const Visible& visible,
                                                float* s, int64_t lds, float* m, float* l, float* alpha) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t cols = group_keys[i / C::kTileRows];
      alpha[i] = cols == 0 ? 1.0f : online_softmax_row(s + i * lds, cols, visible(i), m[i], l[i]);
    }
  }

  // O = diag(alpha) O + P V over each group's keys, column strips outer: a 16-wide strip of the V
  // tile stays in L1 across the row groups. A group that sees no key of the tile keeps its O.
  static WAVEBOOST_CPU_AVX2 void pv(const float* p, int64_t ldp, int64_t rows, const int64_t* group_keys,
                                    const float* v, int64_t ldv, const float* alpha, int64_t head_dim, float* o) {
    PrefetchQueue prefetch = Avx2TileSteps<C>::queue();  // a local copy, stored back below
    constexpr int64_t kWide = C::kTileVecs * C::kLanes;
    for (int64_t d = 0; d < head_dim;) {
      const bool wide = d + kWide <= head_dim;
      for (int64_t i = 0, g = 0; i < rows; i += C::kTileRows, ++g) {
        const int64_t group = std::min<int64_t>(C::kTileRows, rows - i);
        const int64_t cols = group_keys[g];
        if (cols == 0) continue;
        const float* p_i = p + i * ldp;
        float* o_id = o + i * head_dim + d;
        if (group == C::kTileRows && wide)
          pv_microtile_avx2<C, C::kTileRows, 2, true>(p_i, ldp, v + d, ldv, cols, alpha + i, o_id, head_dim);
        else if (group == C::kTileRows)
          pv_microtile_avx2<C, C::kTileRows, 1, true>(p_i, ldp, v + d, ldv, cols, alpha + i, o_id, head_dim);
        else if (wide)
          pv_leftover_avx2<C, 2, C::kTileRows - 1, true>(group, p_i, ldp, v + d, ldv, cols, alpha + i, o_id, head_dim);
        else
          pv_leftover_avx2<C, 1, C::kTileRows - 1, true>(group, p_i, ldp, v + d, ldv, cols, alpha + i, o_id, head_dim);
        prefetch.issue(kPrefetchPerMicroTile);
      }
      d += wide ? kWide : C::kLanes;
    }
    Avx2TileSteps<C>::queue() = prefetch;
  }
};

// Computes out (and lse) for one block of query rows (at most kBlockM) of one (batch, head), fp32,
// from K^T panels and V rows laid out as the V tile (params.v_row_stride = head_dim +
// Avx2TileSteps' padding). Needs head_dim % 8 == 0 (V strips of whole vectors, read in place) and
// a dense layout.
WAVEBOOST_CPU_AVX2_INLINE void attention_query_block_rows(const AttentionParams& params, const KeyPanels& keys,
                                                          const QueryBlock& block, RowScratch& scratch) {
  using C = Avx2Config<float>;
  constexpr int64_t kGroups = (C::kBlockM + C::kTileRows - 1) / C::kTileRows;
  const int64_t head_dim = params.head_dim;
  const int64_t rows = block.num_rows;
  const int64_t kv_head = block.head / (params.heads / params.heads_kv);
  const float* q = static_cast<const float*>(params.q) + block.batch * params.q_batch_stride +
                   block.head * params.q_head_stride + block.row_begin * params.q_row_stride;
  const float* panels = keys.data + block.batch * keys.batch_stride + kv_head * keys.head_stride;
  const float* v = static_cast<const float*>(params.v) + block.batch * params.v_batch_stride +
                   kv_head * params.v_head_stride;
  float* out = static_cast<float*>(params.out) + block.batch * params.o_batch_stride +
               block.head * params.o_head_stride + block.row_begin * params.o_row_stride;

  // Row strides padded by one cache line, as the transposed kernel's scratch (kScratchPad).
  const int64_t ldq = head_dim + Avx2TileSteps<C>::kScratchPad;
  const int64_t lds = kRowTileKeys + Avx2TileSteps<C>::kScratchPad;
  float* q_rows = scratch.q.get(rows * ldq);
  float* s = scratch.s.get(rows * lds);
  float* o = scratch.o.get(rows * head_dim);
  float* m = scratch.m.get(rows);
  float* l = scratch.l.get(rows);
  float* alpha = scratch.alpha.get(rows);
  int64_t group_keys[kGroups];

  // Q's rows (heads x head_dim floats apart in the input) requested all at once before the copy
  // below, which otherwise waited on them a line at a time: +1-2% (benchmarks/NOTES.md).
  constexpr int64_t kLineFloats = 64 / sizeof(float);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < head_dim; d += kLineFloats) __builtin_prefetch(q + i * params.q_row_stride + d, 0, 3);
  // Q pre-scaled so that the softmax is exp2(s - m) on base-2 scores.
  const float q_scale = static_cast<float>(params.softmax_scale * kLog2e);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < head_dim; ++d) q_rows[i * ldq + d] = q[i * params.q_row_stride + d] * q_scale;
  std::fill(o, o + rows * head_dim, 0.0f);
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.0f);

  // Tiles past the last row's causal limit are skipped, and within a tile each row group's keys
  // past its last row's limit (group_keys).
  const int64_t key_end = visible_keys(params, block.row_begin + rows - 1);
  for (int64_t key_begin = 0; key_begin < key_end; key_begin += kRowTileKeys) {
    const int64_t cols = std::min<int64_t>(kRowTileKeys, key_end - key_begin);
    const auto visible = [&](int64_t i) {
      return std::clamp<int64_t>(visible_keys(params, block.row_begin + i) - key_begin, 0, cols);
    };
    for (int64_t i = 0, g = 0; i < rows; i += C::kTileRows, ++g)
      group_keys[g] = visible(std::min<int64_t>(i + C::kTileRows, rows) - 1);
    const int64_t next_begin = key_begin + kRowTileKeys;
    const int64_t next_rows = std::clamp<int64_t>(key_end - next_begin, 0, kRowTileKeys);
    // The next tile's panels (head_dim floats per key) and V rows, as rows of head_dim floats.
    Avx2TileSteps<C>::prefetch_next(next_rows > 0 ? panels + next_begin * head_dim : nullptr, head_dim,
                                    next_rows > 0 ? v + next_begin * params.v_row_stride : nullptr,
                                    params.v_row_stride, next_rows, head_dim);
    Avx2RowSteps::scores(q_rows, ldq, rows, panels + key_begin * head_dim, group_keys, head_dim, s, lds);
    Avx2RowSteps::softmax(rows, group_keys, visible, s, lds, m, l, alpha);
    Avx2RowSteps::pv(s, lds, rows, group_keys, v + key_begin * params.v_row_stride, params.v_row_stride, alpha,
                     head_dim, o);
  }

  write_block_output(params, block, o, head_dim, m, l, out);
}

}  // namespace waveboost::cpu

#endif
