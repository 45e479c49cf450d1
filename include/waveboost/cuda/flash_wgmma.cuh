// Hopper flash attention forward on warpgroup MMA (backend "wgmma", sm_90a only).
//
// FlashAttention-3's forward without its producer warp: one block owns kBlockM = 128 query
// rows of one (batch, head) and runs two warpgroups of 64 rows each (wgmma's M). Every
// warpgroup walks the key tiles the block can see, last to first, with the online softmax
// of core/softmax.cuh, shared with the mma path:
//
//   S = Q K^T        wgmma m64n128k16, Q and K from shared memory (both K-major)
//   softmax          on S's accumulators in registers, exp2 with scale * log2(e) folded
//                    (huge scores: see core/softmax.cuh)
//   O += P V         wgmma m64nDk16 with P from registers (the accumulator layout is the A
//                    fragment layout) and V from shared memory, MN-major (imm-trans-b)
//
// Overlap inside a warpgroup (FA3's "intra-warpgroup pipelining"): tile i issues S(i) and
// then P(i-1) V(i-1) back to back, waits for S(i) only, and computes softmax(S(i)) while the
// tensor cores run P(i-1) V(i-1); O is rescaled, and P(i) packed into the A registers
// P(i-1) occupied, once that product has landed. The two warpgroups of a block also cover
// each other's softmax.
//
// Loads: every thread issues 16 B cp.async into the 128 B-swizzled layout the descriptors
// describe (see wgmma_primitives.cuh), zero-filling rows beyond the sequence. K and V are
// double-buffered; V runs one tile behind K because P(i-1) V(i-1) is still reading its
// buffer during tile i. One barrier per tile: at the top of tile i every thread has waited
// for its own copies of K(i) and V(i-1) and fenced them into the async proxy, and every
// warpgroup has finished S(i-1) and P(i-2) V(i-2), whose buffers the copies issued right
// after the barrier (K(i+1), V(i)) overwrite.
//
// Shared memory (D = 128: 161 KB, D = 64: 81 KB) allows one block (8 warps) per SM; so do
// registers (S 64 + O D/2 + P 32 per thread).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/combine.cuh"
#include "waveboost/cuda/core/epilogue.cuh"
#include "waveboost/cuda/core/fragments.cuh"
#include "waveboost/cuda/core/mask.cuh"
#include "waveboost/cuda/core/softmax.cuh"
#include "waveboost/cuda/mma_primitives.cuh"
#include "waveboost/cuda/wgmma_primitives.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the wgmma flash kernel.
/// \tparam Element_  __half or __nv_bfloat16 (Q, K, V, O, P); accumulation is fp32.
/// \tparam kHeadDim_ 64 or 128.
/// \tparam kBlockM_  query rows per block, 64 per consumer warpgroup (the cp.async kernel: 128).
/// \tparam kBlockN_  keys per tile: 128, or 64 (16-bit, the TMA kernel's short blocks), or 192 (e4m3).
template <typename Element_, int kHeadDim_, int kBlockM_ = kWgmmaBlockM, int kBlockN_ = kWgmmaBlockN>
struct FlashWgmmaTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRowsPerWarpgroup = 64;  // wgmma's M
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarpgroups = kBlockM / kRowsPerWarpgroup;
  static constexpr int kThreads = kWarpgroups * 128;
  // Keys per tile = N of S's wgmma. 128 keeps S at 64 registers per thread and gives each
  // wgmma of Q K^T 64 x 128 x 16 (long instructions amortize their issue); D = 128 then
  // holds S 64 + O 64 floats + P 32 registers per thread. 64 halves S and P and the shared
  // memory of a K/V tile (flash_wgmma_ws.cuh: two 64-row blocks per SM at head dim 128).
  static constexpr int kBlockN = kBlockN_;

  // wgmma's K: 16 for 16-bit elements, 32 for 8-bit ones (32 B of a row either way).
  static constexpr int kSliceK = 32 / int(sizeof(Element));
  // 8-bit products read both operands K-major (PTX has no transposed 8-bit B), so P V reads V^T:
  // the warp-specialized kernel's producer transposes each V tile in shared memory.
  static constexpr bool kValuesTransposed = sizeof(Element) == 1;

  static constexpr int kScoreRegs = kBlockN / 2;      // S accumulators per thread (64 x kBlockN / 128)
  static constexpr int kOutRegs = kHeadDim / 2;       // O accumulators per thread
  static constexpr int kKeyTiles = kBlockN / 8;       // 8-column groups of S
  static constexpr int kKeySlices = kBlockN / kSliceK;   // k slices of P V
  static constexpr int kDimSlices = kHeadDim / kSliceK;  // k slices of Q K^T

  // Tiles are stored as panels of kPanelCols columns (64 16-bit or 128 8-bit elements); a panel
  // row is 128 B, the width of the 128 B swizzle, and panel p of a tile with R rows starts
  // p * R * 128 B in.
  static constexpr int kRowBytes = 128;
  static constexpr int kPanelCols = kRowBytes / int(sizeof(Element));
  static constexpr int kSlicesPerPanel = kPanelCols / kSliceK;  // 4: a k slice is 32 B of a row
  static constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16 B chunk
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;

  static constexpr int kQTileBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * int(sizeof(Element));
  // V^T (kValuesTransposed): head_dim rows in panels of 128 keys (a last panel of fewer keys is
  // allocated whole). The products read values from tiles kValuesTileBytes apart.
  static constexpr int kVtPanels = (kBlockN + kPanelCols - 1) / kPanelCols;
  static constexpr int kVtTileBytes = kValuesTransposed ? kVtPanels * kHeadDim * kRowBytes : 0;
  static constexpr int kValuesTileBytes = kValuesTransposed ? kVtTileBytes : kKVTileBytes;
  static constexpr int kStages = 2;
  // Swizzle atoms must start on 1024 B boundaries; the kernel rounds the dynamic
  // shared-memory base up, which costs at most this much.
  static constexpr int kAtomBytes = 1024;
  static constexpr int kSmemBytes = kQTileBytes + 2 * kStages * kKVTileBytes + kAtomBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(sizeof(Element) == 2 || sizeof(Element) == 1, "16-bit or 8-bit elements");
  static_assert(kHeadDim % kPanelCols == 0, "whole panels");
  // A copy pass covers a multiple of 8 rows, so a thread's chunk swizzle is the same every pass.
  static_assert(kRowsPerCopyPass % 8 == 0 && kBlockM % kRowsPerCopyPass == 0);
  // Tiles and panels are whole atoms, so every tile and panel start stays 1024 B aligned.
  static_assert(kQTileBytes % kAtomBytes == 0 && kKVTileBytes % kAtomBytes == 0 && kBlockN % 8 == 0);
  static_assert(16 * kChunksPerRow % 32 == 0, "the epilogue stores whole warps of chunks");

  using ScoreFragments = WgmmaFragments<kKeyTiles>;        // S and P, one warp's 16 rows
  using OutFragments = WgmmaFragments<kHeadDim / 8>;       // O, one warp's 16 rows
  static_assert(sizeof(typename ScoreFragments::Array) == kScoreRegs * sizeof(float));
  static_assert(sizeof(typename OutFragments::Array) == kOutRegs * sizeof(float));
};

namespace flash_wgmma {

// Byte offset of 16 B chunk `chunk` (0 .. kChunksPerRow - 1) of row `row` in a tile of kRows
// rows, in the layout wgmma reads through descriptor_128b (wgmma_primitives.cuh).
template <typename Traits, int kRows>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  static_assert(Traits::kRowBytes == 128, "rows of one 128 B swizzle panel");
  return mma::swizzle_128b_offset<kRows>(row, chunk);
}

// Issues cp.async for rows [0, kRows) of a tile whose rows are row_stride elements apart.
// kGuarded: rows >= valid_rows are zero-filled (only the last key tile and the Q tile can be
// partial); the unguarded form spends no compares on the bound.
template <typename Traits, int kRows, bool kGuarded>
__device__ __forceinline__ void load_tile(uint32_t tile, const typename Traits::Element* src, int64_t row_stride,
                                          int64_t valid_rows) {
  const int chunk = threadIdx.x % Traits::kChunksPerRow;
  const int row = threadIdx.x / Traits::kChunksPerRow;
  const uint32_t dst = tile + tile_offset<Traits, kRows>(row, chunk);
  const typename Traits::Element* src_row = src + row * row_stride + chunk * Traits::kChunk;
  const int64_t pass_stride = Traits::kRowsPerCopyPass * row_stride;
#pragma unroll
  for (int i = 0; i < kRows / Traits::kRowsPerCopyPass; ++i) {
    const uint32_t dst_i = dst + i * Traits::kRowsPerCopyPass * Traits::kRowBytes;
    if constexpr (kGuarded) {
      const bool valid = row + i * Traits::kRowsPerCopyPass < valid_rows;
      mma::copy_async_16B(dst_i, valid ? src_row + i * pass_stride : src, valid);
    } else {
      mma::copy_async_16B(dst_i, src_row + i * pass_stride, true);
    }
  }
}

// Issues cp.async for rows [0, kRows) of the K (kValue false) or V tile starting at key n0 of
// the sequence, `base` being FlashBlock::k_rows / v_rows: contiguous rows (dense, packed)
// through load_tile; with a paged K / V (kPagedKV, a kernel of its own) each row's page through
// the block table (FlashBlock::paged_key). The choice is made at compile time: a run-time branch
// here, in the middle of the software pipeline, is suspected of costing the varlen kernel (see
// benchmarks/NOTES.md).
template <typename Traits, int kRows, bool kGuarded, bool kValue, bool kPagedKV>
__device__ __forceinline__ void load_kv_tile(uint32_t tile, const AttentionParams& p, const FlashBlock& blk,
                                             const typename Traits::Element* base, int64_t n0, int64_t valid_rows) {
  using Element = typename Traits::Element;
  const int64_t row_stride = kValue ? p.v_row_stride : p.k_row_stride;
  if constexpr (!kPagedKV) {
    load_tile<Traits, kRows, kGuarded>(tile, kValue ? blk.v_tile(p, base, n0) : blk.k_tile(p, base, n0), row_stride,
                                       valid_rows);
  } else {
    const int32_t* table_row = blk.page_table(p);
    const int chunk = threadIdx.x % Traits::kChunksPerRow;
    const int row = threadIdx.x / Traits::kChunksPerRow;
    const uint32_t dst = tile + tile_offset<Traits, kRows>(row, chunk);
    const Element* src_chunk = base + chunk * Traits::kChunk;
#pragma unroll
    for (int i = 0; i < kRows / Traits::kRowsPerCopyPass; ++i) {
      const int r = row + i * Traits::kRowsPerCopyPass;
      bool valid = !kGuarded || r < valid_rows;
      int64_t offset = 0;
      if (valid) valid = blk.paged_key<kValue>(p, table_row, static_cast<int>(n0) + r, offset);
      mma::copy_async_16B(dst + i * Traits::kRowsPerCopyPass * Traits::kRowBytes, src_chunk + offset, valid);
    }
  }
}

// Flips the sign bits of the Q chunks this thread copied (the same chunks load_tile<kBlockM>
// wrote), after its own copies have completed: no other thread's data is touched.
template <typename Traits>
__device__ __forceinline__ void negate_own_q_chunks(unsigned char* q_tile) {
  constexpr uint32_t kSignBits = sizeof(typename Traits::Element) == 1 ? 0x80808080u : kSignBitsHalf2;
  const int chunk = threadIdx.x % Traits::kChunksPerRow;
  const int row = threadIdx.x / Traits::kChunksPerRow;
  const uint32_t offset = tile_offset<Traits, Traits::kBlockM>(row, chunk);
#pragma unroll
  for (int i = 0; i < Traits::kBlockM / Traits::kRowsPerCopyPass; ++i) {
    uint4* x = reinterpret_cast<uint4*>(q_tile + offset + i * Traits::kRowsPerCopyPass * Traits::kRowBytes);
    uint4 v = *x;
    v.x ^= kSignBits, v.y ^= kSignBits, v.z ^= kSignBits, v.w ^= kSignBits;
    *x = v;
  }
}

// ----------------------------------------------------------------------------
// The two products (issue only; the caller commits and waits)
// ----------------------------------------------------------------------------

// One k slice of S = Q K^T over N keys: k16 for 16-bit elements (N = 64 or 128), k32 for e4m3 (N = 128 or 192).
template <typename Element, int N, bool kAccumulate>
__device__ __forceinline__ void issue_score_slice(float (&s)[N / 2], uint64_t q_desc, uint64_t k_desc) {
  if constexpr (sizeof(Element) == 1) {
    wgmma::mma_m64nNk32_ss_e4m3<N, kAccumulate>(s, q_desc, k_desc);
  } else if constexpr (N == 64) {
    wgmma::mma_m64n64k16_ss<Element, kAccumulate>(s, q_desc, k_desc);
  } else if constexpr (N == 192) {
    wgmma::mma_m64n192k16_ss<Element, kAccumulate>(s, q_desc, k_desc);
  } else {
    wgmma::mma_m64n128k16_ss<Element, kAccumulate>(s, q_desc, k_desc);
  }
}

// S = Q K^T for the warpgroup's 64 rows. q_desc / k_desc describe column 0 of the warpgroup's
// Q rows / of the K tile. k slice kk sits in panel kk / 4, 32 B * (kk % 4) into each row.
template <typename Traits>
__device__ __forceinline__ void issue_scores(float (&s)[Traits::kScoreRegs], uint64_t q_desc, uint64_t k_desc) {
  using Element = typename Traits::Element;
  issue_score_slice<Element, Traits::kBlockN, false>(s, q_desc, k_desc);
#pragma unroll
  for (int kk = 1; kk < Traits::kDimSlices; ++kk) {
    const uint32_t in_row = (kk % Traits::kSlicesPerPanel) * 32;
    const uint32_t panel = kk / Traits::kSlicesPerPanel;
    issue_score_slice<Element, Traits::kBlockN, true>(
        s, wgmma::advance(q_desc, panel * Traits::kBlockM * Traits::kRowBytes + in_row),
        wgmma::advance(k_desc, panel * Traits::kBlockN * Traits::kRowBytes + in_row));
  }
}

// O += P V. p[ks] is the A fragment of k slice ks. 16-bit: keys 16 ks .. 16 ks + 15, whose V
// rows start 16 ks rows (two atoms) into the MN-major tile. e4m3: the 32 keys of slice ks are
// 32 B * (ks % 4) into each row of panel ks / 4 of the K-major V^T tile (panels of head_dim rows
// of 128 keys, kValuesTransposed).
template <typename Traits>
__device__ __forceinline__ void issue_pv(float (&o)[Traits::kOutRegs], const uint32_t (&p)[Traits::kKeySlices][4],
                                         uint64_t v_desc) {
#pragma unroll
  for (int ks = 0; ks < Traits::kKeySlices; ++ks) {
    if constexpr (Traits::kValuesTransposed) {
      const uint32_t panel = ks / Traits::kSlicesPerPanel;
      wgmma::mma_m64nNk32_rs_e4m3<Traits::kHeadDim>(
          o, p[ks],
          wgmma::advance(v_desc, panel * Traits::kHeadDim * Traits::kRowBytes + (ks % Traits::kSlicesPerPanel) * 32));
    } else {
      wgmma::mma_m64nNk16_rs_tb<typename Traits::Element, Traits::kHeadDim>(
          o, p[ks], wgmma::advance(v_desc, ks * 16 * Traits::kRowBytes));
    }
  }
}

// P (the probabilities in S's accumulators, in [0, 1]) as e4m3 A fragments of k32 slices.
// Register 2 j + r of slice ks holds row r's columns of 8-column groups 4 ks + 2 j and
// 4 ks + 2 j + 1, bytes (group 2j: 2t, 2t + 1; group 2j + 1: 2t, 2t + 1). As an A fragment that
// register is row r's columns 16 j + 4 t .. 16 j + 4 t + 3 of the slice: so the slice's column
// 16 j + 4 t + b stands for key 16 j + 8 (b / 2) + 2 t + b % 2, and the producer writes V^T's
// key columns in that order (transpose_values), which makes P V exact with no shuffle of P.
template <typename Traits>
__device__ __forceinline__ void pack_e4m3(const float (&s)[Traits::kScoreRegs],
                                          uint32_t (&p)[Traits::kKeySlices][4]) {
  using F = typename Traits::ScoreFragments;
#pragma unroll
  for (int ks = 0; ks < Traits::kKeySlices; ++ks) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int nt = 4 * ks + 2 * j;
        p[ks][2 * j + r] = wgmma::pack_e4m3x4(F::at(s, r, nt, 0), F::at(s, r, nt, 1), F::at(s, r, nt + 1, 0),
                                       F::at(s, r, nt + 1, 1));
      }
    }
  }
}

// ----------------------------------------------------------------------------
// One warpgroup's work on one key tile, and the block's output (both kernels: this one and the
// TMA-pipeline kernel of flash_wgmma_ws.cuh, which differ only in how K and V arrive)
// ----------------------------------------------------------------------------

// Key tile i of the visit order (keys n0 ..): S(i) = Q K^T (k_desc), then P(i-1) V(i-1)
// (v_prev_desc; not on the first tile), waiting for S(i) only; the mask (kMasked), the online
// softmax step, O rescaled once P(i-1) V(i-1) has landed, P(i) packed into the A registers of
// P(i-1). on_scores_read() runs once S(i) has completed (K(i)'s buffer is free), on_values_read()
// once P(i-1) V(i-1) has (V(i-1)'s buffer is free). row: this thread's first accumulator row.
// kMasked and kFirst are compile-time so that every wgmma batch sits in one basic block after its
// wgmma.fence (ptxas otherwise injects fences of its own).
template <typename Traits, bool kMasked, bool kFirst, typename Mask, typename Softmax, typename ScoresRead,
          typename ValuesRead>
__device__ __forceinline__ void attend_tile(float (&o)[Traits::kOutRegs], uint32_t (&p_prev)[Traits::kKeySlices][4],
                                            Softmax& softmax, const Mask& mask, uint64_t q_desc, uint64_t k_desc,
                                            uint64_t v_prev_desc, int64_t row, int64_t n0, int t, float scale_log2,
                                            ScoresRead on_scores_read, ValuesRead on_values_read) {
  float s[Traits::kScoreRegs];
  if constexpr (!kFirst) {
    wgmma::fence_operands(o);
    wgmma::fence_operands(p_prev);
  }
  wgmma::fence();
  issue_scores<Traits>(s, q_desc, k_desc);
  wgmma::commit_group();
  if constexpr (!kFirst) {
    issue_pv<Traits>(o, p_prev, v_prev_desc);
    wgmma::commit_group();
    wgmma::wait_group<1>();
  } else {
    wgmma::wait_group<0>();
  }
  wgmma::fence_operands(s);
  on_scores_read();

  if constexpr (kMasked) mask.template mask_tile<typename Traits::ScoreFragments, Traits::kBlockN>(s, row, n0, t);
  float alpha[Softmax::kRows];
  [[maybe_unused]] const bool raised = __any_sync(kFullWarpMask, softmax.template step<false>(s, alpha, scale_log2));

  if constexpr (!kFirst) {  // tile 0 meets O = 0: nothing to rescale
    wgmma::wait_group<0>();
    wgmma::fence_operands(o);
    wgmma::fence_operands(p_prev);
    on_values_read();
    if (raised) Softmax::template rescale<typename Traits::OutFragments>(o, alpha);
  }
  // P into the A registers of P(i-1), free now that its product has landed: reusing them
  // is what keeps the compiler from serializing the wgmma pipeline (ptxas would otherwise
  // see registers of an in-flight wgmma being redefined).
  if constexpr (Traits::kValuesTransposed) {
    pack_e4m3<Traits>(s, p_prev);
  } else {
    Softmax::template pack<typename Traits::Element>(s, p_prev);
  }
}

// The last product, P(n-1) V(n-1), once V(n-1) has landed.
template <typename Traits>
__device__ __forceinline__ void attend_last_values(float (&o)[Traits::kOutRegs],
                                                   uint32_t (&p_prev)[Traits::kKeySlices][4], uint64_t v_desc) {
  wgmma::fence_operands(o);
  wgmma::fence_operands(p_prev);
  wgmma::fence();
  issue_pv<Traits>(o, p_prev, v_desc);
  wgmma::commit_group();
  wgmma::wait_group<0>();
  wgmma::fence_operands(o);
}

// LSE and O of an unsplit block. O leaves through the warp's own 16 Q rows in shared memory, as
// 16 B row-contiguous stores: every S product (the only reader of Q) of the warp's warpgroup has
// completed, so the rows are free, and only this warp touches them now. Fragment writes: a quad
// fills one 16 B chunk, eight rows with distinct swizzles: conflict-free.
// OutElement (16-bit) may differ from the inputs' Element (e4m3): `staging` then holds kBlockM
// rows of 16-bit O in the layout of a 16-bit Q tile, the caller's choice of free memory.
template <typename Traits, typename OutElement = typename Traits::Element, typename Softmax>
__device__ __forceinline__ void write_block_output(const AttentionParams& p, const FlashBlock& blk,
                                                   const float (&o)[Traits::kOutRegs],
                                                   const float (&inv_sum)[Softmax::kRows], const Softmax& softmax,
                                                   unsigned char* staging, int warp_row, int64_t warp_m0, int lane) {
  using Stage = FlashWgmmaTraits<OutElement, Traits::kHeadDim, Traits::kBlockM>;
  const int g = lane / 4;
  const int t = lane % 4;
  write_lse(p, blk, warp_m0 + g, softmax, t);
  stage_output<typename Traits::OutFragments, OutElement>(o, inv_sum, g, t, [&](int row, int dt) {
    return reinterpret_cast<uint32_t*>(staging + tile_offset<Stage, Stage::kBlockM>(warp_row + row, dt));
  });
  __syncwarp();
  store_staged_rows<16, Stage::kChunksPerRow>(
      blk.o_row<OutElement>(p, warp_m0), p.o_row_stride, blk.seqlen_q - warp_m0, lane, [&](int row, int chunk) {
        return staging + tile_offset<Stage, Stage::kBlockM>(warp_row + row, chunk);
      });
}

// ----------------------------------------------------------------------------
// One block: kBlockM query rows of one (batch, head)
// ----------------------------------------------------------------------------

// kSplit: the block runs one piece of its keys (SplitKV) and writes it to the workspace; the
// plain kernel (kSplit false) compiles with no trace of the split.
// kSequences: p may carry a sequence layout (varlen, seqused_k; core/sequence.cuh), never with
// kSplit; kPagedKV (with kSequences): K/V are paged (p.block_table set). The dense kernel
// (both false) compiles with no trace of either.
template <typename Traits, typename Mask, bool kSplit, bool kSequences, bool kPagedKV>
__device__ __forceinline__ void attend_block(const AttentionParams& p, const SplitKV& split) {
  static_assert(!(kSplit && kSequences), "split-KV pieces are laid out for dense batches");
  static_assert(Traits::kBlockN % Traits::kRowsPerCopyPass == 0, "K/V tiles in whole copy passes");
  static_assert(kSequences || !kPagedKV, "paged K/V is a sequence layout");
  using Element = typename Traits::Element;
  using Softmax = OnlineSoftmax<typename Traits::ScoreFragments>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRowBytes = Traits::kRowBytes;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_address = mma::shared_address(smem_raw);
  const uint32_t align_pad = (Traits::kAtomBytes - raw_address % Traits::kAtomBytes) % Traits::kAtomBytes;
  unsigned char* const q_smem = smem_raw + align_pad;
  const uint32_t q_tile = raw_address + align_pad;
  const uint32_t k_tile = q_tile + Traits::kQTileBytes;                       // kStages K tiles
  const uint32_t v_tile = k_tile + Traits::kStages * Traits::kKVTileBytes;  // kStages V tiles

  const int warpgroup = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // blockIdx.x = query block * num_splits + split.
  const int num_splits = kSplit ? split.num_splits : 1;
  const int split_index = kSplit ? blockIdx.x % num_splits : 0;
  FlashBlock blk;
  if (!locate_flash_block<Mask, kSequences>(p, kSplit ? blockIdx.x / num_splits : blockIdx.x, gridDim.x / num_splits, kBlockM,
                                kBlockN, blk)) {
    return;
  }
  const Mask mask = Mask::of(blk);
  // This block's key tiles: [tile_begin, tile_end), visited last to first.
  const int tile_begin = kSplit ? min(blk.n_tiles, split_index * split.tiles_per_split) : 0;
  const int tile_end = kSplit ? min(blk.n_tiles - tile_begin, split.tiles_per_split) + tile_begin : blk.n_tiles;
  const int n_visits = tile_end - tile_begin;

  const Element* q = blk.q_rows<Element>(p);
  const Element* k = blk.k_rows<Element>(p);
  const Element* v = blk.v_rows<Element>(p);

  // Rows of this thread's accumulators: warp_m0 + g + 8 half.
  const int warp_row = warpgroup * Traits::kRowsPerWarpgroup + warp * 16;  // within the block
  const int64_t warp_m0 = blk.m0 + warp_row;
  float o[Traits::kOutRegs];
#pragma unroll
  for (int i = 0; i < Traits::kOutRegs; ++i) o[i] = 0.f;
  Softmax softmax;
  softmax.init();

  if (n_visits > 0) {  // otherwise every row sees no key here: the epilogue writes zeros
    load_tile<Traits, kBlockM, true>(q_tile, q, p.q_row_stride, blk.rows);
    const int64_t last_n0 = (tile_end - 1) * int64_t{kBlockN};
    load_kv_tile<Traits, kBlockN, true, false, kPagedKV>(k_tile, p, blk, k, last_n0, blk.seqlen_k - last_n0);
    mma::commit_copies();

    // A negative scale: Q's sign bits are flipped once (exact), by the thread that copied them.
    const float scale_log2 = positive_scale_log2(p);
    const bool negate_q = p.softmax_scale < 0;

    // K-major operands: 8-row groups 1024 B apart (LBO unused). V (MN-major): groups of 8
    // keys 1024 B apart, 64-column panels kBlockN * 128 B apart.
    const uint64_t q_desc =
        wgmma::descriptor_128b(q_tile + warpgroup * Traits::kRowsPerWarpgroup * kRowBytes, 16, 8 * kRowBytes);
    const uint64_t k_desc = wgmma::descriptor_128b(k_tile, 16, 8 * kRowBytes);
    const uint64_t v_desc = wgmma::descriptor_128b(v_tile, kBlockN * kRowBytes, 8 * kRowBytes);

    uint32_t p_prev[Traits::kKeySlices][4];  // P(i-1), the A operand of the product in flight in tile i

    // Tile i of the visit order is key tile j = tile_end - 1 - i, in K/V buffer i % 2.
    // kMasked (a std::bool_constant) selects the tail / diagonal variant, so the unmasked
    // loop carries neither the mask nor the bounds of a partial tile. kFirst: tile 0, which
    // has no product in flight (and always takes the masked variant, correct for any tile).
    // Both are compile-time so that every wgmma batch sits in one basic block after its
    // wgmma.fence (ptxas otherwise injects fences of its own).
    const auto attend_key_tile = [&](const int i, auto masked, auto first) {
      constexpr bool kMasked = decltype(masked)::value;
      constexpr bool kFirst = decltype(first)::value;
      const int j = tile_end - 1 - i;
      const int64_t n0 = static_cast<int64_t>(j) * kBlockN;
      const int stage = i % 2;

      // K(i) and V(i-1) landed (this thread's copies), handed to the async proxy; then every
      // thread's copies are visible and every warpgroup is done with S(i-1) and P(i-2) V(i-2).
      mma::wait_copies<0>();
      if (kFirst && negate_q) negate_own_q_chunks<Traits>(q_smem);
      wgmma::fence_proxy_async();
      __syncthreads();
      if (j > tile_begin) {
        load_kv_tile<Traits, kBlockN, false, false, kPagedKV>(k_tile + (1 - stage) * Traits::kKVTileBytes, p, blk,
                                                              k, n0 - kBlockN, kBlockN);
      }
      if (kMasked && mask.partial_tile(n0, kBlockN)) {
        load_kv_tile<Traits, kBlockN, true, true, kPagedKV>(v_tile + stage * Traits::kKVTileBytes, p, blk, v, n0,
                                                            blk.seqlen_k - n0);
      } else {
        load_kv_tile<Traits, kBlockN, false, true, kPagedKV>(v_tile + stage * Traits::kKVTileBytes, p, blk, v, n0,
                                                             kBlockN);
      }
      mma::commit_copies();

      // S(i), then P(i-1) V(i-1) from the other buffer; no buffer is handed back (the barrier above does that).
      attend_tile<Traits, kMasked, kFirst>(o, p_prev, softmax, mask, q_desc,
                                           wgmma::advance(k_desc, stage * Traits::kKVTileBytes),
                                           wgmma::advance(v_desc, (1 - stage) * Traits::kKVTileBytes), warp_m0 + g,
                                           n0, t, scale_log2, [] {}, [] {});
    };

    attend_key_tile(0, std::true_type{}, std::true_type{});
    int i = 1;
    const int n_masked = min(n_visits, tile_end - blk.n_unmasked);  // visits of tiles >= n_unmasked
    for (; i < n_masked; ++i) attend_key_tile(i, std::true_type{}, std::false_type{});
    for (; i < n_visits; ++i) attend_key_tile(i, std::false_type{}, std::false_type{});

    // The last product, P(n-1) V(n-1), once V(n-1) has landed.
    mma::wait_copies<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    attend_last_values<Traits>(o, p_prev, wgmma::advance(v_desc, ((n_visits - 1) % 2) * Traits::kKVTileBytes));
  }

  float inv_sum[Softmax::kRows];
  softmax.finalize(inv_sum);
  if constexpr (kSequences) blk.reload_query_rows(p);

  if constexpr (kSplit) {
    write_split_piece<typename Traits::OutFragments, Traits::kHeadDim>(p, blk, split, split_index, warp_m0 + g, o,
                                                                       inv_sum, softmax, t);
    return;
  }
  write_block_output<Traits>(p, blk, o, inv_sum, softmax, q_smem, warp_row, warp_m0, lane);
}

}  // namespace flash_wgmma

/// \brief Flash attention forward on wgmma; grid (query blocks x splits, batch*heads folded
/// over y and z). One block of two warpgroups per SM (shared memory and registers both say so).
/// kSequences: the instantiations for sequence layouts (varlen, seqused_k; kPagedKV: paged K/V),
/// whose grid covers the longest sequence (p.seqlen_q) and whose blocks past their own sequence's
/// rows exit.
template <typename Element, int kHeadDim, bool kCausal, bool kSplit, bool kSequences, bool kPagedKV>
__global__ void __launch_bounds__(FlashWgmmaTraits<Element, kHeadDim>::kThreads, 1)
    flash_wgmma_kernel(const __grid_constant__ AttentionParams p, const SplitKV split) {
  flash_wgmma::attend_block<FlashWgmmaTraits<Element, kHeadDim>, CausalMask<kCausal>, kSplit, kSequences, kPagedKV>(p,
                                                                                                              split);
}

template <typename Element, int kHeadDim, bool kCausal>
Status launch_flash_wgmma_kernel(const AttentionParams& p, const SplitKV& split, cudaStream_t stream) {
  using Traits = FlashWgmmaTraits<Element, kHeadDim>;
  if (Status s = folded_grid_check(p, Traits::kBlockM, "wgmma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  // Sequence layouts run unsplit (wgmma_forward gives them one piece). Unsplit dense batches run
  // on the TMA kernel (flash_wgmma_ws.cuh); those it leaves here (WAVEBOOST_WGMMA_PIPELINE=cp.async,
  // strides TMA cannot describe) take the packed-sequence instantiation, for which a dense batch
  // is one layout among others: no instantiation of its own is built for them.
  const auto kernel = p.is_paged()             ? flash_wgmma_kernel<Element, kHeadDim, kCausal, false, true, true>
                      : split.num_splits > 1 ? flash_wgmma_kernel<Element, kHeadDim, kCausal, true, false, false>
                                             : flash_wgmma_kernel<Element, kHeadDim, kCausal, false, true, false>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x * split.num_splits), static_cast<unsigned>(g.y),
                  static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, split);
  if (Status s = cuda_status(cudaGetLastError(), "flash_wgmma_kernel launch"); !s.ok() || split.num_splits == 1) return s;
  // The pieces, (num_splits, batch, heads, seqlen_q, head_dim) and their LSEs, merged by the
  // shared combine (core/combine.cuh).
  const core::CombineParams c =
      core::split_pieces(p, split.o_accum, split.lse_accum, split.num_splits, kHeadDim, p.seqlen_q * kHeadDim);
  return core::launch_combine(c, DType::kFloat32, p.dtype, stream);
}

/// \brief Launches the wgmma forward on `stream` (params.device_id current, batch * heads *
/// seqlen_q > 0, as attention_forward guarantees); with
/// split.num_splits > 1 (see split_kv_pieces), split.o_accum and split.lse_accum must hold
/// num_splits * batch * heads * seqlen_q * (head_dim + 1) floats for the pieces.
template <typename Element, int kHeadDim>
Status launch_flash_wgmma(const AttentionParams& p, const SplitKV& split, cudaStream_t stream) {
  return p.is_causal ? launch_flash_wgmma_kernel<Element, kHeadDim, true>(p, split, stream)
                     : launch_flash_wgmma_kernel<Element, kHeadDim, false>(p, split, stream);
}

}  // namespace waveboost::cuda
