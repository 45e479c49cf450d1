// Hopper flash attention forward, warp-specialized (backend "wgmma", sm_90a only).
//
// The wgmma kernel (flash_wgmma.cuh) with its loads handed to a producer: a block runs three
// warpgroups. Warpgroups 0 and 1 are the consumers and compute exactly as the wgmma kernel
// does (64 query rows each, S = Q K^T and O += P V on wgmma, the online softmax of
// core/softmax.cuh, P(i-1) V(i-1) in flight under softmax(S(i))). Warpgroup 2 is the
// producer: one of its threads issues TMA loads of the K and V tiles into a ring of kStages
// shared-memory buffers each, in the order the consumers read them (K(0), then K(i), V(i-1),
// ..., V(n-1)), and waits on the ring's "empty" barriers before overwriting a buffer.
//
//   full_k[s], full_v[s]    one arrival (the producer, announcing the tile's bytes) + the
//                           TMA's bytes: the consumers wait on them before reading buffer s
//   empty_k[s], empty_v[s]  one arrival per consumer warp (8), once its warpgroup's wgmma that
//                           read buffer s has completed: the producer waits on them
//
// So the consumers meet no block-wide barrier per tile (the wgmma kernel's __syncthreads) and
// issue no copies: their registers and issue slots go to the products and the softmax. The
// producer gives registers back (setmaxnreg 24) and the consumers take them (240).
//
// TMA writes each 64-column panel of a tile as one box of kBlockN rows x 128 B in the 128 B
// swizzle, which is the layout wgmma reads through descriptor_128b: the consumer code's
// descriptors are the wgmma kernel's. Rows past the sequence's end are outside the tensor map
// and arrive as zeros (the last tile needs no guarded copy). Q is copied by the consumers
// with cp.async, once per block, as in the wgmma kernel.
//
// Runs dense batches whose K and V strides suit TMA (16 B multiples) with one piece of keys
// per block; the wgmma kernel keeps split-KV and everything else.
#pragma once

#include <cstdint>
#include <type_traits>

#include "waveboost/cuda/flash_wgmma.cuh"
#include "waveboost/cuda/tma_primitives.cuh"

namespace waveboost::cuda {

/// \brief The wgmma traits plus the ring and the thread roles of the warp-specialized kernel.
template <typename Element_, int kHeadDim_, int kStages_>
struct FlashWgmmaWsTraits : FlashWgmmaTraits<Element_, kHeadDim_> {
  using Base = FlashWgmmaTraits<Element_, kHeadDim_>;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumerThreads = Base::kThreads;  // warpgroups 0 .. kWarpgroups - 1
  static constexpr int kBlockThreads = kConsumerThreads + 128;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kConsumerRegisters * kConsumerThreads + kProducerRegisters * 128 <= 65536, "register file");
  // Q, kStages K tiles, kStages V tiles, 4 kStages barriers of 8 B, and the alignment slack.
  static constexpr int kBarrierBytes = 4 * kStages * 8;
  static constexpr int kSmemBytes =
      Base::kQTileBytes + 2 * kStages * Base::kKVTileBytes + kBarrierBytes + Base::kAtomBytes;
  static constexpr int kPanels = kHeadDim_ / Base::kPanelCols;
};

namespace flash_wgmma_ws {

// Shared addresses of the ring: tiles and barriers.
template <typename Traits>
struct Ring {
  uint32_t q_tile, k_tile, v_tile, barriers;
  __device__ __forceinline__ uint32_t full_k(int s) const { return barriers + 8 * s; }
  __device__ __forceinline__ uint32_t full_v(int s) const { return barriers + 8 * (Traits::kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return barriers + 8 * (2 * Traits::kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return barriers + 8 * (3 * Traits::kStages + s); }
};

// Producer: loads the tile of visit i (key tile tile_end - 1 - i) into buffer i % kStages
// once the consumers have released that buffer's previous tile.
template <typename Traits>
__device__ __forceinline__ void produce_tile(const CUtensorMap* map, uint32_t tiles, uint32_t full, uint32_t empty,
                                             int i, int tile_end, const FlashBlock& blk) {
  const int stage = i % Traits::kStages;
  const uint32_t phase = (i / Traits::kStages) & 1;
  tma::wait(empty + 8 * stage, phase ^ 1);
  tma::arrive_expect_tx(full + 8 * stage, Traits::kKVTileBytes);
  const int n0 = (tile_end - 1 - i) * Traits::kBlockN;
  const uint32_t dst = tiles + stage * Traits::kKVTileBytes;
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
    tma::load_4d(dst + panel * Traits::kBlockN * Traits::kRowBytes, map, full + 8 * stage, panel * Traits::kPanelCols,
                 n0, static_cast<int>(blk.h_kv), static_cast<int>(blk.b));
  }
}

template <typename Traits, typename Mask>
__device__ __forceinline__ void attend_block(const AttentionParams& p, const CUtensorMap* k_map,
                                             const CUtensorMap* v_map) {
  using Element = typename Traits::Element;
  using Softmax = OnlineSoftmax<typename Traits::ScoreFragments>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kStages = Traits::kStages;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_address = mma::shared_address(smem_raw);
  const uint32_t align_pad = (Traits::kAtomBytes - raw_address % Traits::kAtomBytes) % Traits::kAtomBytes;
  unsigned char* const q_smem = smem_raw + align_pad;
  Ring<Traits> ring;
  ring.q_tile = raw_address + align_pad;
  ring.k_tile = ring.q_tile + Traits::kQTileBytes;
  ring.v_tile = ring.k_tile + kStages * Traits::kKVTileBytes;
  ring.barriers = ring.v_tile + kStages * Traits::kKVTileBytes;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(ring.full_k(s), 1);
      tma::barrier_init(ring.full_v(s), 1);
      tma::barrier_init(ring.empty_k(s), Traits::kConsumerWarps);
      tma::barrier_init(ring.empty_v(s), Traits::kConsumerWarps);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();  // the last barrier of the whole block: the roles part here

  FlashBlock blk;
  if (!locate_flash_block<Mask>(p, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const int tile_end = blk.n_tiles;
  const int n_visits = tile_end;

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == Traits::kWarpgroups) {  // the producer
    tma::registers_shrink<Traits::kProducerRegisters>();
    if (threadIdx.x == Traits::kConsumerThreads && n_visits > 0) {
      tma::prefetch_map(k_map);
      tma::prefetch_map(v_map);
      const uint32_t full_k = ring.full_k(0), empty_k = ring.empty_k(0);
      const uint32_t full_v = ring.full_v(0), empty_v = ring.empty_v(0);
      produce_tile<Traits>(k_map, ring.k_tile, full_k, empty_k, 0, tile_end, blk);
      for (int i = 1; i < n_visits; ++i) {
        produce_tile<Traits>(k_map, ring.k_tile, full_k, empty_k, i, tile_end, blk);
        produce_tile<Traits>(v_map, ring.v_tile, full_v, empty_v, i - 1, tile_end, blk);
      }
      produce_tile<Traits>(v_map, ring.v_tile, full_v, empty_v, n_visits - 1, tile_end, blk);
    }
    return;
  }
  tma::registers_grow<Traits::kConsumerRegisters>();

  const Mask mask = Mask::of(blk);
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const Element* q = blk.q_rows<Element>(p);

  const int warp_row = warpgroup * Traits::kRowsPerWarpgroup + warp * 16;  // within the block
  const int64_t warp_m0 = blk.m0 + warp_row;
  float o[Traits::kOutRegs];
#pragma unroll
  for (int i = 0; i < Traits::kOutRegs; ++i) o[i] = 0.f;
  Softmax softmax;
  softmax.init();

  if (n_visits > 0) {  // otherwise every row sees no key: the epilogue writes zeros
    // Q by the consumers (threads 0 .. kConsumerThreads - 1, the wgmma kernel's copy pattern).
    flash_wgmma::load_tile<Traits, kBlockM, true>(ring.q_tile, q, p.q_row_stride, blk.rows);
    mma::commit_copies();
    const float scale_log2 = positive_scale_log2(p);
    mma::wait_copies<0>();
    if (p.softmax_scale < 0) flash_wgmma::negate_own_q_chunks<Traits>(q_smem);
    wgmma::fence_proxy_async();
    tma::named_barrier_sync(1, Traits::kConsumerThreads);

    const uint64_t q_desc =
        wgmma::descriptor_128b(ring.q_tile + warpgroup * Traits::kRowsPerWarpgroup * kRowBytes, 16, 8 * kRowBytes);
    const uint64_t k_desc = wgmma::descriptor_128b(ring.k_tile, 16, 8 * kRowBytes);
    const uint64_t v_desc = wgmma::descriptor_128b(ring.v_tile, kBlockN * kRowBytes, 8 * kRowBytes);

    uint32_t p_prev[Traits::kKeySlices][4];  // P(i-1), the A operand of the product in flight in tile i

    const auto attend_key_tile = [&](const int i, auto masked, auto first) {
      constexpr bool kMasked = decltype(masked)::value;
      constexpr bool kFirst = decltype(first)::value;
      const int64_t n0 = static_cast<int64_t>(tile_end - 1 - i) * kBlockN;
      const int stage = i % kStages;
      const int prev_stage = (i + kStages - 1) % kStages;

      tma::wait(ring.full_k(stage), (i / kStages) & 1);
      if constexpr (!kFirst) tma::wait(ring.full_v(prev_stage), ((i - 1) / kStages) & 1);

      flash_wgmma::attend_tile<Traits, kMasked, kFirst>(
          o, p_prev, softmax, mask, q_desc, wgmma::advance(k_desc, stage * Traits::kKVTileBytes),
          wgmma::advance(v_desc, prev_stage * Traits::kKVTileBytes), warp_m0 + g, n0, t, scale_log2,
          [&] {
            if (lane == 0) tma::arrive(ring.empty_k(stage));  // S(i) has read K(i)
          },
          [&] {
            if (lane == 0) tma::arrive(ring.empty_v(prev_stage));  // P(i-1) V(i-1) has read V(i-1)
          });
    };

    attend_key_tile(0, std::true_type{}, std::true_type{});
    int i = 1;
    const int n_masked = min(n_visits, tile_end - blk.n_unmasked);  // visits of tiles >= n_unmasked
    for (; i < n_masked; ++i) attend_key_tile(i, std::true_type{}, std::false_type{});
    for (; i < n_visits; ++i) attend_key_tile(i, std::false_type{}, std::false_type{});

    // The last product, P(n-1) V(n-1).
    const int last_stage = (n_visits - 1) % kStages;
    tma::wait(ring.full_v(last_stage), ((n_visits - 1) / kStages) & 1);
    flash_wgmma::attend_last_values<Traits>(o, p_prev, wgmma::advance(v_desc, last_stage * Traits::kKVTileBytes));
  }

  float inv_sum[Softmax::kRows];
  softmax.finalize(inv_sum);
  flash_wgmma::write_block_output<Traits>(p, blk, o, inv_sum, softmax, q_smem, warp_row, warp_m0, lane);
}

}  // namespace flash_wgmma_ws

template <typename Element, int kHeadDim>
using FlashWgmmaWsDefaultTraits = FlashWgmmaWsTraits<Element, kHeadDim, 2>;

/// \brief Warp-specialized flash attention forward; grid as the wgmma kernel's (query blocks,
/// batch * heads folded over y and z), three warpgroups per block.
template <typename Element, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(FlashWgmmaWsDefaultTraits<Element, kHeadDim>::kBlockThreads, 1)
    flash_wgmma_ws_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map) {
  flash_wgmma_ws::attend_block<FlashWgmmaWsDefaultTraits<Element, kHeadDim>, CausalMask<kCausal>>(p, &k_map, &v_map);
}

/// \brief The tensor maps of K and V (p.dtype), boxes of 64 columns x box_rows keys; false where
/// TMA cannot describe either.
inline bool encode_kv_tensor_maps(const AttentionParams& p, int box_rows, CUtensorMap* k_map, CUtensorMap* v_map) {
  return tma::encode_rows_map(k_map, p.k, p.dtype, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                              p.k_head_stride, p.k_batch_stride, box_rows) &&
         tma::encode_rows_map(v_map, p.v, p.dtype, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                              p.v_head_stride, p.v_batch_stride, box_rows);
}

/// \brief Whether the warp-specialized kernel takes a call's layout: a dense batch with keys.
inline bool wgmma_ws_takes_layout(const AttentionParams& p) {
  return p.seqlen_k > 0 && p.seqlen_k < (int64_t{1} << 31) && p.is_dense();
}

/// \brief Builds the tensor maps of K and V and launches the warp-specialized kernel on
/// `stream`. NotSupported (nothing launched) where TMA cannot describe K or V or the call is not
/// a dense batch with keys: the caller then runs the wgmma kernel.
template <typename Element, int kHeadDim>
Status launch_flash_wgmma_ws(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashWgmmaWsDefaultTraits<Element, kHeadDim>;
  if (!wgmma_ws_takes_layout(p)) {
    return Status::NotSupported("the warp-specialized wgmma kernel runs dense batches with keys");
  }
  CUtensorMap k_map, v_map;
  if (!encode_kv_tensor_maps(p, Traits::kBlockN, &k_map, &v_map)) {
    return Status::NotSupported("TMA cannot describe k or v (strides must be positive multiples of 16 bytes)");
  }
  if (Status s = folded_grid_check(p, Traits::kBlockM, "wgmma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = p.is_causal ? flash_wgmma_ws_kernel<Element, kHeadDim, true>
                                  : flash_wgmma_ws_kernel<Element, kHeadDim, false>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kBlockThreads, Traits::kSmemBytes, stream>>>(p, k_map, v_map);
  return cuda_status(cudaGetLastError(), "flash_wgmma_ws_kernel launch");
}

}  // namespace waveboost::cuda
