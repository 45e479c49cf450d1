// fp32 flash attention backward on the tensor cores with fp32-level accuracy (backend "mma",
// float32): the algorithm of flash_bwd_mma.cuh (FlashAttention-2's backward) on mma.sync
// m16n8k8 tf32, every product in three parts as in the forward (flash_mma_tf32.cuh):
//
//   A B ~= Ahi Bhi + (Ahi Blo + Alo Bhi)       (x = hi + lo, hi the nearest tf32)
//
// The five products per (key block, query block) step, each warp owning 16 keys:
//   S^T  = K Q^T,  dP^T = V dO^T     main products and corrections in separate accumulators,
//                                    added once (the forward's S), before the probabilities
//   dV  += P^T dO, dK += dS^T Q      per step and per 32 dims from zero (corrections first),
//                                    then added to the fp32 registers dK and dV: tensor-core
//                                    accumulation rounds toward zero, so a run of seqlen_q / 8
//                                    mmas on one accumulator would carry a bias growing with
//                                    the sequence (see flash_mma_tf32.cuh)
//   dQ  += dS K                      dS through shared memory as fp32; per step from zero
//                                    (main and corrections apart), added to the fp32 workspace
//                                    by 16 B reductions (or, deterministic, in a fixed order)
// Preprocess (D, lse * log2(e), zeroed dQ accumulator), the launch sequence and dQ conversion
// are the 16-bit backward's (flash_bwd_mma.cuh), as are the block locator, masked probability,
// step vector copies and grid (core/backward.cuh).
//
// Fragments without shuffles, by renumbering what a product contracts over (any fixed order of
// the k index, applied to A's columns and B's rows alike, leaves A B unchanged):
// - S^T, dP^T contract over dims: k = t, t + 4 of two consecutive k8 slices are four adjacent
//   dims of one 16 B load (K and Q rows; V and dO rows), as in the forward's S.
// - dV, dK contract over queries: an accumulator tile's columns 2t, 2t + 1 are query slice j's
//   k = t, t + 4, so (c0, c2, c1, c3) of P^T (dS^T) is the A fragment and the B rows are queries
//   8 j + 2t and 8 j + 2t + 1 (the forward's P V).
// - dQ contracts over keys: key 8 ks + 2t is k = t, 8 ks + 2t + 1 is k = t + 4; A is two 8 B
//   loads of dS rows g and g + 8, B the K rows 8 ks + 2t, 8 ks + 2t + 1.
// Output columns (dims) of dV, dK and dQ are the forward's O numbering: column n of n8 tile dt
// is dim 32 (dt / 4) + 16 (n % 2) + 4 (n / 2) + dt % 4, so B reads and accumulator stores are
// 16 B runs of four dims.
//
// Shared memory: K, V, Q[2], dO[2] in the forward's swizzled fp32 rows (flash_mma_tf32.cuh:
// its pair reads serve S^T and dP^T, its value reads dV, dK and dQ's B operands). dS is
// [query][key] with column c of row r stored at c ^ 8 ((r ^ (r >> 1)) % 4): the writes (rows
// 2t + e of a query tile, columns g of 16 keys) and the 8 B reads (rows g, columns 2t) both hit
// 32 distinct banks.
//
// Tiles: 32 query rows per step. Head dim 128: 8 warps, 128 keys per block (208 KB of shared
// memory, one block per SM: compute capability 9.0 and 10.0; A100's 164 KB leaves fp32 at head
// dim 128 to the naive backward); head dim 64: 4 warps, 64 keys (72 KB, two blocks per SM).
// Registers: dK and dV (kHeadDim / 2 floats each), S^T, dP^T and one correction array
// (kBlockM / 2 each); 64 query rows per step spilled ~250 bytes at head dim 64.
#pragma once

#include <cstdint>

#include "waveboost/cuda/core/backward.cuh"
#include "waveboost/cuda/flash_bwd_mma.cuh"
#include "waveboost/cuda/flash_mma_tf32.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the 3xTF32 mma.sync backward (fp32 q, k, v, out, gradients).
/// \tparam kHeadDim_ 64 or 128.
template <int kHeadDim_>
struct FlashBwdMmaTf32Traits : BackwardSmemLayout<(kHeadDim_ == 128 ? 8 : 4) * 16, 32, kHeadDim_, 4> {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kHeadDim == 128 ? 8 : 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocksPerSm = kHeadDim == 128 ? 1 : 2;
  static constexpr int kBlockN = kWarps * 16;               // keys per block: one m16 tile per warp
  static constexpr int kBlockM = 32;  // query rows per step

  static constexpr int kQueryTiles = kBlockM / 8;  // n8 tiles of S^T and dP^T = k8 slices of dV and dK
  static constexpr int kKeySlices = kBlockN / 8;   // k8 slices of dQ
  static constexpr int kDimPairs = kHeadDim / 16;  // pairs of k8 slices of S^T and dP^T (one 16 B load)
  static constexpr int kDimTiles = kHeadDim / 8;   // n8 tiles of dK, dV, dQ
  static constexpr int kDimQuads = kHeadDim / 32;  // groups of four n8 tiles (one 16 B load of B)
  // dQ (kBlockM x kHeadDim): kDqWarpsM m16 tiles of rows, each over kWarps / kDqWarpsM warps.
  static constexpr int kDqWarpsM = kBlockM / 16;
  static constexpr int kDqQuadsPerWarp = kDimQuads * kDqWarpsM / kWarps;

  // The names flash_mma_tf32's tile helpers read.
  static constexpr int kRowBytes = kHeadDim * 4;
  static constexpr int kChunksPerRow = kHeadDim / 4;
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;

  using Layout = BackwardSmemLayout<(kHeadDim_ == 128 ? 8 : 4) * 16, 32, kHeadDim_, 4>;
  static constexpr int kSmemBytes = Layout::kLayoutBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(Layout::kKVTileBytes == kBlockN * kRowBytes && Layout::kQTileBytes == kBlockM * kRowBytes);
  static_assert(kRowsPerCopyPass == 4 || kRowsPerCopyPass == 8, "load_tile's copy passes");
  static_assert(kBlockM % kRowsPerCopyPass == 0 && kBlockN % kRowsPerCopyPass == 0);
  static_assert(kWarps % kDqWarpsM == 0 && kDqQuadsPerWarp >= 1);
  static_assert(kBlockN >= 32 && kBlockN % 32 == 0, "the dS swizzle XORs bits 3-4 of a 32-multiple row");
  static_assert(kBlockM / 2 <= kThreads, "copy_step_vectors");
  // The host's grid check (flash_bwd_mma_block_n) and the workspace's row padding are shared with the
  // 16-bit backward.
  static_assert(kBlockN >= flash_bwd_mma_block_n(kHeadDim));
  static_assert(kFlashBwdPadM % kBlockM == 0 && kBlockM >= kFlashBwdMinBlockM);
};

namespace flash_bwd_tf32 {

using flash_mma_tf32::load_16B;
using flash_mma_tf32::mma_3xtf32;
using flash_mma_tf32::row_products;
using flash_mma_tf32::split_fragment;

// Column of dS row `row` ([query][key], kBlockN floats per row) that holds key `col`.
__device__ __forceinline__ int ds_column(int row, int col) { return col ^ (8 * ((row ^ (row >> 1)) & 3)); }

// Four n8 tiles of dims (one group of the forward's O numbering) += A B over one k8 slice: B's
// rows k = t and k = t + 4 are `even` and `odd`, component w feeding tile w.
__device__ __forceinline__ void quad_products(float (&acc)[4][4], float (&corr)[4][4], const uint32_t (&a_hi)[4],
                                              const uint32_t (&a_lo)[4], float4 even, float4 odd) {
  mma_3xtf32(acc[0], corr[0], a_hi, a_lo, even.x, odd.x);
  mma_3xtf32(acc[1], corr[1], a_hi, a_lo, even.y, odd.y);
  mma_3xtf32(acc[2], corr[2], a_hi, a_lo, even.z, odd.z);
  mma_3xtf32(acc[3], corr[3], a_hi, a_lo, even.w, odd.w);
}

// grad (n8 tiles of dims, forward numbering) += A^T B over this step's queries: A in the S^T
// accumulator layout (P^T or dS^T), B the step's Q or dO tile (value reads at b_rows, rows 2t
// and 2t + 1 of query slice 0).
template <typename Traits>
__device__ __forceinline__ void query_products(float (&grad)[Traits::kDimTiles][4],
                                               const float (&a)[Traits::kQueryTiles][4], const unsigned char* smem,
                                               const uint32_t (&b_rows)[2]) {
#pragma unroll
  for (int quad = 0; quad < Traits::kDimQuads; ++quad) {
    float step[4][4];
    zero_fill(step);
#pragma unroll
    for (int j = 0; j < Traits::kQueryTiles; ++j) {
      uint32_t a_hi[4], a_lo[4];
      split_fragment(a_hi, a_lo, a[j][0], a[j][2], a[j][1], a[j][3]);
      const uint32_t at = 128 * quad + j * 8 * Traits::kRowBytes;
      const float4 even = load_16B(smem, b_rows[0] + at);  // query 8 j + 2t: k = t
      const float4 odd = load_16B(smem, b_rows[1] + at);   // query 8 j + 2t + 1: k = t + 4
      quad_products(step, step, a_hi, a_lo, even, odd);  // corrections and main products on one accumulator
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int e = 0; e < 4; ++e) grad[4 * quad + w][e] += step[w][e];
    }
  }
}

/// \brief One block: kBlockN keys of one (batch, kv head).
template <typename Traits, bool kCausal, bool kDeterministic>
__device__ __forceinline__ void backward_block(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kQueryTiles = Traits::kQueryTiles;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = mma::shared_address(smem);
  float* ds_smem = reinterpret_cast<float*>(smem + Traits::kDsOffset);
  const float* lse_smem = reinterpret_cast<const float*>(smem + Traits::kLseOffset);
  const float* d_smem = reinterpret_cast<const float*>(smem + Traits::kDOffset);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const BackwardBlockIndex index = backward_block_index<kCausal>(kDeterministic);
  const int64_t n_block = index.n_block;
  BackwardBlock blk;
  if (!locate_backward_block<kCausal>(p, index, kBlockN, kBlockM, blk)) return;
  const int64_t n0 = blk.n0, causal_offset = blk.causal_offset, steps = blk.steps;

  flash_mma_tf32::load_tile<Traits, kBlockN, true>(base + Traits::kKOffset, blk.k_rows<float>(p), p.k_row_stride,
                                                   p.seqlen_k - n0);
  flash_mma_tf32::load_tile<Traits, kBlockN, true>(base + Traits::kVOffset, blk.v_rows<float>(p), p.v_row_stride,
                                                   p.seqlen_k - n0);

  const auto issue_step = [&](int64_t s, int buf) {
    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
    flash_mma_tf32::load_tile<Traits, kBlockM, true>(base + Traits::kQOffset + buf * Traits::kQTileBytes,
                                                     blk.q_rows<float>(p, h, m0), p.q_row_stride, p.seqlen_q - m0);
    flash_mma_tf32::load_tile<Traits, kBlockM, true>(base + Traits::kDoOffset + buf * Traits::kQTileBytes,
                                                     blk.dout_rows<float>(p, h, m0), p.do_row_stride,
                                                     p.seqlen_q - m0);
    copy_step_vectors<kBlockM>(ws, blk.workspace_row(p, ws.m_pad, h, m0),
                               base + Traits::kLseOffset + buf * Traits::kVecBytes,
                               base + Traits::kDOffset + buf * Traits::kVecBytes);
  };

  if (steps > 0) issue_step(0, 0);
  mma::commit_copies();

  float dk[Traits::kDimTiles][4];
  float dv[Traits::kDimTiles][4];
  zero_fill(dk);
  zero_fill(dv);

  const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  const int key_row = warp * 16;  // this warp's keys within the block

  // Byte offsets in the shared window. Pair reads: K rows key_row + g (+ 8) as A, Q rows g of each
  // query tile as B (V and dO likewise). Value reads (rows 2t, 2t + 1): relative to a tile.
  uint32_t k_rows[2], q_rows[2], value_rows[2];
  flash_mma_tf32::pair_offsets<Traits>(k_rows, Traits::kKOffset, key_row + g, t);
  flash_mma_tf32::pair_offsets<Traits>(q_rows, Traits::kQOffset, g, t);
  flash_mma_tf32::value_offsets<Traits>(value_rows, 0, g, t);
  constexpr uint32_t kVFromK = Traits::kVOffset - Traits::kKOffset;
  constexpr uint32_t kDoFromQ = Traits::kDoOffset - Traits::kQOffset;
  const int dq_m = warp % Traits::kDqWarpsM;  // dQ: this warp's m16 tile of query rows
  const int dq_quad0 = warp / Traits::kDqWarpsM * Traits::kDqQuadsPerWarp;  // and its first group of dims

  for (int64_t s = 0; s < steps; ++s) {
    const int buf = static_cast<int>(s & 1);
    flash_bwd::begin_step(s, steps, buf, issue_step);

    const int64_t h = blk.head(s);
    const int64_t m_index = blk.m_block(s);
    const int64_t m0 = m_index * kBlockM;
    const float* lse_row = lse_smem + buf * kBlockM;
    const float* d_row = d_smem + buf * kBlockM;
    const uint32_t step_q = buf * Traits::kQTileBytes;

    // S^T = K Q^T, then P^T in place; dP^T = V dO^T, then dS^T in place.
    // Accumulator (j, e): key n0 + key_row + g + 8 (e / 2), query m0 + 8 j + 2 t + e % 2.
    float st[kQueryTiles][4], dpt[kQueryTiles][4], corr[kQueryTiles][4];
    row_products<kQueryTiles, Traits::kDimPairs, Traits::kRowBytes>(st, corr, smem, k_rows, {q_rows[0] + step_q, q_rows[1] + step_q});
    const bool masked = backward_tile_masked<kCausal>(p, blk, kBlockN, m0);
#pragma unroll
    for (int j = 0; j < kQueryTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + e % 2;
        st[j][e] = backward_probability<kCausal>(st[j][e], scale_log2, lse_row[col], masked,
                                                 n0 + key_row + g + 8 * (e / 2), m0 + col, p, causal_offset);
      }
    }
    row_products<kQueryTiles, Traits::kDimPairs, Traits::kRowBytes>(dpt, corr, smem, {k_rows[0] + kVFromK, k_rows[1] + kVFromK},
                         {q_rows[0] + step_q + kDoFromQ, q_rows[1] + step_q + kDoFromQ});
#pragma unroll
    for (int j = 0; j < kQueryTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + e % 2;
        dpt[j][e] = st[j][e] * (dpt[j][e] - d_row[col]);
        ds_smem[col * kBlockN + ds_column(col, key_row + g + 8 * (e / 2))] = dpt[j][e];
      }
    }

    // dV += P^T dO, dK += dS^T Q.
    const uint32_t q_values[2] = {value_rows[0] + Traits::kQOffset + step_q, value_rows[1] + Traits::kQOffset + step_q};
    query_products<Traits>(dv, st, smem, {q_values[0] + kDoFromQ, q_values[1] + kDoFromQ});
    query_products<Traits>(dk, dpt, smem, q_values);
    __syncthreads();  // dS complete

    // dQ (kBlockM x kHeadDim) += dS K: this warp's 16 query rows x kDqQuadsPerWarp groups of 32 dims.
    float* dq_rows = ws.dq_accum + (blk.workspace_row(p, ws.m_pad, h, m0) + 16 * dq_m) * kHeadDim;
    int* semaphore = kDeterministic ? ws.semaphores + blk.workspace_row(p, ws.m_pad, h, m0) / kBlockM : nullptr;
    if constexpr (kDeterministic) {
      flash_bwd::wait_for_dq_turn<kCausal>(semaphore, n_block, m_index, kBlockM, kBlockN, causal_offset);
    }
    const int row_top = 16 * dq_m + g;
#pragma unroll
    for (int qi = 0; qi < Traits::kDqQuadsPerWarp; ++qi) {
      const int quad = dq_quad0 + qi;
      float acc[4][4], acc_corr[4][4];
      zero_fill(acc);
      zero_fill(acc_corr);
#pragma unroll
      for (int ks = 0; ks < Traits::kKeySlices; ++ks) {
        const float2 top = *reinterpret_cast<const float2*>(ds_smem + row_top * kBlockN +
                                                            ds_column(row_top, 8 * ks + 2 * t));
        const float2 bottom = *reinterpret_cast<const float2*>(ds_smem + (row_top + 8) * kBlockN +
                                                               ds_column(row_top + 8, 8 * ks + 2 * t));
        uint32_t a_hi[4], a_lo[4];
        split_fragment(a_hi, a_lo, top.x, bottom.x, top.y, bottom.y);
        const uint32_t at = Traits::kKOffset + 128 * quad + ks * 8 * Traits::kRowBytes;
        const float4 even = load_16B(smem, value_rows[0] + at);  // key 8 ks + 2t: k = t
        const float4 odd = load_16B(smem, value_rows[1] + at);   // key 8 ks + 2t + 1: k = t + 4
        quad_products(acc, acc_corr, a_hi, a_lo, even, odd);
      }
      // Thread (g, t) holds dims 32 quad + 4t .. + 3 (accumulator 0 of the four tiles) and
      // 32 quad + 16 + 4t .. + 3 (accumulator 1) of row g; 2 and 3: row g + 8.
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2);
        const int dim = 32 * quad + 16 * (e % 2) + 4 * t;
        const float4 sum = make_float4(acc[0][e] + acc_corr[0][e], acc[1][e] + acc_corr[1][e],
                                       acc[2][e] + acc_corr[2][e], acc[3][e] + acc_corr[3][e]);
        add_dq_16B<kDeterministic>(reinterpret_cast<float4*>(dq_rows + row * kHeadDim + dim), sum);
      }
    }
    if constexpr (kDeterministic) flash_bwd::pass_turn(semaphore);
  }
  mma::wait_copies<0>();  // with no step, K and V were loaded for nothing: never exit with copies in flight

  // dK (times softmax_scale) and dV: 16 B stores of four dims, as dQ's.
  const float scale = static_cast<float>(p.softmax_scale);
  float* dk_out = static_cast<float*>(p.dk) + blk.b * p.dk_batch_stride + blk.h_kv * p.dk_head_stride;
  float* dv_out = static_cast<float*>(p.dv) + blk.b * p.dv_batch_stride + blk.h_kv * p.dv_head_stride;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t key = n0 + key_row + g + 8 * half;
    if (key < p.seqlen_k) {
#pragma unroll
      for (int quad = 0; quad < Traits::kDimQuads; ++quad) {
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          const int e = 2 * half + odd;
          const int dim = 32 * quad + 16 * odd + 4 * t;
          *reinterpret_cast<float4*>(dk_out + key * p.dk_row_stride + dim) =
              make_float4(dk[4 * quad][e] * scale, dk[4 * quad + 1][e] * scale, dk[4 * quad + 2][e] * scale,
                          dk[4 * quad + 3][e] * scale);
          *reinterpret_cast<float4*>(dv_out + key * p.dv_row_stride + dim) =
              make_float4(dv[4 * quad][e], dv[4 * quad + 1][e], dv[4 * quad + 2][e], dv[4 * quad + 3][e]);
        }
      }
    }
  }
}

}  // namespace flash_bwd_tf32

/// \brief The main 3xTF32 backward kernel; grid (key blocks, batch * heads_kv folded over y and z).
template <int kHeadDim, bool kCausal, bool kDeterministic>
__global__ void __launch_bounds__(FlashBwdMmaTf32Traits<kHeadDim>::kThreads,
                                  FlashBwdMmaTf32Traits<kHeadDim>::kMinBlocksPerSm)
    flash_bwd_mma_tf32_kernel(const __grid_constant__ AttentionBackwardParams p, const FlashBwdWorkspace ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and tf32 mma need sm_80; the registry's min_cc refuses older devices
#else
  flash_bwd_tf32::backward_block<FlashBwdMmaTf32Traits<kHeadDim>, kCausal, kDeterministic>(p, ws);
#endif
}

/// \brief Launches preprocess, main and convert kernels of the fp32 backward on `stream`
/// (params.device_id current) over `workspace` (flash_bwd_mma_workspace_bytes).
template <int kHeadDim>
Status launch_flash_bwd_mma_tf32(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  using Traits = FlashBwdMmaTf32Traits<kHeadDim>;
  return launch_flash_backward<float, kHeadDim, Traits::kBlockM>(p, workspace, stream, [&](const FlashBwdWorkspace& ws) {
    dim3 grid;
    if (Status s = backward_grid(p, Traits::kBlockN, "mma", &grid); !s.ok()) return s;
    return with_backward_flags(p, [&](auto causal, auto deterministic) {
      const auto kernel =
          flash_bwd_mma_tf32_kernel<kHeadDim, decltype(causal)::value, decltype(deterministic)::value>;
      return launch_backward_main(kernel, p, ws, grid, Traits::kThreads, Traits::kSmemBytes, stream,
                                  "flash_bwd_mma_tf32_kernel launch");
    });
  });
}

}  // namespace waveboost::cuda
