// fp32 flash attention forward on the tensor cores with fp32-level accuracy (backend "mma",
// float32): FlashAttention-2's algorithm (flash_mma.cuh) on mma.sync m16n8k8 tf32, every
// product in three parts ("3xTF32").
//
// tf32 keeps 11 significant bits, so one tf32 product errs by ~2^-11 (out ~1e-3 off). Each
// fp32 operand is split as x = hi + lo (mma::split_tf32), and
//
//   A B ~= Ahi Bhi + (Ahi Blo + Alo Bhi)       (Alo Blo, ~2^-22 A B, is dropped)
//
// on both products: S = Q K^T and O += P V.
//
// Accumulation order. The tensor core sums its products and C exactly but rounds the result
// toward zero (measured on V100/A100: Fasi et al. 2021, Ootomo & Yokota 2022), a biased error
// of up to one ulp of the accumulator per mma. What lands on one accumulator is kept short:
// - S: the main products (D / 8 mmas per score) and the corrections (2 D / 8) go to separate
//   accumulators, added once (round to nearest). Mixed into one accumulator, small terms first
//   or not, every correction would cost the score a truncation at the score's own magnitude:
//   3x the bias (estimated ~3e-6 of the logits at D = 128 instead of ~1e-6). The corrections'
//   own truncations sit 2^-11 lower and do not count.
// - O: accumulated across all keys on the tensor core, O would take 3 seqlen_k / 8 truncations
//   (a bias growing with seqlen_k, see below). Each key tile's P V starts from zero (main and
//   corrections apart, ~kBlockN / 8 truncations) and is merged as O = alpha O + PV in an FFMA,
//   which rounds to nearest; the O rescale of the online softmax rides on the same instruction.
// Error vs float64 on unit-normal data, from a bit-level emulation of this kernel (tf32
// operands, exact products, round-toward-zero sums): ~5e-7 relative (Frobenius) at 1-2k keys;
// accumulating O on the tensor core instead gives ~1e-5 already at 1k keys.
//
// Non-finite inputs propagate as in IEEE arithmetic: split_tf32 sends an infinity through hi
// alone (lo = 0, not inf - inf = NaN), and a score whose main product is infinite skips its
// corrections (scores). In P V, an infinite V element may come out NaN rather than inf
// (P's lo times inf, of either sign): non-finite either way.
//
// Fragments without shuffles. P V contracts over keys, and any fixed renumbering of a tile's
// keys, applied to P's columns and V's rows alike, leaves it unchanged. Thread (g, t) holds
// S[g][2t, 2t+1] and S[g+8][2t, 2t+1] of each n8 key tile; calling key 2t of the tile k = t
// and key 2t + 1 k = t + 4 makes (c0, c2, c1, c3) exactly tf32's A fragment (a0..a3), and the
// B fragment of V becomes rows 2t and 2t + 1. The head dim is renumbered the same way twice:
// in S (Q and K alike) a thread's k = t, t + 4 of two consecutive k8 slices are four adjacent
// dims (one 16 B load of Q or K feeds two slices); in O, output column n of n8 tile dt is dim
// 32 (dt / 4) + 16 (n % 2) + 4 (n / 2) + dt % 4, so a thread's V reads (dims of column g) and
// O writes (columns 2t, 2t+1) are both 16 B runs. All shared-memory reads are LDS.128.
//
// Shared memory: rows of kHeadDim floats in 16 B chunks, chunk c of row r stored at
// c ^ swizzle(r), swizzle(r) = the low three bits of r rotated (b2 b1 b0 -> b0 b2 b1).
// A 16 B access runs in phases of 8 lanes that must hit 8 distinct chunk columns (mod 8):
// - Q, K reads: a phase is rows 2i, 2i+1 x chunks 4s..4s+3; the swizzles of the two rows
//   differ in bit 2, separating the two halves.
// - V reads: rows 2t (or 2t + 1) for t = 0..3 x two chunks that differ in bit 2; the four
//   rows' swizzles differ in bits 0-1.
// - cp.async writes: 8 consecutive chunks of one row, permuted within their group of 8.
//
// Tiles: each of 4 warps owns 16 query rows (one m16 tile), kBlockM = 64. Live per thread:
// O (kHeadDim / 2 floats), S and its corrections (kBlockN / 2 each), P split (kBlockN), the
// per-tile PV accumulators (32), plus the fragments ptxas keeps in flight: ~240-255
// registers, two blocks (8 warps) per SM. Two m16 tiles per warp (the 16-bit path's choice)
// would need 128 registers for O alone at D = 128. Q stays in shared memory as fp32, scaled
// by softmax_scale * log2(e) once, and is split per use (kHeadDim / 2 splits per warp and
// tile; a hi/lo copy would save ~8% of the loop's instructions for 2x Q's shared-memory reads).
//
// The pipeline is the 16-bit path's (flash_mma.cuh): one K and one V buffer, V(j) in flight
// during S(j), K(j-1) during P V(j), key tiles last to first with a masked loop body only for
// tail / diagonal tiles. Block locator, mask, online softmax and LSE are the shared ones
// (core/sequence.cuh, core/mask.cuh, core/softmax.cuh, core/epilogue.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/epilogue.cuh"
#include "waveboost/cuda/core/fragments.cuh"
#include "waveboost/cuda/core/mask.cuh"
#include "waveboost/cuda/core/softmax.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the 3xTF32 mma.sync flash kernel (fp32 Q, K, V, O).
/// \tparam kHeadDim_ 64 or 128.
template <int kHeadDim_>
struct FlashMmaTf32Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = 1;  // m16 tiles per warp
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  // Keys per tile: the most that fit 255 registers without spilling in the loop (ptxas -v,
  // sm_90): 64 at D = 64 (~240 registers), 32 at D = 128 (O is twice as large). Two blocks
  // per SM (48 / 64 KB of shared memory each). Three blocks (168 registers) spill heavily at
  // these tiles; 32-key tiles at D = 64 fit three with a few spilled bytes but issue ~12%
  // more instructions per mma (per-tile Q splits, O merges and softmax counted twice).
  static constexpr int kBlockN = kHeadDim == 64 ? 64 : 32;
  static constexpr int kMinBlocksPerSm = 2;

  static constexpr int kKeyTiles = kBlockN / 8;    // n8 tiles of S = k8 slices of P V
  static constexpr int kDimPairs = kHeadDim / 16;  // pairs of k8 slices of Q K^T: one 16 B load each
  static constexpr int kDimTiles = kHeadDim / 8;   // n8 tiles of O
  static constexpr int kDimQuads = kHeadDim / 32;  // groups of 4 n8 tiles of O: one 16 B load of V each

  static constexpr int kRowBytes = kHeadDim * 4;
  static constexpr int kChunksPerRow = kHeadDim / 4;  // 16 B chunks
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;

  static constexpr int kQTileBytes = kBlockM * kRowBytes;
  static constexpr int kKVTileBytes = kBlockN * kRowBytes;
  static constexpr int kSmemBytes = kQTileBytes + 2 * kKVTileBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  // The swizzle has period 8 rows: a copy pass of 8 rows keeps each thread's pattern, one of
  // 4 rows alternates between two (load_tile).
  static_assert(kRowsPerCopyPass == 4 || kRowsPerCopyPass == 8);
  static_assert(kBlockM % kRowsPerCopyPass == 0 && kBlockN % kRowsPerCopyPass == 0);
  static_assert(kQTileBytes % 128 == 0 && kKVTileBytes % 128 == 0, "tiles on 128 B boundaries");

  using ScoreFragments = MmaFragments<kMTiles, kKeyTiles>;  // S and P (fp32), per warp
  using OutFragments = MmaFragments<kMTiles, kDimTiles>;    // O, per warp (columns renumbered)
};

namespace flash_mma_tf32 {

// ----------------------------------------------------------------------------
// Shared-memory layout
// ----------------------------------------------------------------------------

__device__ __forceinline__ int chunk_swizzle(int row) { return ((row & 1) << 2) | ((row >> 1) & 3); }

// Byte offset of 16 B chunk `chunk` of row `row` within a tile.
template <typename Traits>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * Traits::kRowBytes + 16 * (chunk ^ chunk_swizzle(row));
}

__device__ __forceinline__ float4 load_16B(const unsigned char* smem, uint32_t offset) {
  return *reinterpret_cast<const float4*>(smem + offset);
}

// Per-lane byte offsets of the fragments (tile base included); every load adds a
// compile-time immediate.
//   Q, K: row `row`, chunk 4 s + t of dim pair s. With swizzle(row) = 4 b + c, the physical
//   chunk is 4 (s ^ b) + (t ^ c) = 8 (s / 2) + 4 ((s % 2) ^ b) + (t ^ c): offset[s % 2] + 128 (s / 2).
//   V: rows 2t (offset[0]) and 2t + 1 (offset[1]) of key slice 0, logical chunk
//   4 (g % 2) + g / 2 + 8 u of dim quad u (columns g of its n8 tiles); swizzle(2t) = t and
//   swizzle(2t + 1) = 4 + t, so the physical chunk is 8 u + 4 ((g % 2) ^ (row % 2)) + ((g / 2) ^ t):
//   offset[row % 2] + 128 u.
template <typename Traits>
__device__ __forceinline__ void pair_offsets(uint32_t (&offset)[2], uint32_t tile, int row, int t) {
  const int b = chunk_swizzle(row) >> 2;
  const int c = chunk_swizzle(row) & 3;
#pragma unroll
  for (int parity = 0; parity < 2; ++parity) {
    offset[parity] = tile + static_cast<uint32_t>(row * Traits::kRowBytes + 64 * (parity ^ b) + 16 * (t ^ c));
  }
}

template <typename Traits>
__device__ __forceinline__ void value_offsets(uint32_t (&offset)[2], uint32_t tile, int g, int t) {
#pragma unroll
  for (int parity = 0; parity < 2; ++parity) {
    offset[parity] = tile + static_cast<uint32_t>((2 * t + parity) * Traits::kRowBytes +
                                                  64 * ((g % 2) ^ parity) + 16 * ((g / 2) ^ t));
  }
}

// ----------------------------------------------------------------------------
// Tiles: global -> shared
// ----------------------------------------------------------------------------

// cp.async of rows [0, kRows) (row_stride floats apart) into a swizzled tile at byte offset
// `tile` of the shared window. kGuarded: rows >= valid_rows are zero-filled (a NaN-free zero,
// since P = 0 there still multiplies V).
template <typename Traits, int kRows, bool kGuarded>
__device__ __forceinline__ void load_tile(uint32_t tile, const float* src, int64_t row_stride, int64_t valid_rows) {
  constexpr int kPass = Traits::kRowsPerCopyPass;
  const int tid = threadIdx.x;
  const int chunk = tid % Traits::kChunksPerRow;
  const int row = tid / Traits::kChunksPerRow;
  // Destination of pass i: dst[i % 2] + i * kPass rows (passes of 8 rows: dst[1] == dst[0]).
  const uint32_t dst[2] = {tile + swizzled<Traits>(row, chunk),
                           tile + swizzled<Traits>(row + kPass % 8, chunk) - (kPass % 8) * Traits::kRowBytes};
  const float* src_row = src + row * row_stride + chunk * 4;
  const int64_t pass_stride = kPass * row_stride;
#pragma unroll
  for (int i = 0; i < kRows / kPass; ++i) {
    const uint32_t dst_i = dst[i % 2] + i * kPass * Traits::kRowBytes;
    if constexpr (kGuarded) {
      const bool valid = row + i * kPass < valid_rows;
      mma::copy_async_16B(dst_i, valid ? src_row + i * pass_stride : src, valid);
    } else {
      mma::copy_async_16B(dst_i, src_row + i * pass_stride, true);
    }
  }
}

// ----------------------------------------------------------------------------
// The two products
// ----------------------------------------------------------------------------

// One k8 slice of an A operand from four fp32 values in a0..a3 order, split into hi and lo.
__device__ __forceinline__ void split_fragment(uint32_t (&hi)[4], uint32_t (&lo)[4], float a0, float a1, float a2,
                                               float a3) {
  const float a[4] = {a0, a1, a2, a3};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const mma::Tf32Pair x = mma::split_tf32(a[i]);
    hi[i] = x.hi;
    lo[i] = x.lo;
  }
}

// d += A B in three tf32 products: Ahi Bhi into `acc`, the corrections into `corr`.
__device__ __forceinline__ void mma_3xtf32(float (&acc)[4], float (&corr)[4], const uint32_t (&a_hi)[4],
                                           const uint32_t (&a_lo)[4], float b0, float b1) {
  const mma::Tf32Pair x0 = mma::split_tf32(b0);
  const mma::Tf32Pair x1 = mma::split_tf32(b1);
  mma::mma_16x8x8_tf32(corr, a_lo, x0.hi, x1.hi);
  mma::mma_16x8x8_tf32(corr, a_hi, x0.lo, x1.lo);
  mma::mma_16x8x8_tf32(acc, a_hi, x0.hi, x1.hi);
}

// acc (+ corr, added once) = A B^T over every dim, for this warp's 16 rows of A (a_rows: byte
// offsets of rows g, pair reads; row g + 8 is 8 rows on) and kTiles groups of 8 rows of B (b_rows:
// row g of the first group). Group j holds B rows 8 j + 2t, 8 j + 2t + 1 in columns 2t, 2t + 1, as
// in the 16-bit path. S = Q K^T here; the backward's S^T = K Q^T and dP^T = V dO^T.
template <int kTiles, int kDimPairs, int kRowBytes>
__device__ __forceinline__ void row_products(float (&acc)[kTiles][4], float (&corr)[kTiles][4],
                                             const unsigned char* smem, const uint32_t (&a_rows)[2],
                                             const uint32_t (&b_rows)[2]) {
  zero_fill(acc);
  zero_fill(corr);
#pragma unroll
  for (int pair = 0; pair < kDimPairs; ++pair) {
    const uint32_t a_at = a_rows[pair % 2] + 128 * (pair / 2);
    const float4 top = load_16B(smem, a_at);                     // row g
    const float4 bottom = load_16B(smem, a_at + 8 * kRowBytes);  // row g + 8
    // Slice 2 pair takes dims 4t, 4t + 1 of the pair as k = t, t + 4; slice 2 pair + 1 the next two.
    uint32_t a_hi[2][4], a_lo[2][4];
    split_fragment(a_hi[0], a_lo[0], top.x, bottom.x, top.y, bottom.y);
    split_fragment(a_hi[1], a_lo[1], top.z, bottom.z, top.w, bottom.w);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float4 b = load_16B(smem, b_rows[pair % 2] + 128 * (pair / 2) + j * 8 * kRowBytes);
      mma_3xtf32(acc[j], corr[j], a_hi[0], a_lo[0], b.x, b.y);
      mma_3xtf32(acc[j], corr[j], a_hi[1], a_lo[1], b.z, b.w);
    }
  }
  // An infinite A or B element makes the main product infinite (the IEEE score), while the
  // corrections pick up inf * lo of the other operand, whose sign is arbitrary: adding them
  // could turn a -inf score, which softmax sends to 0, into NaN.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!isinf(acc[j][e])) acc[j][e] += corr[j][e];
    }
  }
}

// S = Q K^T (Q pre-scaled: S is in log2 units) for the warp's 16 rows and the tile's keys.
template <typename Traits>
__device__ __forceinline__ void scores(float (&s)[1][Traits::kKeyTiles][4], const unsigned char* smem,
                                       const uint32_t (&q_offset)[2], const uint32_t (&k_offset)[2]) {
  float corr[Traits::kKeyTiles][4];
  row_products<Traits::kKeyTiles, Traits::kDimPairs, Traits::kRowBytes>(s[0], corr, smem, q_offset, k_offset);
}

// O = alpha O + P V(tile), P in the S accumulator layout (probabilities, fp32).
template <typename Traits>
__device__ __forceinline__ void accumulate_pv(float (&o)[1][Traits::kDimTiles][4], const float (&prob)[1][Traits::kKeyTiles][4],
                                              const float (&alpha)[2], const unsigned char* smem,
                                              const uint32_t (&v_offset)[2]) {
  // Key slice ks = key tile ks renumbered: (c0, c2, c1, c3) is the A fragment.
  uint32_t p_hi[Traits::kKeyTiles][4], p_lo[Traits::kKeyTiles][4];
#pragma unroll
  for (int ks = 0; ks < Traits::kKeyTiles; ++ks) {
    split_fragment(p_hi[ks], p_lo[ks], prob[0][ks][0], prob[0][ks][2], prob[0][ks][1], prob[0][ks][3]);
  }
#pragma unroll
  for (int quad = 0; quad < Traits::kDimQuads; ++quad) {
    // This tile's contribution to four n8 tiles of O: 8 independent mma chains.
    float pv[4][4], corr[4][4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pv[w][e] = corr[w][e] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < Traits::kKeyTiles; ++ks) {
      const uint32_t at = 128 * quad + ks * 8 * Traits::kRowBytes;
      const float4 v_even = load_16B(smem, v_offset[0] + at);  // key 8 ks + 2t: k = t
      const float4 v_odd = load_16B(smem, v_offset[1] + at);   // key 8 ks + 2t + 1: k = t + 4
      mma_3xtf32(pv[0], corr[0], p_hi[ks], p_lo[ks], v_even.x, v_odd.x);
      mma_3xtf32(pv[1], corr[1], p_hi[ks], p_lo[ks], v_even.y, v_odd.y);
      mma_3xtf32(pv[2], corr[2], p_hi[ks], p_lo[ks], v_even.z, v_odd.z);
      mma_3xtf32(pv[3], corr[3], p_hi[ks], p_lo[ks], v_even.w, v_odd.w);
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[0][4 * quad + w][e] = fmaf(o[0][4 * quad + w][e], alpha[e / 2], pv[w][e] + corr[w][e]);
      }
    }
  }
}

// ----------------------------------------------------------------------------
// One block: kBlockM query rows of one (batch, head)
// ----------------------------------------------------------------------------

template <typename Traits, typename Mask>
__device__ __forceinline__ void attend_block(const AttentionParams& p) {
  using Softmax = OnlineSoftmax<typename Traits::ScoreFragments>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  extern __shared__ __align__(128) unsigned char smem[];
  // Byte offsets in the shared window: Q, then K, then V.
  constexpr uint32_t kQTile = 0;
  constexpr uint32_t kKTile = Traits::kQTileBytes;
  constexpr uint32_t kVTile = kKTile + Traits::kKVTileBytes;
  const uint32_t smem_base = mma::shared_address(smem);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // fragment row group
  const int t = lane % 4;  // thread in the quad

  FlashBlock blk;
  if (!locate_flash_block<Mask>(p, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const Mask mask = Mask::of(blk);
  const float* q = blk.q_rows<float>(p);
  const float* k = blk.k_rows<float>(p);
  const float* v = blk.v_rows<float>(p);

  // Rows of this thread's accumulators: warp_m0 + g + 8 r.
  const int64_t warp_m0 = blk.m0 + warp * Traits::kRowsPerWarp;
  float o[1][Traits::kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < Traits::kDimTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][dt][e] = 0.f;
  }
  Softmax softmax;
  softmax.init();

  if (blk.n_tiles > 0) {  // otherwise every row sees no key: the epilogue writes zeros
    load_tile<Traits, kBlockM, true>(smem_base + kQTile, q, p.q_row_stride, blk.rows);
    mma::commit_copies();
    const int64_t last_n0 = int64_t{blk.n_tiles - 1} * kBlockN;
    load_tile<Traits, kBlockN, true>(smem_base + kKTile, blk.k_tile(p, k, last_n0), p.k_row_stride,
                                     blk.seqlen_k - last_n0);
    mma::commit_copies();

    // Q *= softmax_scale * log2(e), once: scores come out in log2 units, of either sign of the
    // scale (the max is taken after scaling). Each warp scales its own rows, which arrived
    // through other warps' copies.
    const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
    mma::wait_copies<1>();
    __syncthreads();
    float4* q_rows = reinterpret_cast<float4*>(smem + kQTile + warp * Traits::kRowsPerWarp * Traits::kRowBytes);
#pragma unroll
    for (int i = 0; i < Traits::kRowsPerWarp * Traits::kChunksPerRow / 32; ++i) {
      float4 x = q_rows[32 * i + lane];
      x.x *= scale_log2, x.y *= scale_log2, x.z *= scale_log2, x.w *= scale_log2;
      q_rows[32 * i + lane] = x;
    }
    __syncwarp();

    uint32_t q_offset[2], k_offset[2], v_offset[2];
    pair_offsets<Traits>(q_offset, kQTile, warp * Traits::kRowsPerWarp + g, t);
    pair_offsets<Traits>(k_offset, kKTile, g, t);
    value_offsets<Traits>(v_offset, kVTile, g, t);

    // One key tile; kMasked (a std::bool_constant) selects the tail / diagonal variant.
    const auto attend_key_tile = [&](const int j, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const int64_t n0 = static_cast<int64_t>(j) * kBlockN;
      mma::wait_copies<0>();
      __syncthreads();  // K(j) visible to every warp; every warp is done reading V(j+1)
      if (kMasked && mask.partial_tile(n0, kBlockN)) {
        load_tile<Traits, kBlockN, true>(smem_base + kVTile, blk.v_tile(p, v, n0), p.v_row_stride, blk.seqlen_k - n0);
      } else {
        load_tile<Traits, kBlockN, false>(smem_base + kVTile, blk.v_tile(p, v, n0), p.v_row_stride, kBlockN);
      }
      mma::commit_copies();

      float s[1][Traits::kKeyTiles][4];
      scores<Traits>(s, smem, q_offset, k_offset);
      if constexpr (kMasked) mask.template mask_tile<typename Traits::ScoreFragments, kBlockN>(s, warp_m0 + g, n0, t);
      // The scores are already scaled (Q was), so the max's exponent is exactly 0; O's
      // rescale rides on accumulate_pv's FFMA, every tile.
      float alpha[Softmax::kRows];
      softmax.template step<true>(s, alpha, scale_log2);

      mma::wait_copies<0>();
      __syncthreads();  // V(j) visible to every warp; every warp is done reading K(j)
      if (j > 0) {
        load_tile<Traits, kBlockN, false>(smem_base + kKTile, blk.k_tile(p, k, n0 - kBlockN), p.k_row_stride,
                                          kBlockN);
        mma::commit_copies();
      }
      accumulate_pv<Traits>(o, s, alpha, smem, v_offset);
    };

    int j = blk.n_tiles - 1;
    for (; j >= blk.n_unmasked; --j) attend_key_tile(j, std::true_type{});
    for (; j >= 0; --j) attend_key_tile(j, std::false_type{});
  }

  float inv_sum[Softmax::kRows];
  softmax.finalize(inv_sum);
  write_lse(p, blk, warp_m0 + g, softmax, t);

  // O / l. Thread (g, t) holds dims 32 u + 4t + {0..3} (columns 2t of n8 tiles 4u..4u+3) and
  // 32 u + 16 + 4t + {0..3} (columns 2t + 1) of rows g and g + 8: 16 B stores straight to
  // global memory, each quad writing 64 contiguous bytes of a row (whole 32 B sectors).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = warp_m0 + 8 * half + g;
    if (row >= blk.seqlen_q) continue;
    float* out_row = blk.o_row<float>(p, row) + 4 * t;
#pragma unroll
    for (int quad = 0; quad < Traits::kDimQuads; ++quad) {
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        const int e = 2 * half + column;
        const float x = inv_sum[half];
        *reinterpret_cast<float4*>(out_row + 32 * quad + 16 * column) =
            make_float4(o[0][4 * quad][e] * x, o[0][4 * quad + 1][e] * x, o[0][4 * quad + 2][e] * x,
                        o[0][4 * quad + 3][e] * x);
      }
    }
  }
}

}  // namespace flash_mma_tf32

/// \brief fp32 flash attention forward on tf32 mma.sync (3xTF32); grid (query blocks,
/// batch*heads folded over y and z). Two blocks per SM is the design point.
template <int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(FlashMmaTf32Traits<kHeadDim>::kThreads, FlashMmaTf32Traits<kHeadDim>::kMinBlocksPerSm)
    flash_mma_tf32_kernel(const __grid_constant__ AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and tf32 mma need sm_80; mma_can_implement refuses older devices
#else
  flash_mma_tf32::attend_block<FlashMmaTf32Traits<kHeadDim>, CausalMask<kCausal>>(p);
#endif
}

// Shared memory per block for a head dim, 0 if unsupported.
inline int flash_mma_tf32_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 64: return FlashMmaTf32Traits<64>::kSmemBytes;
    case 128: return FlashMmaTf32Traits<128>::kSmemBytes;
    default: return 0;
  }
}

template <int kHeadDim, bool kCausal>
Status launch_flash_mma_tf32_kernel(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashMmaTf32Traits<kHeadDim>;
  if (Status s = folded_grid_check(p, Traits::kBlockM, "mma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = flash_mma_tf32_kernel<kHeadDim, kCausal>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cuda_status(cudaGetLastError(), "flash_mma_tf32_kernel launch");
}

/// \brief Launches the fp32 (3xTF32) mma.sync forward on `stream` (params.device_id current, batch * heads *
/// seqlen_q > 0, as attention_forward guarantees).
template <int kHeadDim>
Status launch_flash_mma_tf32(const AttentionParams& p, cudaStream_t stream) {
  return p.is_causal ? launch_flash_mma_tf32_kernel<kHeadDim, true>(p, stream)
                     : launch_flash_mma_tf32_kernel<kHeadDim, false>(p, stream);
}

}  // namespace waveboost::cuda
