// Tensor-core flash attention forward on raw mma.sync + ldmatrix (backend "mma").
//
// FlashAttention-2's forward algorithm. One block owns kBlockM = 128 query rows of one
// (batch, head); each of its 4 warps owns 32 of them (two m16 tiles) and walks the key
// tiles the block can see, last to first, with the online softmax:
//
//   S = Q K^T                          mma.sync m16n8k16, fp32 accumulators in registers
//   m_new = max(m, c * rowmax(S))      c = softmax_scale * log2(e); a row spans one quad
//   P = exp2(c * S - m_new)            one FFMA + ex2 per score, packed to 16 bits in registers
//                                      (huge scores: see softmax_step)
//   l = exp2(m - m_new) * l + rowsum(P)
//   O = exp2(m - m_new) * O + P V      P's registers are the A operand as they stand
//
// Neither S nor P ever touches shared memory (see mma_primitives.cuh for why the fragment
// layouts line up). Q, K and V tiles live in shared memory with their 16 B chunks XOR-swizzled
// by row (chunk ^ (row % 8)), so both the cp.async writes and the ldmatrix reads of eight
// rows hit eight distinct 16 B bank groups.
//
// Pipeline (one K and one V buffer, as FlashAttention-2): V(j) is fetched while S(j) and its
// softmax run, K(j-1) while P V(j) runs. Each half has ~1.5k cycles of tensor work per warp
// to hide an L2 round trip, and the single buffers keep the block at 64 KB (D = 128), so two
// blocks (8 warps) share an SM and cover each other's barriers.
//
// Tiles are visited last to first so that the only tiles needing a mask (the sequence tail
// and, when causal, the ones crossing the diagonal) come first and all the rest run a loop
// body without any mask arithmetic.
#pragma once

#include <cstdint>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the mma.sync flash kernel.
/// \tparam Element_  __half or __nv_bfloat16 (Q, K, V, O, P); accumulation is fp32.
/// \tparam kHeadDim_ 64 or 128.
template <typename Element_, int kHeadDim_>
struct FlashMmaTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // 4 warps x 32 rows: each K and V fragment loaded from shared memory feeds two m16 tiles,
  // halving shared-memory reads per flop against 16 rows per warp (FlashAttention-2's choice).
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = 2;  // m16 tiles per warp
  static constexpr int kRowsPerWarp = kMTiles * 16;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  // Keys per tile. Registers per thread hold S (kRowsPerWarp x kBlockN / 32 floats) and O
  // (kRowsPerWarp x kHeadDim / 32 floats): 64 + 128 at D = 128, 128 + 64 at D = 64, the most
  // that stays under 255 registers without spilling. Longer key tiles halve the per-tile
  // overheads (barriers, row-max shuffles, the O rescale) at D = 64.
  static constexpr int kBlockN = kHeadDim == 64 ? 128 : 64;

  static constexpr int kKeyTiles = kBlockN / 8;     // n8 tiles of S
  static constexpr int kKeySlices = kBlockN / 16;   // k16 slices of P V
  static constexpr int kDimTiles = kHeadDim / 8;    // n8 tiles of O
  static constexpr int kDimSlices = kHeadDim / 16;  // k16 slices of Q K^T

  // 16 B chunks: the unit of cp.async, ldmatrix rows and the swizzle.
  static constexpr int kChunk = 16 / int(sizeof(Element));
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;

  static constexpr int kQTileBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemBytes = kQTileBytes + 2 * kKVTileBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(sizeof(Element) == 2, "16-bit elements");
  // The swizzle permutes the low 3 bits of the chunk index within rows of >= 8 chunks, and
  // a copy pass covers a multiple of 8 rows, so each thread's swizzle is the same every pass.
  static_assert(kChunksPerRow >= 8 && kRowsPerCopyPass % 8 == 0);
  static_assert(kBlockM % kRowsPerCopyPass == 0 && kBlockN % kRowsPerCopyPass == 0);
  static_assert(kRowsPerWarp * kChunksPerRow % 32 == 0, "the epilogue stores whole warps of chunks");
};

namespace flash_mma {

// Element offset of 16 B chunk `chunk` of row `row` in a swizzled tile with kHeadDim columns.
template <typename Traits>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * Traits::kHeadDim + ((chunk ^ (row % 8)) * Traits::kChunk);
}

// Per-lane ldmatrix addressing. A warp's x4 load covers 16 rows x 2 chunks; the lane
// addresses row `row0 + row` and chunk `2 * pair + high`. Each 8-row group starts at a
// multiple of 8 rows, so the lane's swizzle is always lane % 8, and with 128 B-aligned rows
// the physical chunk of pair `pair` is (2 * (pair % 4)) ^ y, y = high ^ (lane % 8), in
// address bits 4..6, plus 8 * (pair / 4). One register per operand (tile + row + 16 y);
// each load XORs in the compile-time 32 * (pair % 4) and adds the rest as an immediate
// (the immediate has zero bits 0..6, so adding it commutes with that XOR).
struct LaneAddress {
  uint32_t base;

  template <typename Traits>
  __device__ __forceinline__ static LaneAddress make(uint32_t tile, int row, int high, int lane) {
    return {tile + static_cast<uint32_t>(row * Traits::kHeadDim * 2 + ((high ^ (lane % 8)) * 16))};
  }
  // Shared address of chunk pair `pair` for the 16-row group starting `row0` rows down.
  template <typename Traits>
  __device__ __forceinline__ uint32_t at(int row0, int pair) const {
    return (base ^ static_cast<uint32_t>(32 * (pair % 4))) +
           static_cast<uint32_t>((pair / 4) * 128 + row0 * Traits::kHeadDim * 2);
  }
};

// ----------------------------------------------------------------------------
// Tiles: global -> shared
// ----------------------------------------------------------------------------

// Issues cp.async for rows [0, kRows) of a tile whose rows are row_stride elements apart.
// kGuarded: rows >= valid_rows are zero-filled, so nothing from beyond the sequence enters a
// product. Only the first tile visited (the last of the sequence) can be partial; every
// other tile takes the unguarded form, which spends no registers or compares on the bound.
template <typename Traits, int kRows, bool kGuarded>
__device__ __forceinline__ void load_tile(uint32_t tile, const typename Traits::Element* src, int64_t row_stride,
                                          int64_t valid_rows) {
  const int tid = threadIdx.x;
  const int chunk = tid % Traits::kChunksPerRow;
  const int row = tid / Traits::kChunksPerRow;
  const uint32_t dst = tile + 2 * swizzled<Traits>(row, chunk);
  const typename Traits::Element* src_row = src + row * row_stride + chunk * Traits::kChunk;
  const int64_t pass_stride = Traits::kRowsPerCopyPass * row_stride;
#pragma unroll
  for (int i = 0; i < kRows / Traits::kRowsPerCopyPass; ++i) {
    const uint32_t dst_i = dst + i * Traits::kRowsPerCopyPass * Traits::kHeadDim * 2;
    if constexpr (kGuarded) {
      const bool valid = row + i * Traits::kRowsPerCopyPass < valid_rows;
      mma::copy_async_16B(dst_i, valid ? src_row + i * pass_stride : src, valid);
    } else {
      mma::copy_async_16B(dst_i, src_row + i * pass_stride, true);
    }
  }
}

// ----------------------------------------------------------------------------
// The two products
// ----------------------------------------------------------------------------

// S = Q K^T for the warp's 32 rows and the tile's kBlockN keys.
template <typename Traits>
__device__ __forceinline__ void scores(float (&s)[Traits::kMTiles][Traits::kKeyTiles][4], LaneAddress q_lane,
                                       LaneAddress k_lane) {
  using Element = typename Traits::Element;
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Traits::kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
    }
  }
#pragma unroll
  for (int kk = 0; kk < Traits::kDimSlices; ++kk) {
    uint32_t q[Traits::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) mma::load_matrix_x4(q[mt], q_lane.at<Traits>(16 * mt, kk));
#pragma unroll
    for (int np = 0; np < Traits::kKeyTiles / 2; ++np) {
      // k[0], k[1]: B of key tile 2 np; k[2], k[3]: B of key tile 2 np + 1.
      uint32_t k[4];
      mma::load_matrix_x4(k, k_lane.at<Traits>(16 * np, kk));
#pragma unroll
      for (int mt = 0; mt < Traits::kMTiles; ++mt) {
        mma::mma_16x8x16<Element>(s[mt][2 * np], q[mt], k[0], k[1]);
        mma::mma_16x8x16<Element>(s[mt][2 * np + 1], q[mt], k[2], k[3]);
      }
    }
  }
}

// O += P V, P in A-fragment registers: p[mt][slice] covers keys 16 slice .. 16 slice + 15.
template <typename Traits>
__device__ __forceinline__ void accumulate_pv(float (&o)[Traits::kMTiles][Traits::kDimTiles][4],
                                              const uint32_t (&p)[Traits::kMTiles][Traits::kKeySlices][4],
                                              LaneAddress v_lane) {
  using Element = typename Traits::Element;
#pragma unroll
  for (int ks = 0; ks < Traits::kKeySlices; ++ks) {
#pragma unroll
    for (int dp = 0; dp < Traits::kDimTiles / 2; ++dp) {
      // v[0], v[1]: B of dim tile 2 dp; v[2], v[3]: B of dim tile 2 dp + 1.
      uint32_t v[4];
      mma::load_matrix_x4_trans(v, v_lane.at<Traits>(16 * ks, dp));
#pragma unroll
      for (int mt = 0; mt < Traits::kMTiles; ++mt) {
        mma::mma_16x8x16<Element>(o[mt][2 * dp], p[mt][ks], v[0], v[1]);
        mma::mma_16x8x16<Element>(o[mt][2 * dp + 1], p[mt][ks], v[2], v[3]);
      }
    }
  }
}

// ----------------------------------------------------------------------------
// Online softmax on the accumulators
// ----------------------------------------------------------------------------
// Thread (g, t) of a warp holds, for m16 tile mt, rows g (half 0: elements 0, 1 of each n8
// tile) and g + 8 (half 1: elements 2, 3). A row is spread over the 4 threads of a quad.

// Scores of keys at or beyond the row's visible limit become -inf. `row_limit[mt][half]` is
// the number of this tile's keys the row sees (0..kBlockN).
template <typename Traits>
__device__ __forceinline__ void mask_scores(float (&s)[Traits::kMTiles][Traits::kKeyTiles][4],
                                            const int (&row_limit)[Traits::kMTiles][2], int t) {
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Traits::kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = nt * 8 + 2 * t + (e % 2);
        if (key >= row_limit[mt][e / 2]) s[mt][nt][e] = -INFINITY;
      }
    }
  }
}

// Folds the tile's scores into the running statistics and turns them into P (packed A
// fragments). row_max is in scaled log2 units; row_sum is this thread's partial sum over its
// columns (the quad's partials are added once, in the epilogue). Rescales O by
// exp2(m_old - m_new) unless no row of the warp raised its max (exp2(0) == 1 exactly).
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
template <typename Traits>
__device__ __forceinline__ void softmax_step(float (&s)[Traits::kMTiles][Traits::kKeyTiles][4],
                                             uint32_t (&p)[Traits::kMTiles][Traits::kKeySlices][4],
                                             float (&o)[Traits::kMTiles][Traits::kDimTiles][4],
                                             float (&row_max)[Traits::kMTiles][2], float (&row_sum)[Traits::kMTiles][2],
                                             float scale_log2) {
  using Element = typename Traits::Element;
  float alpha[Traits::kMTiles][2];
  float neg_reference[Traits::kMTiles][2];
  bool rescale = false;
  bool huge = false;
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = s[mt][0][2 * half];
#pragma unroll
      for (int nt = 0; nt < Traits::kKeyTiles; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
      // scale_log2 > 0, so scaling commutes with the max; -inf stays -inf.
      const float new_max = fmaxf(row_max[mt][half], mma::quad_max(tile_max) * scale_log2);
      // A row that has seen only masked keys keeps max -inf; subtracting 0 instead keeps
      // exp2(-inf - ...) at 0 rather than NaN.
      const float reference = new_max == -INFINITY ? 0.f : new_max;
      alpha[mt][half] = mma::exp2(row_max[mt][half] - reference);
      rescale |= new_max != row_max[mt][half];
      huge |= fabsf(reference) >= kExactExponentFrom;  // +inf (an infinite score) too
      row_max[mt][half] = new_max;
      neg_reference[mt][half] = -reference;
    }
  }
  float factor = scale_log2;
  if (__any_sync(0xffffffffu, huge)) {
    // __fmul_rn is never contracted into the FFMA below (which would restore the residual).
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Traits::kKeyTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = __fmul_rn(s[mt][nt][e], scale_log2);
      }
    }
    factor = 1.f;
  }
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < Traits::kKeyTiles; ++nt) {
        const float p0 = mma::exp2(fmaf(s[mt][nt][2 * half], factor, neg_reference[mt][half]));
        const float p1 = mma::exp2(fmaf(s[mt][nt][2 * half + 1], factor, neg_reference[mt][half]));
        sum += p0 + p1;
        // Key tile nt fills half (nt % 2) of slice nt / 2: registers a{0,1} for the first
        // 8 keys, a{2,3} for the next; a{0,2} are row g, a{1,3} row g + 8.
        p[mt][nt / 2][2 * (nt % 2) + half] = pack_pair<Element>(p0, p1);
      }
      row_sum[mt][half] = row_sum[mt][half] * alpha[mt][half] + sum;
    }
  }
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < Traits::kDimTiles; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e / 2];
      }
    }
  }
}

// ----------------------------------------------------------------------------
// One block: kBlockM query rows of one (batch, head)
// ----------------------------------------------------------------------------

template <typename Traits, bool kCausal>
__device__ __forceinline__ void attend_block(const AttentionParams& p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_smem = reinterpret_cast<Element*>(smem);
  const uint32_t q_tile = mma::shared_address(smem);
  const uint32_t k_tile = q_tile + Traits::kQTileBytes;
  const uint32_t v_tile = k_tile + Traits::kKVTileBytes;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // fragment row group
  const int t = lane % 4;  // thread in the quad

  FlashBlock blk;
  if (!locate_flash_block(p, kCausal, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const Element* q = blk.q_rows<Element>(p);
  const Element* k = blk.k_rows<Element>(p);
  const Element* v = blk.v_rows<Element>(p);

  // Rows of this thread's accumulators: warp_m0 + 16 mt + 8 half + g.
  const int64_t warp_m0 = blk.m0 + warp * Traits::kRowsPerWarp;
  float o[kMTiles][Traits::kDimTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Traits::kDimTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
    }
  }
  float row_max[kMTiles][2];
  float row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  if (blk.n_tiles > 0) {  // otherwise every row sees no key: the epilogue writes zeros
    load_tile<Traits, kBlockM, true>(q_tile, q, p.q_row_stride, blk.rows);
    mma::commit_copies();
    load_tile<Traits, kBlockN, true>(k_tile, k + (blk.n_tiles - 1) * kBlockN * p.k_row_stride, p.k_row_stride,
                                     p.seqlen_k - (blk.n_tiles - 1) * kBlockN);
    mma::commit_copies();

    // softmax(c S) with c < 0 is softmax(|c| (-Q) K^T): each warp flips the sign bits of its
    // own Q rows once (exact), and the loop only ever sees a positive scale, which commutes
    // with the row max. c == 0 becomes the smallest normal float: every c S then rounds
    // exp2 to exactly 1 as c = 0 would, while masked -inf scores stay -inf (not 0 * -inf).
    const float scale_log2 = fmaxf(static_cast<float>(fabs(p.softmax_scale) * kLog2e), 1.17549435e-38f);
    if (p.softmax_scale < 0) {
      mma::wait_copies<1>();
      __syncthreads();  // Q rows arrive through other warps' copies
      uint4* q_rows = reinterpret_cast<uint4*>(q_smem + warp * Traits::kRowsPerWarp * Traits::kHeadDim);
#pragma unroll
      for (int i = lane; i < Traits::kRowsPerWarp * Traits::kChunksPerRow; i += 32) {
        uint4 x = q_rows[i];
        x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
        q_rows[i] = x;
      }
      __syncwarp();
    }

    const auto q_lane = LaneAddress::make<Traits>(q_tile, warp * Traits::kRowsPerWarp + lane % 16, lane / 16, lane);
    const auto k_lane = LaneAddress::make<Traits>(k_tile, lane % 8 + 8 * (lane / 16), (lane / 8) % 2, lane);
    const auto v_lane = LaneAddress::make<Traits>(v_tile, lane % 8 + 8 * ((lane / 8) % 2), lane / 16, lane);

    // One key tile; kMasked (a std::bool_constant) selects the tail / diagonal variant, so the
    // unmasked loop carries neither the mask nor the bounds of a partial tile.
    const auto attend_key_tile = [&](const int j, auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const int64_t n0 = static_cast<int64_t>(j) * kBlockN;
      mma::wait_copies<0>();
      __syncthreads();  // K(j) (and Q) visible to every warp; every warp is done reading V(j+1)
      if (kMasked && n0 + kBlockN > p.seqlen_k) {
        load_tile<Traits, kBlockN, true>(v_tile, v + n0 * p.v_row_stride, p.v_row_stride, p.seqlen_k - n0);
      } else {
        load_tile<Traits, kBlockN, false>(v_tile, v + n0 * p.v_row_stride, p.v_row_stride, kBlockN);
      }
      mma::commit_copies();

      float s[kMTiles][Traits::kKeyTiles][4];
      scores<Traits>(s, q_lane, k_lane);
      if constexpr (kMasked) {
        // Keys of this tile that row r sees: min(r + 1 + seqlen_k - seqlen_q, seqlen_k) - n0,
        // clamped to [0, kBlockN]. This thread's rows are r0 + {0, 8, 16, 24}; clamping the
        // 64-bit r0 term to [-32, kBlockN] first changes no clamped result and keeps the rest in int.
        const int tail_limit = static_cast<int>(min(p.seqlen_k - n0, int64_t{kBlockN}));
        int causal_limit = kBlockN;
        if constexpr (kCausal) {
          const int64_t r0_limit = warp_m0 + g + 1 + p.seqlen_k - p.seqlen_q - n0;
          causal_limit = static_cast<int>(max(int64_t{-32}, min(r0_limit, int64_t{kBlockN})));
        }
        int row_limit[kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int causal = kCausal ? causal_limit + 16 * mt + 8 * half : kBlockN;
            row_limit[mt][half] = max(0, min(causal, tail_limit));
          }
        }
        mask_scores<Traits>(s, row_limit, t);
      }
      uint32_t prob[kMTiles][Traits::kKeySlices][4];
      softmax_step<Traits>(s, prob, o, row_max, row_sum, scale_log2);

      mma::wait_copies<0>();
      __syncthreads();  // V(j) visible to every warp; every warp is done reading K(j)
      if (j > 0) {
        load_tile<Traits, kBlockN, false>(k_tile, k + (n0 - kBlockN) * p.k_row_stride, p.k_row_stride, kBlockN);
        mma::commit_copies();
      }
      accumulate_pv<Traits>(o, prob, v_lane);
    };

    int j = blk.n_tiles - 1;
    for (; j >= blk.n_unmasked; --j) attend_key_tile(j, std::true_type{});
    for (; j >= 0; --j) attend_key_tile(j, std::false_type{});
  }

  // Epilogue. O /= l; a row that saw no key (or only -inf scores) has l = 0 and O = 0 and
  // stays 0 with LSE -inf. A NaN l (NaN or +inf scores) makes O and LSE NaN.
  float inv_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = mma::quad_sum(row_sum[mt][half]);
      inv_sum[mt][half] = sum == 0.f ? 0.f : 1.f / sum;
      const int64_t row = warp_m0 + 16 * mt + 8 * half + g;
      if (p.lse != nullptr && t == 0 && row < p.seqlen_q) {
        p.lse[blk.b * p.lse_batch_stride + blk.h * p.lse_head_stride + row] =
            sum == 0.f ? -INFINITY : row_max[mt][half] * kLn2 + logf(sum);
      }
    }
  }

  // O goes through the warp's own Q rows in shared memory (no other warp reads them, and no
  // copy is in flight) to leave as 16 B row-contiguous stores. Fragment writes: the quad's
  // four 4 B words of one chunk, eight rows with distinct swizzles: conflict-free.
  __syncwarp();  // every lane's last ldmatrix of Q is done
  uint32_t* o_words = reinterpret_cast<uint32_t*>(q_smem + warp * Traits::kRowsPerWarp * Traits::kHeadDim);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * mt + 8 * half + g;
#pragma unroll
      for (int dt = 0; dt < Traits::kDimTiles; ++dt) {
        o_words[swizzled<Traits>(row, dt) / 2 + t] = pack_pair<Element>(
            o[mt][dt][2 * half] * inv_sum[mt][half], o[mt][dt][2 * half + 1] * inv_sum[mt][half]);
      }
    }
  }
  __syncwarp();
  const Element* o_rows = q_smem + warp * Traits::kRowsPerWarp * Traits::kHeadDim;
  Element* out =
      static_cast<Element*>(p.out) + blk.b * p.o_batch_stride + blk.h * p.o_head_stride + warp_m0 * p.o_row_stride;
  const int64_t valid_rows = p.seqlen_q - warp_m0;
#pragma unroll
  for (int i = 0; i < Traits::kRowsPerWarp * Traits::kChunksPerRow / 32; ++i) {
    const int row = (i * 32 + lane) / Traits::kChunksPerRow;
    const int chunk = (i * 32 + lane) % Traits::kChunksPerRow;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(out + row * p.o_row_stride + chunk * Traits::kChunk) =
          *reinterpret_cast<const uint4*>(o_rows + swizzled<Traits>(row, chunk));
    }
  }
}

}  // namespace flash_mma

/// \brief Flash attention forward on mma.sync; grid (query blocks, batch*heads folded over y and z).
/// Two blocks per SM is the design point (255 registers x 128 threads each).
template <typename Element, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(FlashMmaTraits<Element, kHeadDim>::kThreads, 2)
    flash_mma_kernel(const __grid_constant__ AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and bf16 mma need sm_80; mma_can_implement refuses older devices
#else
  flash_mma::attend_block<FlashMmaTraits<Element, kHeadDim>, kCausal>(p);
#endif
}

template <int kHeadDim>
inline constexpr int kFlashMmaSmemBytes = FlashMmaTraits<__half, kHeadDim>::kSmemBytes;

// Shared memory per block for a head dim (the same for both 16-bit element types), 0 if unsupported.
inline int flash_mma_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 64: return kFlashMmaSmemBytes<64>;
    case 128: return kFlashMmaSmemBytes<128>;
    default: return 0;
  }
}

template <typename Element, int kHeadDim, bool kCausal>
Status launch_flash_mma_kernel(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashMmaTraits<Element, kHeadDim>;
  if (Status s = folded_grid_check(p, Traits::kBlockM, "mma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = flash_mma_kernel<Element, kHeadDim, kCausal>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cuda_status(cudaGetLastError(), "flash_mma_kernel launch");
}

/// \brief Launches the mma.sync forward on `stream` (params.device_id must be current).
template <typename Element, int kHeadDim>
Status launch_flash_mma(const AttentionParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads == 0 || p.seqlen_q == 0) return Status::Ok();
  return p.is_causal ? launch_flash_mma_kernel<Element, kHeadDim, true>(p, stream)
                     : launch_flash_mma_kernel<Element, kHeadDim, false>(p, stream);
}

extern template Status launch_flash_mma<__half, 64>(const AttentionParams&, cudaStream_t);
extern template Status launch_flash_mma<__half, 128>(const AttentionParams&, cudaStream_t);
extern template Status launch_flash_mma<__nv_bfloat16, 64>(const AttentionParams&, cudaStream_t);
extern template Status launch_flash_mma<__nv_bfloat16, 128>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
