// Hopper flash attention backward on warpgroup MMA (backend "wgmma", sm_90a only).
//
// The algorithm and the workspace of the mma.sync backward (flash_bwd_mma.cuh: preprocess D and
// lse * log2(e), main, convert dQ), with the main kernel's five products on wgmma. One block owns
// kBlockN = 128 keys of one (batch, kv head) and runs two warpgroups of 64 keys each (wgmma's M);
// K and V stay in shared memory, dK and dV in registers, while the query blocks of every query head
// of the group stream by, kBlockM = 64 rows at a time (Q, dO, lse, D double-buffered by cp.async):
//
//   S^T  = K Q^T          m64n64k16, K rows (the warpgroup's) and Q rows from shared memory, K-major
//   dP^T = V dO^T         likewise
//   P^T  = exp2(c log2(e) S^T - lse log2(e)),  dS^T = P^T (dP^T - D)      in registers
//   dV  += P^T dO         m64nDk16, P^T from registers (the accumulator layout is the A fragment
//   dK  += dS^T Q         layout), dO / Q from shared memory MN-major (imm-trans-b)
//   dQ  += dS K           over the warpgroup's own 64 keys: dS^T (stored [key][query], one
//                         128 B-swizzled row per key) is dS MN-major (imm-trans-a), K MN-major
//                         (imm-trans-b); 64-column passes; fp32 reductions into the accumulator
//
// Each warpgroup adds its own keys' share of dQ (no block barrier between the dS^T store and
// the dQ product, only the warpgroup's named barrier). Tiles use the forward's 128 B-swizzled
// panels (flash_wgmma.cuh), so its copy and descriptor helpers apply unchanged.
//
// That is the first kernel (flash_bwd_wgmma_kernel, WAVEBOOST_WGMMA_BACKWARD=cp.async). The
// default is the warp-specialized one further down (flash_bwd_wgmma_ws_kernel): the same
// products and tiles, with a TMA producer warp instead of the consumers' copies and block
// barrier, and dQ computed once per block and added by a writer warp's bulk reductions.
#pragma once

#include <cstdint>

#include "waveboost/cuda/flash_bwd_mma.cuh"
#include "waveboost/cuda/flash_wgmma.cuh"
#include "waveboost/cuda/tma_primitives.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the wgmma backward.
template <typename Element_, int kHeadDim_>
struct FlashBwdWgmmaTraits : BackwardSmemLayout<128, 64, kHeadDim_, 2> {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kKeysPerWarpgroup = 64;            // wgmma's M
  static constexpr int kBlockN = kWarpgroups * kKeysPerWarpgroup;
  static constexpr int kBlockM = 64;                       // query rows per step: N of S^T and dP^T
  static constexpr int kRowBytes = 128;                    // one 128 B swizzle row
  static constexpr int kPanelCols = 64;
  static constexpr int kChunk = 8;                         // elements per 16 B
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;
  static constexpr int kDimSlices = kHeadDim / 16;         // k16 slices of S^T and dP^T
  static constexpr int kQuerySlices = kBlockM / 16;        // k16 slices of dV and dK
  static constexpr int kKeySlices = kKeysPerWarpgroup / 16;  // k16 slices of one warpgroup's dQ share
  static constexpr int kDqPasses = kHeadDim / 64;          // 64-column passes of dQ

  static constexpr int kAtomBytes = 1024;
  // BackwardSmemLayout's tiles on 1024 B boundaries (kAtomBytes more for aligning the window).
  using Layout = BackwardSmemLayout<128, 64, kHeadDim_, 2>;
  static constexpr int kSmemBytes = Layout::kLayoutBytes + kAtomBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(Layout::kKVTileBytes == kBlockN * kHeadDim * 2 && Layout::kQTileBytes == kBlockM * kHeadDim * 2);
  static_assert(kBlockM * 2 == kRowBytes, "a dS^T row (kBlockM queries) is one 128 B swizzle row");
  static_assert(kRowsPerCopyPass % 8 == 0 && kBlockM % kRowsPerCopyPass == 0 && kBlockN % kRowsPerCopyPass == 0);
  static_assert(Layout::kQTileBytes % kAtomBytes == 0 && Layout::kKVTileBytes % kAtomBytes == 0 &&
                Layout::kDsTileBytes % kAtomBytes == 0);
};

namespace flash_bwd_wgmma {

// 16-bit pair of the fp32 accumulators (j, j + 1) of 8-column group i: the A fragment of k16
// slice ks is {pair(2 ks, 0), pair(2 ks, 2), pair(2 ks + 1, 0), pair(2 ks + 1, 2)} (as the
// forward's P, core/softmax.cuh).
template <typename Element, int kSlices>
__device__ __forceinline__ void pack_a(const float (&acc)[kSlices * 8], uint32_t (&a)[kSlices][4]) {
#pragma unroll
  for (int ks = 0; ks < kSlices; ++ks) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = 2 * ks + r / 2;   // 8-column group
      const int j = 2 * (r % 2);      // rows g (0) or g + 8 (2)
      a[ks][r] = pack_pair<Element>(acc[4 * i + j], acc[4 * i + j + 1]);
    }
  }
}

// ---- The per-step pieces both main kernels run (a warpgroup's 64 keys x kBlockM queries) ----

/// \brief K-major operand descriptor (K or V rows as A; Q or dO rows as B): 8-row groups 1024 B
/// apart; k16 slice kk sits in panel kk / 4, 32 B * (kk % 4) into each row.
template <typename Traits>
__device__ __forceinline__ uint64_t kmajor_slice(uint32_t tile, int rows, int kk) {
  // One descriptor of the tile, moved by a compile-time offset per slice: the tile's descriptor is
  // built once per call and each slice costs one add.
  return wgmma::advance(wgmma::descriptor_128b(tile, 16, 8 * Traits::kRowBytes),
                        static_cast<uint32_t>((kk / 4) * rows * Traits::kRowBytes + (kk % 4) * 32));
}

/// \brief Issues acc = A B^T over head_dim as one commit group, not waited for: S^T = K Q^T (a_rows
/// the warpgroup's K rows, b_rows the step's Q rows) or dP^T = V dO^T.
template <typename Traits>
__device__ __forceinline__ void issue_transposed(float (&acc)[32], uint32_t a_rows, uint32_t b_rows) {
  using Element = typename Traits::Element;
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < Traits::kDimSlices; ++kk) {
    const uint64_t a = kmajor_slice<Traits>(a_rows, Traits::kBlockN, kk);
    const uint64_t b = kmajor_slice<Traits>(b_rows, Traits::kBlockM, kk);
    if (kk == 0) {
      wgmma::mma_m64n64k16_ss<Element, false>(acc, a, b);
    } else {
      wgmma::mma_m64n64k16_ss<Element, true>(acc, a, b);
    }
  }
  wgmma::commit_group();
}

/// \brief Issues dK += dS^T Q (m64nDk16, dS^T from registers, Q MN-major) as one commit group.
template <typename Traits>
__device__ __forceinline__ void issue_dk(float (&dk)[Traits::kHeadDim / 2], uint32_t (&dst)[Traits::kQuerySlices][4],
                                         uint64_t q_b, uint32_t stage_bytes) {
  wgmma::fence_operands(dk);
  wgmma::fence_operands(dst);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < Traits::kQuerySlices; ++ks) {
    wgmma::mma_m64nNk16_rs_tb<typename Traits::Element, Traits::kHeadDim>(
        dk, dst[ks], wgmma::advance(q_b, stage_bytes + ks * 16 * Traits::kRowBytes));
  }
  wgmma::commit_group();
}

/// \brief The rest of a step's four products, S^T = K Q^T already issued (issue_transposed, the
/// last group in flight), with the warpgroup's elementwise work between them, so that the
/// tensor cores have a product in flight while the warpgroup computes:
///
///   issue dP^T = V dO^T
///   wait for S^T             -> P^T in place of S^T (exponentials under dP^T)
///   issue dV += P^T dO
///   wait for dP^T            -> dS^T = P^T (dP^T - D) (under dV)
///   issue dK += dS^T Q       (committed, not waited for; left to the caller when !kIssueDk)
///
/// v_rows: the warpgroup's V rows in shared memory; do_tile: the step's dO (K-major, the B
/// operand of dP^T); do_b / q_b: MN-major descriptors of the first Q / dO buffer, stage_bytes:
/// the step's buffer offset. Accumulator 4 i + 2 hh + e of S^T and dP^T: key key_row + g + 8 hh,
/// query m0 + 8 i + 2 t + e. pt / dst: the A fragments the dV and dK products read; the caller
/// keeps them (and dv, dk) untouched until it waits for them.
template <typename Traits, bool kCausal, bool kIssueDk = true>
__device__ __forceinline__ void step_products(float (&st)[32], float (&dv)[Traits::kHeadDim / 2],
                                              float (&dk)[Traits::kHeadDim / 2],
                                              uint32_t (&pt)[Traits::kQuerySlices][4],
                                              uint32_t (&dst)[Traits::kQuerySlices][4], uint32_t v_rows,
                                              uint32_t do_tile, uint64_t do_b, uint64_t q_b, uint32_t stage_bytes,
                                              const AttentionBackwardParams& p, const BackwardBlock& blk, int64_t m0,
                                              int key_row, int g, int t, float scale_log2, const float* lse_row,
                                              const float* d_row) {
  using Element = typename Traits::Element;
  float dpt[32];
  issue_transposed<Traits>(dpt, v_rows, do_tile);

  // P^T (masked, core/backward.cuh's backward_probability) while dP^T runs.
  wgmma::wait_group<1>();
  wgmma::fence_operands(st);
  with_step_mask<true>(backward_tile_masked<kCausal>(p, blk, Traits::kBlockN, m0), [&](auto masked) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // The pair of queries 8 i + 2 t, + 1 in one 8-byte load (the rows are 16 B aligned).
      const float2 lse = *reinterpret_cast<const float2*>(lse_row + 8 * i + 2 * t);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = 8 * i + 2 * t + (j % 2);
        st[4 * i + j] = backward_probability<kCausal>(st[4 * i + j], scale_log2, j % 2 ? lse.y : lse.x, bool(masked),
                                                      blk.n0 + key_row + g + 8 * (j / 2), m0 + col, p,
                                                      blk.causal_offset);
      }
    }
  });
  pack_a<Element, Traits::kQuerySlices>(st, pt);

  // dV += P^T dO (m64nDk16, P^T from registers, dO MN-major).
  wgmma::fence_operands(dv);
  wgmma::fence_operands(pt);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < Traits::kQuerySlices; ++ks) {
    wgmma::mma_m64nNk16_rs_tb<Element, Traits::kHeadDim>(
        dv, pt[ks], wgmma::advance(do_b, stage_bytes + ks * 16 * Traits::kRowBytes));
  }
  wgmma::commit_group();

  // dS^T = P^T (dP^T - D) while dV runs.
  wgmma::wait_group<1>();
  wgmma::fence_operands(dpt);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 d = *reinterpret_cast<const float2*>(d_row + 8 * i + 2 * t);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dpt[4 * i + j] = st[4 * i + j] * (dpt[4 * i + j] - (j % 2 ? d.y : d.x));
    }
  }
  pack_a<Element, Traits::kQuerySlices>(dpt, dst);
  if constexpr (kIssueDk) issue_dk<Traits>(dk, dst, q_b, stage_bytes);
}

/// \brief This warp's dS^T rows to shared memory, [key][query], one 128 B row per key, 16 B
/// chunks swizzled by row: queries 8 c .. 8 c + 7 are chunk c. One stmatrix per k16 slice: the
/// slice's A fragment (dst[ks]) is a 16 x 16 tile of rows key_row.., chunks 2 ks and 2 ks + 1, and
/// lane l gives the address of row key_row + l % 16, chunk 2 ks + l / 16 (swizzled: XOR row % 8).
/// With 1024 B-aligned tiles the chunk bits of that address are (l / 16) ^ (l % 8) XOR 2 ks, so one
/// lane address serves the four slices. Followed by the async-proxy fence (wgmma reads the tile).
template <typename Traits>
__device__ __forceinline__ void store_ds_rows(uint32_t ds_tile, const uint32_t (&dst)[Traits::kQuerySlices][4],
                                              int key_row) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const uint32_t lane_addr = ds_tile + static_cast<uint32_t>((key_row + lane % 16) * Traits::kRowBytes +
                                                             (((lane / 16) ^ (lane % 8)) * 16));
#pragma unroll
  for (int ks = 0; ks < Traits::kQuerySlices; ++ks) {
    mma::store_matrix_x4(lane_addr ^ static_cast<uint32_t>(32 * ks), dst[ks][0], dst[ks][1], dst[ks][2], dst[ks][3]);
  }
  wgmma::fence_proxy_async();
}

template <typename Traits, bool kCausal>
__device__ __forceinline__ void backward_block(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kRowBytes = Traits::kRowBytes;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_address = mma::shared_address(smem_raw);
  const uint32_t align_pad = (Traits::kAtomBytes - raw_address % Traits::kAtomBytes) % Traits::kAtomBytes;
  unsigned char* const smem = smem_raw + align_pad;
  const uint32_t base = raw_address + align_pad;
  const uint32_t k_tile = base + Traits::kKOffset;
  const uint32_t v_tile = base + Traits::kVOffset;
  const uint32_t ds_tile = base + Traits::kDsOffset;
  const float* lse_smem = reinterpret_cast<const float*>(smem + Traits::kLseOffset);
  const float* d_smem = reinterpret_cast<const float*>(smem + Traits::kDOffset);

  const int warpgroup = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  BackwardBlock blk;
  if (!locate_backward_block<kCausal>(p, backward_block_index<kCausal>(false), kBlockN, kBlockM, blk)) return;
  const int64_t n0 = blk.n0, steps = blk.steps;

  const Element* k = blk.k_rows<Element>(p);
  const Element* v = blk.v_rows<Element>(p);
  flash_wgmma::load_tile<Traits, kBlockN, true>(k_tile, k, p.k_row_stride, p.seqlen_k - n0);
  flash_wgmma::load_tile<Traits, kBlockN, true>(v_tile, v, p.v_row_stride, p.seqlen_k - n0);

  const auto issue_step = [&](int64_t s, int buf) {
    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
    const Element* q = blk.q_rows<Element>(p, h, m0);
    const Element* dout = blk.dout_rows<Element>(p, h, m0);
    flash_wgmma::load_tile<Traits, kBlockM, true>(base + Traits::kQOffset + buf * Traits::kQTileBytes, q,
                                                  p.q_row_stride, p.seqlen_q - m0);
    flash_wgmma::load_tile<Traits, kBlockM, true>(base + Traits::kDoOffset + buf * Traits::kQTileBytes, dout,
                                                  p.do_row_stride, p.seqlen_q - m0);
    static_assert(kBlockM / 2 <= Traits::kThreads);
    copy_step_vectors<kBlockM>(ws, blk.workspace_row(p, ws.m_pad, h, m0),
                               base + Traits::kLseOffset + buf * Traits::kVecBytes,
                               base + Traits::kDOffset + buf * Traits::kVecBytes);
  };

  if (steps > 0) issue_step(0, 0);
  mma::commit_copies();

  float dk[kHeadDim / 2];
  float dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  const int key_row = warpgroup * Traits::kKeysPerWarpgroup + warp * 16;  // this warp's 16 keys within the block

  // This warpgroup's K and V rows (the A operands of S^T and dP^T; step_products).
  const uint32_t kv_a_rows = warpgroup * Traits::kKeysPerWarpgroup * kRowBytes;
  // MN-major operands (dO and Q as the B of dV and dK, K as the B of dQ, dS^T as the A of dQ):
  // groups of 8 k rows 1024 B apart, 64-column panels rows * 128 B apart.
  const uint64_t do_b = wgmma::descriptor_128b(base + Traits::kDoOffset, kBlockM * kRowBytes, 8 * kRowBytes);
  const uint64_t q_b = wgmma::descriptor_128b(base + Traits::kQOffset, kBlockM * kRowBytes, 8 * kRowBytes);
  const uint64_t ds_a = wgmma::descriptor_128b(ds_tile + kv_a_rows, kBlockN * kRowBytes, 8 * kRowBytes);
  const uint64_t k_b = wgmma::descriptor_128b(k_tile + kv_a_rows, kBlockN * kRowBytes, 8 * kRowBytes);

  for (int64_t s = 0; s < steps; ++s) {
    const int buf = static_cast<int>(s & 1);
    mma::wait_copies<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // step s's tiles visible to both warpgroups; both are done with step s - 1
    if (s + 1 < steps) issue_step(s + 1, buf ^ 1);  // the other buffers: last read in step s - 1
    mma::commit_copies();

    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
    const float* lse_row = lse_smem + buf * kBlockM;
    const float* d_row = d_smem + buf * kBlockM;
    const uint32_t q_tile = base + Traits::kQOffset + buf * Traits::kQTileBytes;
    const uint32_t do_tile = base + Traits::kDoOffset + buf * Traits::kQTileBytes;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys x kBlockM queries, then P^T and
    // dS^T in their place.
    // dV += P^T dO, dK += dS^T Q issued (they run while dS^T goes to shared memory).
    float st[32];
    uint32_t pt[Traits::kQuerySlices][4];
    uint32_t dst[Traits::kQuerySlices][4];
    issue_transposed<Traits>(st, k_tile + kv_a_rows, q_tile);
    step_products<Traits, kCausal>(st, dv, dk, pt, dst, v_tile + kv_a_rows, do_tile, do_b, q_b,
                                   buf * Traits::kQTileBytes, p, blk, m0, key_row, g, t, scale_log2, lse_row, d_row);
    store_ds_rows<Traits>(ds_tile, dst, key_row);
    tma::named_barrier_sync(1 + warpgroup, 128);  // the warpgroup's dS^T rows complete

    // dQ (kBlockM x kHeadDim) += dS K over this warpgroup's keys, 64 columns per pass.
    float* dq_rows = ws.dq_accum + (blk.workspace_row(p, ws.m_pad, h, m0) + warp * 16) * kHeadDim;
#pragma unroll
    for (int pass = 0; pass < Traits::kDqPasses; ++pass) {
      float dq[32];
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < Traits::kKeySlices; ++ks) {
        const uint64_t a = wgmma::advance(ds_a, ks * 16 * kRowBytes);
        const uint64_t bk = wgmma::advance(k_b, pass * kBlockN * kRowBytes + ks * 16 * kRowBytes);
        if (ks == 0) {
          wgmma::mma_m64n64k16_ss_tt<Element, false>(dq, a, bk);
        } else {
          wgmma::mma_m64n64k16_ss_tt<Element, true>(dq, a, bk);
        }
      }
      wgmma::commit_group();
      wgmma::wait_group<0>();
      wgmma::fence_operands(dq);
      // Accumulator 4 i + 2 hh + e: query row warp * 16 + g + 8 hh, dim 64 pass + 8 i + 2 t + e;
      // one 16 B reduction of four consecutive dims per thread (dq_quad).
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const DqQuad quad = dq_quad(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3], g, t);
        reduce_add_16B(reinterpret_cast<float4*>(dq_rows + quad.row * kHeadDim + 64 * pass + 8 * i + quad.col),
                       quad.sum);
      }
    }
    // P^T and dS^T were read by the dV and dK products until the wait above: kept live to here,
    // so that no later value takes their registers while those products run.
    wgmma::fence_operands(pt);
    wgmma::fence_operands(dst);
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
  }
  mma::wait_copies<0>();  // with no step, K and V were loaded for nothing: never exit with copies in flight

  store_key_rows<Element, kHeadDim / 8>(p, blk, n0 + key_row, 0, g, t, [&](int i, int j) { return dk[4 * i + j]; },
                                        [&](int i, int j) { return dv[4 * i + j]; });
}

}  // namespace flash_bwd_wgmma

/// \brief The main wgmma backward kernel; grid (key blocks, batch * heads_kv folded over y and z).
template <typename Element, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(FlashBwdWgmmaTraits<Element, kHeadDim>::kThreads, 1)
    flash_bwd_wgmma_kernel(const __grid_constant__ AttentionBackwardParams p, const FlashBwdWorkspace ws) {
  flash_bwd_wgmma::backward_block<FlashBwdWgmmaTraits<Element, kHeadDim>, kCausal>(p, ws);
}


// ---------------------------------------------------------------------------
// The warp-specialized kernel (the default; WAVEBOOST_WGMMA_BACKWARD=cp.async selects the one
// above): the same per-step products, with
//   - a producer warp (warpgroup 2, warp 0) loading K and V once and, per step, Q and dO by
//     TMA (128 B-swizzled boxes, the layout the descriptors above read; rows past the sequence
//     arrive as zeros) and the lse / D rows by bulk copies, into a ring of kStages buffers
//     behind "full" / "empty" mbarriers: no block barrier per step;
//   - dQ of a step computed once per block over all kBlockN keys: at head_dim 128 each consumer
//     warpgroup takes 64 of the columns (issued before dK, and handed over while dK runs), at
//     head_dim 64 one warpgroup takes the whole tile on alternate steps (the other goes on to its
//     next step; handed over under the next step's S^T); so every dQ element of a step is
//     added to the fp32 accumulator once per block instead of once per warpgroup. The sums go
//     to a shared fp32 tile (128 B-swizzled boxes of 32 columns) that a writer warp (warpgroup
//     2, warp 1) adds to the accumulator with one tensor bulk reduction per box
//     (cp.reduce.async.bulk.tensor ... add) while the consumers go on (kDqBulk), or the
//     consumers add them by 16 B reductions themselves (!kDqBulk: slower at both head dims,
//     benchmarks/NOTES.md; kept for measurement, not instantiated by the launcher).
// The dS^T tile is double-buffered: both warpgroups' rows must be in it before a dQ product
// reads it, and a warpgroup writes step s + 1's rows while the other may still read step s's.
//
// Named barriers (0 is __syncthreads, used once before the roles part):
//   1 + (s & 1)   dS^T of step s complete (the 256 consumer threads)
//   3             the dQ tile of a step written (its writers arrive, the writer warp waits)
//   4             the dQ tile read by the bulk reductions (the writer warp arrives, the next
//                 step's writers wait)
// ---------------------------------------------------------------------------

/// \brief The wgmma backward traits plus the ring, the dQ tile and the thread roles.
template <typename Element_, int kHeadDim_>
struct FlashBwdWgmmaWsTraits : FlashBwdWgmmaTraits<Element_, kHeadDim_> {
  using Base = FlashBwdWgmmaTraits<Element_, kHeadDim_>;
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = Base::kThreads;  // warpgroups 0 and 1
  static constexpr int kBlockThreads = kConsumerThreads + 128;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kConsumerRegisters * kConsumerThreads + kProducerRegisters * 128 <= 65536, "register file");
  // head_dim 128: each warpgroup 64 dQ columns per step; head_dim 64: one warpgroup per step.
  static constexpr bool kDqSplitColumns = kHeadDim_ == 128;
  // Order of a step's last products (benchmarks/NOTES.md, "The wgmma backward's dQ before dK"):
  // at head_dim 128 dQ is issued before dK and handed to the writer warp while dK runs; at 64
  // dK goes first and a step's dQ is handed over under the next step's S^T (dQ first measured
  // 0.92-0.99x there, 1.01-1.05x at 128).
  static constexpr bool kDqBeforeDk = kHeadDim_ == 128;
  static constexpr int kDqWriters = kDqSplitColumns ? kConsumerThreads : 128;
  // The dQ tile: kHeadDim / 32 boxes of kBlockM rows x 32 floats (128 B) in the 128 B swizzle,
  // the boxes of the accumulator's tensor map (one bulk reduction each).
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqBoxes = kHeadDim_ / kDqBoxCols;
  static constexpr int kDqBoxBytes = Base::kBlockM * kDqBoxCols * 4;
  static constexpr int kDqTileBytes = kDqBoxes * kDqBoxBytes;
  static constexpr int kStepBytes = 2 * Base::kQTileBytes + 2 * Base::kVecBytes;  // one ring stage
  // K, V, Q[kStages], dO[kStages], dS^T[2], dQ, lse[kStages], D[kStages], barriers.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + Base::kKVTileBytes;
  static constexpr int kQOffset = kVOffset + Base::kKVTileBytes;
  static constexpr int kDoOffset = kQOffset + kStages * Base::kQTileBytes;
  static constexpr int kDsOffset = kDoOffset + kStages * Base::kQTileBytes;
  static constexpr int kDqOffset = kDsOffset + 2 * Base::kDsTileBytes;
  static constexpr int kLseOffset = kDqOffset + kDqTileBytes;
  static constexpr int kDOffset = kLseOffset + kStages * Base::kVecBytes;
  static constexpr int kBarrierOffset = kDOffset + kStages * Base::kVecBytes;
  static constexpr int kBarrierBytes = (1 + 2 * kStages) * 8;  // kv_full, full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kBarrierOffset + kBarrierBytes + Base::kAtomBytes;
  static constexpr int kPanels = kHeadDim_ / Base::kPanelCols;
  static_assert(kDqOffset % 1024 == 0 && kDqBoxBytes % 1024 == 0, "swizzled boxes on 1024 B boundaries");
  static_assert(kLseOffset % 16 == 0, "bulk copies: 16 B aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

namespace flash_bwd_wgmma_ws {

enum NamedBarrier : int { kDsFirst = 1, kDqFull = 3, kDqEmpty = 4 };

template <typename Traits>
struct Smem {
  uint32_t base;
  __device__ __forceinline__ uint32_t k_tile() const { return base + Traits::kKOffset; }
  __device__ __forceinline__ uint32_t v_tile() const { return base + Traits::kVOffset; }
  __device__ __forceinline__ uint32_t q_tile(int stage) const { return base + Traits::kQOffset + stage * Traits::kQTileBytes; }
  __device__ __forceinline__ uint32_t do_tile(int stage) const { return base + Traits::kDoOffset + stage * Traits::kQTileBytes; }
  __device__ __forceinline__ uint32_t ds_tile(int buf) const { return base + Traits::kDsOffset + buf * Traits::kDsTileBytes; }
  __device__ __forceinline__ uint32_t dq_tile() const { return base + Traits::kDqOffset; }
  __device__ __forceinline__ uint32_t lse(int stage) const { return base + Traits::kLseOffset + stage * Traits::kVecBytes; }
  __device__ __forceinline__ uint32_t d(int stage) const { return base + Traits::kDOffset + stage * Traits::kVecBytes; }
  __device__ __forceinline__ uint32_t kv_full() const { return base + Traits::kBarrierOffset; }
  __device__ __forceinline__ uint32_t full(int stage) const { return base + Traits::kBarrierOffset + 8 * (1 + stage); }
  __device__ __forceinline__ uint32_t empty(int stage) const {
    return base + Traits::kBarrierOffset + 8 * (1 + Traits::kStages + stage);
  }
};

/// \brief The tensor maps of the producer's loads: Q and dO (head_dim, seqlen_q, heads, batch),
/// K and V (head_dim, seqlen_k, heads_kv, batch); boxes of 64 columns x kBlockM (Q, dO) or
/// kBlockN (K, V) rows in the 128 B swizzle; and of the dQ writer's reductions: the fp32
/// accumulator as (head_dim, batch * heads * m_pad rows), boxes of 32 columns x kBlockM rows in
/// the 128 B swizzle.
struct BackwardMaps {
  CUtensorMap q, dout, k, v, dq_accum;
};

// Producer: K and V, then for every step its Q, dO, lse and D rows into stage s % kStages
// once the consumers have released that stage.
template <typename Traits>
__device__ __forceinline__ void produce(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws,
                                        const BackwardMaps& maps, const BackwardBlock& blk, const Smem<Traits>& sm) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRowBytes = Traits::kRowBytes;
  tma::prefetch_map(&maps.q);
  tma::prefetch_map(&maps.dout);
  const int b = static_cast<int>(blk.b);
  tma::arrive_expect_tx(sm.kv_full(), 2 * Traits::kKVTileBytes);
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
    const int n0 = static_cast<int>(blk.n0);
    tma::load_4d(sm.k_tile() + panel * kBlockN * kRowBytes, &maps.k, sm.kv_full(), panel * Traits::kPanelCols, n0,
                 static_cast<int>(blk.h_kv), b);
    tma::load_4d(sm.v_tile() + panel * kBlockN * kRowBytes, &maps.v, sm.kv_full(), panel * Traits::kPanelCols, n0,
                 static_cast<int>(blk.h_kv), b);
  }
  for (int64_t s = 0; s < blk.steps; ++s) {
    const int stage = static_cast<int>(s % Traits::kStages);
    const uint32_t phase = static_cast<uint32_t>((s / Traits::kStages) & 1);
    tma::wait(sm.empty(stage), phase ^ 1);
    tma::arrive_expect_tx(sm.full(stage), Traits::kStepBytes);
    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
#pragma unroll
    for (int panel = 0; panel < Traits::kPanels; ++panel) {
      tma::load_4d(sm.q_tile(stage) + panel * kBlockM * kRowBytes, &maps.q, sm.full(stage), panel * Traits::kPanelCols,
                   static_cast<int>(m0), static_cast<int>(h), b);
      tma::load_4d(sm.do_tile(stage) + panel * kBlockM * kRowBytes, &maps.dout, sm.full(stage),
                   panel * Traits::kPanelCols, static_cast<int>(m0), static_cast<int>(h), b);
    }
    const int64_t row0 = blk.workspace_row(p, ws.m_pad, h, m0);
    tma::load_bulk(sm.lse(stage), ws.lse_log2 + row0, Traits::kVecBytes, sm.full(stage));
    tma::load_bulk(sm.d(stage), ws.d_rows + row0, Traits::kVecBytes, sm.full(stage));
  }
}

// Writer warp: per step, once the dQ tile is complete, one bulk reduction per box (issued by
// lane 0) into the fp32 accumulator; the tile is released once they have read it. Deterministic
// (ws.semaphores): lane 0 first waits for the block's turn at the query block (dq_turn), and counts
// it once the reductions have completed, after the tile is released.
template <typename Traits, bool kCausal>
__device__ __forceinline__ void write_dq(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws,
                                         const BackwardMaps& maps, const BackwardBlock& blk, int64_t n_block,
                                         const Smem<Traits>& sm, int lane) {
  constexpr int kThreads = 32 + Traits::kDqWriters;
  // The steps in order (query head by query head, the query blocks of each) on 32-bit counters
  // (the launcher checks that steps and accumulator rows fit), without the 64-bit divisions of
  // BackwardBlock::head and m_block: this warp runs on few registers.
  const int steps = static_cast<int>(blk.steps);
  const int m_count = static_cast<int>(blk.m_count);
  const int m_pad = static_cast<int>(ws.m_pad);
  int head_row = static_cast<int>(blk.workspace_row(p, ws.m_pad, blk.head(0), blk.m_begin * Traits::kBlockM));
  if (lane == 0) tma::prefetch_map(&maps.dq_accum);
  for (int s = 0; s < steps; head_row += m_pad) {
    int row = head_row;
    for (int m = 0; m < m_count; ++m, ++s, row += Traits::kBlockM) {
      int* const semaphore = ws.semaphores != nullptr ? ws.semaphores + row / Traits::kBlockM : nullptr;
      if (semaphore != nullptr && lane == 0) {
        spin_until_turn(semaphore, dq_turn<kCausal>(n_block, blk.m_begin + m, Traits::kBlockM, Traits::kBlockN,
                                                    blk.causal_offset));
        tma::fence_proxy_async_global();  // the reductions below come after the acquire
      }
      tma::named_barrier_sync(kDqFull, kThreads);
      if (lane == 0) {
#pragma unroll
        for (int box = 0; box < Traits::kDqBoxes; ++box) {
          tma::reduce_add_2d(&maps.dq_accum, sm.dq_tile() + box * Traits::kDqBoxBytes, box * Traits::kDqBoxCols, row);
        }
        tma::bulk_commit_group();
        tma::bulk_wait_group_read<0>();
      }
      __syncwarp();
      if (s + 1 < steps) tma::named_barrier_arrive(kDqEmpty, kThreads);
      if (semaphore != nullptr && lane == 0) {
        tma::bulk_wait_group<0>();  // the reductions performed
        tma::fence_proxy_async_global();
        count_turn(semaphore);
      }
    }
  }
  if (lane == 0) tma::bulk_wait_group<0>();
}

/// \brief One block: kBlockN keys of one (batch, kv head); warpgroups 0 and 1 compute,
/// warpgroup 2 loads (warp 0) and writes dQ (warp 1, kDqBulk).
template <typename Traits, bool kCausal, bool kDqBulk>
__device__ __forceinline__ void backward_block(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws,
                                               const BackwardMaps& maps) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kStages = Traits::kStages;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_address = mma::shared_address(smem_raw);
  const uint32_t align_pad = (Traits::kAtomBytes - raw_address % Traits::kAtomBytes) % Traits::kAtomBytes;
  unsigned char* const smem = smem_raw + align_pad;
  const Smem<Traits> sm{raw_address + align_pad};

  if (threadIdx.x == 0) {
    tma::barrier_init(sm.kv_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(sm.full(s), 1);
      tma::barrier_init(sm.empty(s), Traits::kConsumerThreads);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();  // the only block-wide barrier: the roles part here

  // Deterministic (the launch sequence zeroed the semaphores): the writer warp adds each step's dQ
  // in its turn (core/backward.cuh); nothing else changes but the block order.
  const bool deterministic = ws.semaphores != nullptr;
  const BackwardBlockIndex index = backward_block_index<kCausal>(deterministic);
  BackwardBlock blk;
  if (!locate_backward_block<kCausal>(p, index, kBlockN, kBlockM, blk)) return;
  const int64_t n0 = blk.n0, steps = blk.steps;

  // Broadcast from lane 0 so that the compiler knows it is warp-uniform: what derives from it (the
  // operand descriptors) then lives in uniform registers instead of being rebuilt per thread.
  const int warpgroup = __shfl_sync(kFullWarpMask, static_cast<int>(threadIdx.x / 128), 0);
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  if (warpgroup == Traits::kWarpgroups) {
    tma::registers_shrink<Traits::kProducerRegisters>();
    if (warp == 0) {
      if (lane == 0 && steps > 0) produce<Traits>(p, ws, maps, blk, sm);
    } else if (warp == 1) {
      if constexpr (kDqBulk) write_dq<Traits, kCausal>(p, ws, maps, blk, index.n_block, sm, lane);
    }
    return;
  }
  tma::registers_grow<Traits::kConsumerRegisters>();

  const int g = lane / 4;
  const int t = lane % 4;
  const float* lse_smem = reinterpret_cast<const float*>(smem + Traits::kLseOffset);
  const float* d_smem = reinterpret_cast<const float*>(smem + Traits::kDOffset);

  float dk[kHeadDim / 2];
  float dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  const int key_row = warpgroup * Traits::kKeysPerWarpgroup + warp * 16;  // this warp's 16 keys within the block
  const uint32_t kv_a_rows = warpgroup * Traits::kKeysPerWarpgroup * kRowBytes;
  const uint64_t do_b = wgmma::descriptor_128b(sm.do_tile(0), kBlockM * kRowBytes, 8 * kRowBytes);
  const uint64_t q_b = wgmma::descriptor_128b(sm.q_tile(0), kBlockM * kRowBytes, 8 * kRowBytes);
  // dQ over all kBlockN keys: dS (MN-major, from the whole dS^T tile) times K (MN-major).
  const uint64_t ds_a = wgmma::descriptor_128b(sm.ds_tile(0), kBlockN * kRowBytes, 8 * kRowBytes);
  const uint64_t k_b = wgmma::descriptor_128b(sm.k_tile(), kBlockN * kRowBytes, 8 * kRowBytes);

  // A step's dQ tile part is handed to the writer warp (kDqBulk) while its dK product runs
  // (kDqFirst), or at the start of the next step, after that step's S^T is issued, so that the
  // tensor cores run S^T while the warpgroup stores (and once more after the last step); dq is
  // then carried over: its product has completed by then.
  constexpr bool kDqFirst = kDqBulk && Traits::kDqBeforeDk;
  static_assert(!kDqFirst || Traits::kDqSplitColumns, "dQ first: both warpgroups own a dQ part at every step");
  float dq[32];
  // exchange_dq's copy of a step's dq, handed over while dK runs (kDqFirst) or in the next step.
  float dq_held[32];
  const int dq_pass = Traits::kDqSplitColumns ? warpgroup : 0;
  // Which steps' dQ columns this warpgroup computes: 64 of them (pass dq_pass) in every step at
  // head_dim 128, the whole tile in every other step at head_dim 64.
  const auto dq_owner = [&](int64_t s) { return Traits::kDqSplitColumns || int(s & 1) == warpgroup; };
  // dq in the order hand_over_dq stores it: on odd g the 8-column groups i and i ^ 2 trade places.
  const auto exchange_dq = [&] {
    const bool odd_g = (g & 1) != 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dq_held[4 * i + e] = odd_g ? dq[4 * (i ^ 2) + e] : dq[4 * i + e];
    }
  };
  // Stores dq_held (dq as exchange_dq leaves it) as this warp's dQ tile part of step s.
  const auto hand_over_dq = [&](int64_t s) {
    if (s > 0) tma::named_barrier_sync(kDqEmpty, 32 + Traits::kDqWriters);  // step s - 1's tile read
    // Accumulator 4 j + 2 hh + e: query row warp * 16 + g + 8 hh, dim 64 dq_pass + 8 j + 2 t + e.
    // Column c = 64 dq_pass + 8 j + 2 t of row r = 16 warp + g + 8 hh (r % 8 = g): box c / 32,
    // 16 B chunk (c % 32) / 4 = 2 (j % 4) + t / 2 stored at chunk ^ g, 8 B half t % 2.
    // Store i writes group j = i on even g and j = i ^ 2 on odd g: the 16 lanes of each half
    // warp (four values of g) then cover the eight chunks of a row once (with j = i for every
    // lane, only four: a 2-way bank conflict on each store). dq_held holds group j in place i.
    const bool odd_g = (g & 1) != 0;
    const uint32_t chunk_xor = static_cast<uint32_t>((odd_g ? 4 : 0) ^ (t / 2) ^ g);
    const uint32_t tile = sm.dq_tile() + 2 * dq_pass * Traits::kDqBoxBytes + (warp * 16 + g) * 128 + 8 * (t % 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t addr = tile + (i / 4) * Traits::kDqBoxBytes + 8 * hh * 128 + (((2 * (i % 4)) ^ chunk_xor) * 16);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(dq_held[4 * i + 2 * hh]),
                     "f"(dq_held[4 * i + 2 * hh + 1])
                     : "memory");
      }
    }
    wgmma::fence_proxy_async();
    tma::named_barrier_arrive(kDqFull, 32 + Traits::kDqWriters);
  };

  if (steps > 0) tma::wait(sm.kv_full(), 0);

  for (int64_t s = 0; s < steps; ++s) {
    const int stage = static_cast<int>(s % kStages);
    const int ds_buf = static_cast<int>(s & 1);
    tma::wait(sm.full(stage), static_cast<uint32_t>((s / kStages) & 1));

    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
    const float* lse_row = lse_smem + stage * kBlockM;
    const float* d_row = d_smem + stage * kBlockM;

    float st[32];
    flash_bwd_wgmma::issue_transposed<Traits>(st, sm.k_tile() + kv_a_rows, sm.q_tile(stage));
    if constexpr (kDqBulk && !kDqFirst) {
      if (s > 0 && dq_owner(s - 1)) hand_over_dq(s - 1);
    }

    // dP^T, P^T, dS^T and the dV (and, unless kDqFirst, dK) products issued (as the cp.async
    // kernel); dS^T rows of this warpgroup to buffer s & 1.
    uint32_t pt[Traits::kQuerySlices][4];
    uint32_t dst[Traits::kQuerySlices][4];
    flash_bwd_wgmma::step_products<Traits, kCausal, !kDqFirst>(st, dv, dk, pt, dst, sm.v_tile() + kv_a_rows, sm.do_tile(stage),
                                                    do_b, q_b, stage * Traits::kQTileBytes, p, blk, m0, key_row, g, t,
                                                    scale_log2, lse_row, d_row);
    flash_bwd_wgmma::store_ds_rows<Traits>(sm.ds_tile(ds_buf), dst, key_row);
    const bool owner = dq_owner(s);
    if (owner) {
      tma::named_barrier_sync(kDsFirst + ds_buf, Traits::kConsumerThreads);  // both warpgroups' dS^T rows
    } else {
      tma::named_barrier_arrive(kDsFirst + ds_buf, Traits::kConsumerThreads);
    }

    if (owner) {
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        const uint64_t a = wgmma::advance(ds_a, ds_buf * Traits::kDsTileBytes + ks * 16 * kRowBytes);
        const uint64_t bk = wgmma::advance(k_b, dq_pass * kBlockN * kRowBytes + ks * 16 * kRowBytes);
        if (ks == 0) {
          wgmma::mma_m64n64k16_ss_tt<Element, false>(dq, a, bk);
        } else {
          wgmma::mma_m64n64k16_ss_tt<Element, true>(dq, a, bk);
        }
      }
      wgmma::commit_group();
    }
    if constexpr (kDqFirst) {
      flash_bwd_wgmma::issue_dk<Traits>(dk, dst, q_b, stage * Traits::kQTileBytes);
      wgmma::wait_group<1>();  // dV and dQ done, dK in flight
      wgmma::fence_operands(dq);
      exchange_dq();
      hand_over_dq(s);
    }
    wgmma::wait_group<0>();  // dV, dK (and dQ): Q, dO of this stage read
    wgmma::fence_operands(dq);
    wgmma::fence_operands(pt);
    wgmma::fence_operands(dst);
    wgmma::fence_operands(dv);
    wgmma::fence_operands(dk);
    // Q, dO (by this warpgroup's products) and lse, D (by this thread) of stage read: every
    // consumer thread arrives, so that its own reads of lse and D are ordered before the reload.
    tma::arrive(sm.empty(stage));
    if constexpr (kDqBulk && !kDqFirst) {
      // Copied with the odd-g exchange of groups i and i ^ 2 that the stores want: an operation ptxas
      // cannot see through (a select on the lane), or it takes the next step's stores, under its S^T
      // product, for reads of the dQ product's accumulators and waits for every product first (C7517,
      // C7518: the products serialized). A plain move is propagated away.
      exchange_dq();
    }

    if constexpr (!kDqBulk) {
      if (owner) {
        float* dq_rows = ws.dq_accum + (blk.workspace_row(p, ws.m_pad, h, m0) + warp * 16) * kHeadDim;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const DqQuad quad = dq_quad(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3], g, t);
          reduce_add_16B(reinterpret_cast<float4*>(dq_rows + quad.row * kHeadDim + 64 * dq_pass + 8 * i + quad.col),
                         quad.sum);
        }
      }
    }
  }
  if constexpr (kDqBulk && !kDqFirst) {
    if (steps > 0 && dq_owner(steps - 1)) hand_over_dq(steps - 1);
  }

  store_key_rows<Element, kHeadDim / 8>(p, blk, n0 + key_row, 0, g, t, [&](int i, int j) { return dk[4 * i + j]; },
                                        [&](int i, int j) { return dv[4 * i + j]; });
}

}  // namespace flash_bwd_wgmma_ws

/// \brief The warp-specialized wgmma backward kernel; grid as flash_bwd_wgmma_kernel's, three
/// warpgroups per block.
template <typename Element, int kHeadDim, bool kCausal, bool kDqBulk>
__global__ void __launch_bounds__(FlashBwdWgmmaWsTraits<Element, kHeadDim>::kBlockThreads, 1)
    flash_bwd_wgmma_ws_kernel(const __grid_constant__ AttentionBackwardParams p, const FlashBwdWorkspace ws,
                              const __grid_constant__ flash_bwd_wgmma_ws::BackwardMaps maps) {
  flash_bwd_wgmma_ws::backward_block<FlashBwdWgmmaWsTraits<Element, kHeadDim>, kCausal, kDqBulk>(p, ws, maps);
}

// ---------------------------------------------------------------------------
// Host: launch (instantiated per dtype and head dim in src/cuda/sm90/generated/bwd_wgmma.cu)
// ---------------------------------------------------------------------------

/// \brief Which main kernel runs (src/cuda/sm90/flash_bwd_wgmma.cu): the warp-specialized one
/// unless WAVEBOOST_WGMMA_BACKWARD=cp.async (read at every call, so that one process can time
/// the two against each other).
bool flash_bwd_wgmma_use_tma();

/// \brief The 2-D map (head_dim, rows) of the fp32 dQ accumulator, boxes of 32 columns x
/// box_rows rows in the 128 B swizzle (the dQ tile of flash_bwd_wgmma_ws); false where TMA cannot
/// describe it (src/cuda/sm90/flash_bwd_wgmma.cu).
bool encode_dq_accumulator_map(CUtensorMap* map, float* base, int64_t head_dim, int64_t rows, int box_rows);

/// \brief Shared memory per block: the larger of the two main kernels' (a device that fits it
/// runs either).
template <typename Element, int kHeadDim>
constexpr int flash_bwd_wgmma_smem_bytes() {
  return FlashBwdWgmmaTraits<Element, kHeadDim>::kSmemBytes > FlashBwdWgmmaWsTraits<Element, kHeadDim>::kSmemBytes
             ? FlashBwdWgmmaTraits<Element, kHeadDim>::kSmemBytes
             : FlashBwdWgmmaWsTraits<Element, kHeadDim>::kSmemBytes;
}

namespace flash_bwd_wgmma_launch {

// The producer's tensor maps (Q, dO, K, V) and the limits of the writer's 32-bit step counters;
// NotSupported where TMA cannot describe an input or the counters would overflow. Without `maps`
// the same checks without encoding (no driver call: can_implement runs without a context).
template <typename Element, int kHeadDim>
Status encode_input_maps(const AttentionBackwardParams& p, flash_bwd_wgmma_ws::BackwardMaps* maps) {
  using Traits = FlashBwdWgmmaWsTraits<Element, kHeadDim>;
  const int64_t m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  int64_t m_pad = 0;
  flash_bwd_mma_workspace_bytes(p, &m_pad);
  if (p.heads_kv <= 0 || (p.heads / p.heads_kv) * m_blocks >= (int64_t{1} << 31) ||
      p.batch * p.heads * m_pad >= (int64_t{1} << 31)) {
    return Status::NotSupported("more than 2^31 steps per key block or dQ accumulator rows");
  }
  const auto describe = [&](CUtensorMap* map, const void* base, int64_t rows, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t batch_stride, int box_rows) {
    return maps != nullptr ? tma::encode_rows_map(map, base, p.dtype, p.head_dim, rows, heads, p.batch, row_stride,
                                                  head_stride, batch_stride, box_rows)
                           : tma::rows_map_fits(base, p.dtype, p.head_dim, rows, heads, p.batch, row_stride,
                                                head_stride, batch_stride);
  };
  flash_bwd_wgmma_ws::BackwardMaps unused;
  flash_bwd_wgmma_ws::BackwardMaps& m = maps != nullptr ? *maps : unused;
  if (!describe(&m.q, p.q, p.seqlen_q, p.heads, p.q_row_stride, p.q_head_stride, p.q_batch_stride, Traits::kBlockM) ||
      !describe(&m.dout, p.dout, p.seqlen_q, p.heads, p.do_row_stride, p.do_head_stride, p.do_batch_stride,
                Traits::kBlockM) ||
      !describe(&m.k, p.k, p.seqlen_k, p.heads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride,
                Traits::kBlockN) ||
      !describe(&m.v, p.v, p.seqlen_k, p.heads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                Traits::kBlockN)) {
    return Status::NotSupported("TMA cannot describe q, dout, k or v (strides and base must be 16 B multiples)");
  }
  return Status::Ok();
}

// The warp-specialized kernel; NotSupported (nothing launched) where TMA cannot describe an input.
template <typename Element, int kHeadDim, bool kCausal>
Status main_ws(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, const dim3& grid, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaWsTraits<Element, kHeadDim>;
  flash_bwd_wgmma_ws::BackwardMaps maps;
  if (Status s = encode_input_maps<Element, kHeadDim>(p, &maps); !s.ok()) return s;
  if (!encode_dq_accumulator_map(&maps.dq_accum, ws.dq_accum, kHeadDim, p.batch * p.heads * ws.m_pad,
                                 Traits::kBlockM)) {
    return Status::NotSupported("TMA cannot describe the dQ accumulator");
  }
  const auto kernel = flash_bwd_wgmma_ws_kernel<Element, kHeadDim, kCausal, true>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<grid, Traits::kBlockThreads, Traits::kSmemBytes, stream>>>(p, ws, maps);
  return cuda_status(cudaGetLastError(), "flash_bwd_wgmma_ws_kernel launch");
}

// The warp-specialized kernel, or the cp.async one (WAVEBOOST_WGMMA_BACKWARD=cp.async, or where
// TMA cannot describe an input). Deterministic runs only the warp-specialized kernel (its writer
// warp takes the turns); can_implement refuses what it cannot run.
template <typename Element, int kHeadDim, bool kCausal>
Status main(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  dim3 grid;
  if (Status s = backward_grid(p, Traits::kBlockN, "wgmma", &grid); !s.ok()) return s;
  static_assert(FlashBwdWgmmaWsTraits<Element, kHeadDim>::kBlockN == Traits::kBlockN, "one grid for both kernels");
  if (flash_bwd_wgmma_use_tma()) {
    const Status ws_status = main_ws<Element, kHeadDim, kCausal>(p, ws, grid, stream);
    if (ws_status.code() != StatusCode::kNotSupported || p.deterministic) return ws_status;
  } else if (p.deterministic) {
    return Status::NotSupported("WAVEBOOST_WGMMA_BACKWARD=cp.async adds dQ with atomics: no deterministic=True");
  }
  return launch_backward_main(flash_bwd_wgmma_kernel<Element, kHeadDim, kCausal>, p, ws, grid, Traits::kThreads,
                              Traits::kSmemBytes, stream, "flash_bwd_wgmma_kernel launch");
}

}  // namespace flash_bwd_wgmma_launch

/// \brief The wgmma backward: preprocess and convert kernels of the mma backward around the
/// main kernel, over `workspace` (flash_bwd_mma_workspace_bytes).
template <typename Element, int kHeadDim>
Status launch_flash_bwd_wgmma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  return launch_flash_backward<Element, kHeadDim, Traits::kBlockM>(p, workspace, stream, [&](const FlashBwdWorkspace& ws) {
    return p.is_causal ? flash_bwd_wgmma_launch::main<Element, kHeadDim, true>(p, ws, stream)
                       : flash_bwd_wgmma_launch::main<Element, kHeadDim, false>(p, ws, stream);
  });
}

}  // namespace waveboost::cuda
