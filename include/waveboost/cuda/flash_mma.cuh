// Tensor-core flash attention forward on raw mma.sync + ldmatrix (backend "mma").
//
// FlashAttention-2's forward algorithm. One block owns kBlockM = 128 query rows of one
// (batch, head); each of its 4 warps owns 32 of them (two m16 tiles) and walks the key
// tiles the block can see, last to first, with the online softmax:
//
//   S = Q K^T                          mma.sync m16n8k16, fp32 accumulators in registers
//   m_new = max(m, c * rowmax(S))      c = softmax_scale * log2(e); a row spans one quad
//   P = exp2(c * S - m_new)            one FFMA + ex2 per score, packed to 16 bits in registers
//                                      (huge scores: see core/softmax.cuh)
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
#include "waveboost/cuda/core/epilogue.cuh"
#include "waveboost/cuda/core/fragments.cuh"
#include "waveboost/cuda/core/mask.cuh"
#include "waveboost/cuda/core/softmax.cuh"
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

  using ScoreFragments = MmaFragments<kMTiles, kKeyTiles>;  // S and P, per warp
  using OutFragments = MmaFragments<kMTiles, kDimTiles>;    // O, per warp
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

// Issues cp.async for rows [0, kRows) of the K (kValue false) or V tile starting at key n0 of
// the sequence, `base` being FlashBlock::k_rows / v_rows: contiguous rows (dense, packed)
// through load_tile; with a paged K / V (kSequences and p.block_table) the page of each copy
// pass through the block table: a pass covers kRowsPerCopyPass consecutive keys from a multiple
// of kRowsPerCopyPass, which lie in one page as mma_can_implement requires page sizes that are
// multiples of it (powers of two), so one lookup serves the pass and the thread's row inside
// it is the dense offset. kSequences false: dense at compile time.
template <typename Traits, int kRows, bool kGuarded, bool kValue, bool kSequences>
__device__ __forceinline__ void load_kv_tile(uint32_t tile, const AttentionParams& p, const FlashBlock& blk,
                                             const typename Traits::Element* base, int64_t n0, int64_t valid_rows) {
  using Element = typename Traits::Element;
  const int64_t row_stride = kValue ? p.v_row_stride : p.k_row_stride;
  if (!kSequences || p.block_table == nullptr) {
    load_tile<Traits, kRows, kGuarded>(tile, kValue ? blk.v_tile(p, base, n0) : blk.k_tile(p, base, n0), row_stride,
                                       valid_rows);
    return;
  }
  const int32_t* table_row = blk.page_table(p);
  const int tid = threadIdx.x;
  const int chunk = tid % Traits::kChunksPerRow;
  const int row = tid / Traits::kChunksPerRow;
  const uint32_t dst = tile + 2 * swizzled<Traits>(row, chunk);
  const Element* src_row = base + row * row_stride + chunk * Traits::kChunk;
#pragma unroll
  for (int i = 0; i < kRows / Traits::kRowsPerCopyPass; ++i) {
    bool valid = !kGuarded || row + i * Traits::kRowsPerCopyPass < valid_rows;
    int64_t offset = 0;
    if (valid) valid = blk.paged_key<kValue>(p, table_row, static_cast<int>(n0) + i * Traits::kRowsPerCopyPass, offset);
    mma::copy_async_16B(dst + i * Traits::kRowsPerCopyPass * Traits::kHeadDim * 2, valid ? src_row + offset : base,
                        valid);
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
// One block: kBlockM query rows of one (batch, head)
// ----------------------------------------------------------------------------

// kSequences: p may carry a sequence layout (varlen, seqused_k, paged K/V; core/sequence.cuh);
// the dense kernel (false) compiles with no trace of it.
template <typename Traits, typename Mask, bool kSequences>
__device__ __forceinline__ void attend_block(const AttentionParams& p) {
  using Element = typename Traits::Element;
  using Softmax = OnlineSoftmax<typename Traits::ScoreFragments>;
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
  if (!locate_flash_block<Mask, kSequences>(p, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const Mask mask = Mask::of(blk);
  const Element* q = blk.q_rows<Element>(p);
  const Element* k = blk.k_rows<Element>(p);
  const Element* v = blk.v_rows<Element>(p);

  // Rows of this thread's accumulators: warp_m0 + g + 8 r (r = 2 mt + half).
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
  Softmax softmax;
  softmax.init();

  if (blk.n_tiles > 0) {  // otherwise every row sees no key: the epilogue writes zeros
    load_tile<Traits, kBlockM, true>(q_tile, q, p.q_row_stride, blk.rows);
    mma::commit_copies();
    const int64_t last_n0 = int64_t{blk.n_tiles - 1} * kBlockN;
    load_kv_tile<Traits, kBlockN, true, false, kSequences>(k_tile, p, blk, k, last_n0, blk.seqlen_k - last_n0);
    mma::commit_copies();

    // A negative scale: each warp flips the sign bits of its own Q rows once (exact).
    const float scale_log2 = positive_scale_log2(p);
    if (p.softmax_scale < 0) {
      mma::wait_copies<1>();
      __syncthreads();  // Q rows arrive through other warps' copies
      uint4* q_rows = reinterpret_cast<uint4*>(q_smem + warp * Traits::kRowsPerWarp * Traits::kHeadDim);
#pragma unroll
      for (int i = lane; i < Traits::kRowsPerWarp * Traits::kChunksPerRow; i += 32) {
        uint4 x = q_rows[i];
        x.x ^= kSignBitsHalf2, x.y ^= kSignBitsHalf2, x.z ^= kSignBitsHalf2, x.w ^= kSignBitsHalf2;
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
      if (kMasked && mask.partial_tile(n0, kBlockN)) {
        load_kv_tile<Traits, kBlockN, true, true, kSequences>(v_tile, p, blk, v, n0, blk.seqlen_k - n0);
      } else {
        load_kv_tile<Traits, kBlockN, false, true, kSequences>(v_tile, p, blk, v, n0, kBlockN);
      }
      mma::commit_copies();

      float s[kMTiles][Traits::kKeyTiles][4];
      scores<Traits>(s, q_lane, k_lane);
      if constexpr (kMasked) mask.template mask_tile<typename Traits::ScoreFragments, kBlockN>(s, warp_m0 + g, n0, t);
      float alpha[Softmax::kRows];
      uint32_t prob[kMTiles][Traits::kKeySlices][4];
      const bool raised = softmax.template step_packed<Element>(s, alpha, scale_log2, prob);
      // Unless no row of the warp raised its max (exp2(0) == 1 exactly).
      if (__any_sync(kFullWarpMask, raised)) Softmax::template rescale<typename Traits::OutFragments>(o, alpha);

      mma::wait_copies<0>();
      __syncthreads();  // V(j) visible to every warp; every warp is done reading K(j)
      if (j > 0) {
        load_kv_tile<Traits, kBlockN, false, false, kSequences>(k_tile, p, blk, k, n0 - kBlockN, kBlockN);
        mma::commit_copies();
      }
      accumulate_pv<Traits>(o, prob, v_lane);
    };

    int j = blk.n_tiles - 1;
    for (; j >= blk.n_unmasked; --j) attend_key_tile(j, std::true_type{});
    for (; j >= 0; --j) attend_key_tile(j, std::false_type{});
  }

  float inv_sum[Softmax::kRows];
  softmax.finalize(inv_sum);
  if constexpr (kSequences) blk.reload_query_rows(p);
  write_lse(p, blk, warp_m0 + g, softmax, t);

  // O goes through the warp's own Q rows in shared memory (no other warp reads them, and no
  // copy is in flight) to leave as 16 B row-contiguous stores. Fragment writes: the quad's
  // four 4 B words of one chunk, eight rows with distinct swizzles: conflict-free.
  __syncwarp();  // every lane's last ldmatrix of Q is done
  Element* const o_rows = q_smem + warp * Traits::kRowsPerWarp * Traits::kHeadDim;
  stage_output<typename Traits::OutFragments, Element>(
      o, inv_sum, g, t, [&](int row, int dt) { return reinterpret_cast<uint32_t*>(o_rows + swizzled<Traits>(row, dt)); });
  __syncwarp();
  store_staged_rows<Traits::kRowsPerWarp, Traits::kChunksPerRow>(
      blk.o_row<Element>(p, warp_m0), p.o_row_stride, blk.seqlen_q - warp_m0, lane,
      [&](int row, int chunk) { return o_rows + swizzled<Traits>(row, chunk); });
}

}  // namespace flash_mma

/// \brief Flash attention forward on mma.sync; grid (query blocks, batch*heads folded over y and z).
/// Two blocks per SM is the design point (255 registers x 128 threads each). kSequences: the
/// instantiation for sequence layouts (varlen, seqused_k, paged), whose grid covers the longest
/// sequence (p.seqlen_q) and whose blocks past their own sequence's rows exit at once.
template <typename Element, int kHeadDim, bool kCausal, bool kSequences>
__global__ void __launch_bounds__(FlashMmaTraits<Element, kHeadDim>::kThreads, 2)
    flash_mma_kernel(const __grid_constant__ AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and bf16 mma need sm_80; mma_can_implement refuses older devices
#else
  flash_mma::attend_block<FlashMmaTraits<Element, kHeadDim>, CausalMask<kCausal>, kSequences>(p);
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

template <typename Element, int kHeadDim, bool kCausal, bool kSequences>
Status launch_flash_mma_kernel(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashMmaTraits<Element, kHeadDim>;
  if (Status s = folded_grid_check(p, Traits::kBlockM, "mma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = flash_mma_kernel<Element, kHeadDim, kCausal, kSequences>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cuda_status(cudaGetLastError(), "flash_mma_kernel launch");
}

/// \brief Launches the mma.sync forward on `stream` (params.device_id current, batch * heads *
/// seqlen_q > 0, as attention_forward guarantees).
template <typename Element, int kHeadDim>
Status launch_flash_mma(const AttentionParams& p, cudaStream_t stream) {
  if (!p.is_dense()) {
    return p.is_causal ? launch_flash_mma_kernel<Element, kHeadDim, true, true>(p, stream)
                       : launch_flash_mma_kernel<Element, kHeadDim, false, true>(p, stream);
  }
  return p.is_causal ? launch_flash_mma_kernel<Element, kHeadDim, true, false>(p, stream)
                     : launch_flash_mma_kernel<Element, kHeadDim, false, false>(p, stream);
}

}  // namespace waveboost::cuda
