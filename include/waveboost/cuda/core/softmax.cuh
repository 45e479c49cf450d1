// The online softmax of the tensor-core flash paths, on the accumulators in registers, for
// any layout of core/fragments.cuh (mma.sync, wgmma; 16-bit and tf32 products alike).
//
// Per key tile, with c = softmax_scale * log2(e) and the running row max m in scaled log2 units:
//   m_new = max(m, c * rowmax(S))     a row spans one quad: two shuffles
//   P     = exp2(c * S - m_new)       one FFMA + ex2 per score, in place over S
//   l     = exp2(m - m_new) * l + rowsum(P)
//   alpha = exp2(m - m_new)           the caller rescales O by it (rescale, or its own FFMA)
// l is this thread's partial sum over its columns; the quad's partials meet once, in finalize.
//
// The exponent. m = round(c max(S)), and one FFMA gives round(c s - m) from the exact
// c s - m, so the largest score's exponent is the residual c max - m, |.| <= ulp(m) / 2.
// While |m| < 2^24 that is <= 1/2: P stays in [2^-1/2, 2^1/2] at the max, and the common
// factor cancels in O / l and in the LSE (which uses the same m). Beyond (scores of fp16
// inputs near 65504 reach 1e10) it would overflow P or flush it to 0. A warp with such a row
// first rounds t = c s for every score it holds and exponentiates t - m with the same FFMA
// (factor 1): rounding is monotone, so m is the largest t, the max's exponent is exactly 0
// and t - m is exact near it; the extra rounding of t is about that of the fp32 score
// itself. The common case pays one compare per row and one vote per tile (measured: +6 to +8
// instructions per key tile, against +1 per score for a separate subtract and multiply).
// Scores that arrive already scaled (kPrescaled: the tf32 path scales Q) have m equal to one
// of them, so the max's exponent is exactly 0 however large they are.
#pragma once

#include <cmath>
#include <cstdint>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/constants.cuh"
#include "waveboost/cuda/core/fragments.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

/// \brief c = |softmax_scale| * log2(e), at least the smallest normal float. A negative scale
/// is handled by negating Q (softmax(c S) with c < 0 is softmax(|c| (-Q) K^T)): the loop then
/// only ever sees a positive scale, which commutes with the row max.
__device__ __forceinline__ float positive_scale_log2(const AttentionParams& p) {
  return fmaxf(static_cast<float>(fabs(p.softmax_scale) * kLog2e), kSmallestNormalFloat);
}

/// \brief Running row max and sum of one thread's rows, and the steps that update them.
/// \tparam Fragments the score accumulator layout (core/fragments.cuh).
template <typename Fragments>
struct OnlineSoftmax {
  static constexpr int kRows = Fragments::kRows;
  using Scores = typename Fragments::Array;

  float row_max[kRows];  // scaled log2 units; -inf while the row has seen no key
  float row_sum[kRows];  // this thread's partial over its columns

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  /// \brief Folds a tile of scores into the statistics and hands each pair of unnormalized
  /// probabilities (columns 2 t, 2 t + 1 of group nt in row r) to emit(r, nt, p0, p1);
  /// alpha[r] = exp2(m_old - m_new) is what O still needs. Returns whether this thread raised
  /// a row max (else every alpha is exactly 1).
  /// \tparam kPrescaled scores are already c S (scale_log2 is then unused); else scale_log2 = c > 0.
  template <bool kPrescaled, typename Emit>
  __device__ __forceinline__ bool step(Scores& s, float (&alpha)[kRows], float scale_log2, Emit emit) {
    bool raised = false;
    bool huge = false;
    float neg_reference[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float tile_max = Fragments::at(s, r, 0, 0);
#pragma unroll
      for (int nt = 0; nt < Fragments::kNTiles; ++nt) {
        tile_max = fmaxf(tile_max, fmaxf(Fragments::at(s, r, nt, 0), Fragments::at(s, r, nt, 1)));
      }
      // scale_log2 > 0, so scaling commutes with the max; -inf stays -inf.
      const float row_tile_max = kPrescaled ? mma::quad_max(tile_max) : mma::quad_max(tile_max) * scale_log2;
      const float new_max = fmaxf(row_max[r], row_tile_max);
      // A row that has seen only masked keys keeps max -inf; subtracting 0 instead keeps
      // exp2(-inf - ...) at 0 rather than NaN.
      const float reference = new_max == -INFINITY ? 0.f : new_max;
      alpha[r] = mma::exp2(row_max[r] - reference);
      raised |= new_max != row_max[r];
      if constexpr (!kPrescaled) huge |= fabsf(reference) >= kExactExponentFrom;  // +inf (an infinite score) too
      row_max[r] = new_max;
      neg_reference[r] = -reference;
    }
    float factor = kPrescaled ? 1.f : scale_log2;
    if constexpr (!kPrescaled) {
      if (__any_sync(kFullWarpMask, huge)) {
        // __fmul_rn is never contracted into the FFMA below (which would restore the residual).
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int nt = 0; nt < Fragments::kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) Fragments::at(s, r, nt, e) = __fmul_rn(Fragments::at(s, r, nt, e), scale_log2);
          }
        }
        factor = 1.f;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < Fragments::kNTiles; ++nt) {
        const float p0 = mma::exp2(fmaf(Fragments::at(s, r, nt, 0), factor, neg_reference[r]));
        const float p1 = mma::exp2(fmaf(Fragments::at(s, r, nt, 1), factor, neg_reference[r]));
        sum += p0 + p1;
        emit(r, nt, p0, p1);
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
    return raised;
  }

  /// \brief step, leaving P in place of the scores.
  template <bool kPrescaled>
  __device__ __forceinline__ bool step(Scores& s, float (&alpha)[kRows], float scale_log2) {
    return step<kPrescaled>(s, alpha, scale_log2, [&](int r, int nt, float p0, float p1) {
      Fragments::at(s, r, nt, 0) = p0;
      Fragments::at(s, r, nt, 1) = p1;
    });
  }

  /// \brief step, packing P straight into 16-bit A fragments of the P V product (the scores'
  /// registers free up as the probabilities are packed).
  template <typename Element>
  __device__ __forceinline__ bool step_packed(Scores& s, float (&alpha)[kRows], float scale_log2,
                                              typename Fragments::Operand& p) {
    return step<false>(s, alpha, scale_log2, [&](int r, int nt, float p0, float p1) {
      Fragments::operand(p, r, nt) = pack_pair<Element>(p0, p1);
    });
  }

  /// \brief O *= alpha, row by row, for O in the layout OFragments (same rows as the scores).
  template <typename OFragments>
  __device__ __forceinline__ static void rescale(typename OFragments::Array& o, const float (&alpha)[kRows]) {
    static_assert(OFragments::kRows == kRows, "O and S share their rows");
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int dt = 0; dt < OFragments::kNTiles; ++dt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) OFragments::at(o, r, dt, e) *= alpha[r];
      }
    }
  }

  /// \brief P (in the score registers) packed to 16-bit A fragments of the P V product.
  template <typename Element>
  __device__ __forceinline__ static void pack(const Scores& s, typename Fragments::Operand& p) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int nt = 0; nt < Fragments::kNTiles; ++nt) {
        Fragments::operand(p, r, nt) = pack_pair<Element>(Fragments::at(s, r, nt, 0), Fragments::at(s, r, nt, 1));
      }
    }
  }

  /// \brief Ends the row: adds up the quad's partial sums (row_sum then holds the row's l)
  /// and gives the normalizer 1 / l. A row that saw no key (or only -inf scores) has l = 0:
  /// O = 0 stays 0 and its LSE is -inf. A NaN l (NaN or +inf scores) makes O and LSE NaN.
  __device__ __forceinline__ void finalize(float (&inv_sum)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_sum[r] = mma::quad_sum(row_sum[r]);
      inv_sum[r] = row_sum[r] == 0.f ? 0.f : 1.f / row_sum[r];
    }
  }

  /// \brief The natural-log LSE of row r, after finalize.
  __device__ __forceinline__ float lse(int r) const {
    return row_sum[r] == 0.f ? -INFINITY : row_max[r] * kLn2 + logf(row_sum[r]);
  }
};

}  // namespace waveboost::cuda
