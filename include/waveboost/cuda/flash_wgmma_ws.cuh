// Hopper flash attention forward, warp-specialized (backend "wgmma", sm_90a only).
//
// The wgmma kernel (flash_wgmma.cuh) with its loads handed to a producer: a block runs
// kWarpgroups consumer warpgroups (two; three at head dim 64 from 2048 query rows) and one producer.
// The consumers compute exactly as the wgmma kernel does (64 query rows each, S = Q K^T and
// O += P V on wgmma, the online softmax of core/softmax.cuh, P(i-1) V(i-1) in flight under
// softmax(S(i))). The last warpgroup is the producer: one of its threads issues TMA loads of the K and V tiles into a ring of kStages
// shared-memory buffers each, in the order the consumers read them (K(0), then K(i), V(i-1),
// ..., V(n-1)), and waits on the ring's "empty" barriers before overwriting a buffer.
//
//   full_k[s], full_v[s]    one arrival (the producer, announcing the tile's bytes) + the
//                           TMA's bytes: the consumers wait on them before reading buffer s
//   empty_k[s], empty_v[s]  one arrival per consumer warp (8 or 12), once its warpgroup's wgmma that
//                           read buffer s has completed: the producer waits on them
//
// So the consumers meet no block-wide barrier per tile (the wgmma kernel's __syncthreads) and
// issue no copies: their registers and issue slots go to the products and the softmax. The
// producer gives registers back (setmaxnreg 24) and the consumers take them (240 of two, 160 of three).
//
// TMA writes each 64-column panel of a tile as one box of kBlockN rows x 128 B in the 128 B
// swizzle, which is the layout wgmma reads through descriptor_128b: the consumer code's
// descriptors are the wgmma kernel's. In a dense batch rows past the sequence's end are outside
// the tensor map and arrive as zeros (the last tile needs no guarded copy). Q is copied by the
// consumers with cp.async, once per block, as in the wgmma kernel.
//
// kSequences: varlen (cu_seqlens_k: the maps span the packed rows, p.total_k, and a tile starts
// at the sequence's first key) and seqused_k, through core/sequence.cuh as the wgmma kernel. A
// tile past the sequence's end then holds other rows of the tensor (the next sequence's keys, a
// cache's unfilled slots): their scores are masked, and the consumers zero those V rows before
// the product reads them, so that nothing in them (NaN, Inf) reaches the output.
//
// Runs batches whose K and V strides suit TMA (16 B multiples) with one piece of keys per block,
// dense or with contiguous sequence layouts; the wgmma kernel keeps split-KV and paged K/V.
//
// e4m3 inputs (kTransposes, dense batches): 8-bit wgmma reads both operands K-major, so producer
// warps 1-3 transpose each V tile TMA lands into a ring of V^T tiles (full_vt / empty_vt), which
// P V reads; the V ring's empty barrier then counts the transposer threads. O leaves in
// p.out_dtype (16-bit), staged in the V ring.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "waveboost/cuda/flash_wgmma.cuh"
#include "waveboost/cuda/tma_primitives.cuh"

namespace waveboost::cuda {

/// \brief The wgmma traits plus the ring and the thread roles of the warp-specialized kernel.
template <typename Element_, int kHeadDim_, int kStages_, int kBlockM_ = kWgmmaBlockM, int kBlocksPerSM_ = 1,
          int kBlockN_ = kWgmmaBlockN>
struct FlashWgmmaWsTraits : FlashWgmmaTraits<Element_, kHeadDim_, kBlockM_, kBlockN_> {
  using Base = FlashWgmmaTraits<Element_, kHeadDim_, kBlockM_, kBlockN_>;
  static constexpr int kStages = kStages_;
  // Blocks the kernel is built to run side by side on one SM (its launch bounds): they share the
  // register file, and so the registers setmaxnreg can hand the consumers.
  static constexpr int kBlocksPerSM = kBlocksPerSM_;
  static constexpr int kConsumerThreads = Base::kThreads;  // warpgroups 0 .. kWarpgroups - 1
  static constexpr int kBlockThreads = kConsumerThreads + 128;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // e4m3: producer warps 1-3 transpose each V tile into a ring of V^T tiles (transpose_values),
  // which P V reads; their loop needs more registers than the TMA thread's.
  static constexpr bool kTransposes = Base::kValuesTransposed;
  static constexpr int kTransposerWarps = 3;
  static constexpr int kTransposerThreads = 32 * kTransposerWarps;
  static constexpr int kProducerRegisters = kTransposes ? 64 : 24;
  // setmaxnreg moves registers within the block's launch allocation (kLaunchRegisters per thread:
  // the register file over the block's threads, in multiples of 8); an increase past what the
  // producer's decrease freed never completes. So the consumers get what the producer leaves of
  // that allocation, rounded down to a multiple of 8, at most 240.
  static constexpr int kLaunchRegisters = 65536 / (kBlockThreads * kBlocksPerSM) / 8 * 8;
  // What a consumer thread gets beside a producer warpgroup of `producer` registers per thread.
  static constexpr int consumer_registers(int producer) {
    const int pooled = (kLaunchRegisters * kBlockThreads - producer * 128) / kConsumerThreads / 8 * 8;
    return pooled > 240 ? 240 : pooled;
  }
  static constexpr int kConsumerRegisters = consumer_registers(kProducerRegisters);
  // The persistent kernel's transposer warps also walk the items: 80 registers keep that loop from spilling
  // (64: 36-76 bytes), the consumers then get 208.
  static constexpr int kPersistentProducerRegisters = kTransposes ? 80 : kProducerRegisters;
  static constexpr int kPersistentConsumerRegisters = consumer_registers(kPersistentProducerRegisters);
  static_assert(kConsumerRegisters * kConsumerThreads + kProducerRegisters * 128 <= kLaunchRegisters * kBlockThreads,
                "register file");
  // Q, kStages K tiles, kStages V tiles (and with kTransposes kStages V^T tiles), 4 kStages
  // barriers of 8 B (6 kStages), and the alignment slack.
  static constexpr int kRings = kTransposes ? 3 : 2;
  static constexpr int kBarrierBytes = 2 * kRings * kStages * 8;
  static constexpr int kSmemBytes = Base::kQTileBytes + kStages * (2 * Base::kKVTileBytes + Base::kVtTileBytes) +
                                    kBarrierBytes + Base::kAtomBytes;
  // The e4m3 epilogue stages O (16-bit, twice the bytes of a V tile row) in the V ring.
  static_assert(!kTransposes || kStages * Base::kKVTileBytes >= 2 * Base::kBlockM * kHeadDim_, "O staging");
  static constexpr int kPanels = kHeadDim_ / Base::kPanelCols;
  // The persistent kernel: a second Q tile and its two barriers, and the first one's; with kTransposes
  // also a tile to stage O in (16-bit), since the V ring runs on into the next item's tiles.
  static constexpr int kOStageBytes = kTransposes ? 2 * Base::kBlockM * kHeadDim_ : 0;
  static constexpr int kPersistentSmemBytes = kSmemBytes + Base::kQTileBytes + 4 * 8 + kOStageBytes;
};

namespace flash_wgmma_ws {

// Shared addresses of the ring: tiles and barriers.
template <typename Traits>
struct Ring {
  uint32_t q_tile, k_tile, v_tile, vt_tile, o_stage, barriers;
  __device__ __forceinline__ uint32_t full_k(int s) const { return barriers + 8 * s; }
  __device__ __forceinline__ uint32_t full_v(int s) const { return barriers + 8 * (Traits::kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return barriers + 8 * (2 * Traits::kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return barriers + 8 * (3 * Traits::kStages + s); }
  // kTransposes: V^T tile s written (the transposer threads) / read (one arrival per consumer warp).
  __device__ __forceinline__ uint32_t full_vt(int s) const { return barriers + 8 * (4 * Traits::kStages + s); }
  __device__ __forceinline__ uint32_t empty_vt(int s) const { return barriers + 8 * (5 * Traits::kStages + s); }
  // The persistent kernel's two Q tiles: tile b loaded (the producer's arrival and the TMA's
  // bytes) / free again (one arrival per consumer warp, once its output has left the tile).
  __device__ __forceinline__ uint32_t full_q(int b) const {
    return barriers + 8 * (2 * Traits::kRings * Traits::kStages + b);
  }
  __device__ __forceinline__ uint32_t empty_q(int b) const {
    return barriers + 8 * (2 * Traits::kRings * Traits::kStages + 2 + b);
  }
  // The barriers the products wait on and release for the values they read (V, or V^T).
  __device__ __forceinline__ uint32_t values_full(int s) const { return Traits::kTransposes ? full_vt(s) : full_v(s); }
  __device__ __forceinline__ uint32_t values_empty(int s) const {
    return Traits::kTransposes ? empty_vt(s) : empty_v(s);
  }
};

// V^T of one e4m3 V tile (kBlockN keys x head_dim 128: one 128 B-swizzled panel, as TMA wrote
// it) into the K-major layout P V reads (head_dim rows, 128 B swizzle, in panels of 128 keys), keys in
// the column order of pack_e4m3's P: in each 16 keys, 4 B word t of a row holds keys 2t, 2t+1,
// 8+2t, 9+2t. Work item (u, dq): keys 16u .. 16u+15 x columns 4dq .. 4dq+3, lane = dq, items u
// dealt over the transposer warps. Loads of a key row are 32 distinct banks (the row's 32 words);
// a quarter warp's 16 B stores go to 8 distinct 16 B bank groups because each lane starts its
// four output rows at a different one ((m + dq / 2) % 4), so neither side conflicts.
template <typename Traits>
__device__ __forceinline__ void transpose_values(uint32_t raw, uint32_t vt, int warp, int lane) {
  static_assert(Traits::kHeadDim == 128 && Traits::kBlockN % 32 == 0 && Traits::kRowBytes == 128, "128 B rows");
  const int dq = lane;
  for (int u = warp; u < Traits::kBlockN / 16; u += Traits::kTransposerWarps) {
    uint32_t in[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const uint32_t at = raw + (16 * u + k) * 128 + (((dq >> 2) ^ (k & 7)) << 4) + ((dq & 3) << 2);
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(in[k]) : "r"(at));
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int jj = (m + (dq >> 1)) & 3;  // byte jj of each word: column d of V, row d of V^T
      const int d = 4 * dq + jj;
      const uint32_t select = static_cast<uint32_t>(jj | ((jj + 4) << 4));
      uint32_t w[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint32_t x = __byte_perm(in[2 * t], in[2 * t + 1], select);
        const uint32_t y = __byte_perm(in[8 + 2 * t], in[9 + 2 * t], select);
        w[t] = __byte_perm(x, y, 0x5410);
      }
      // Keys 16u .. 16u + 15: panel u / 8, 16 B chunk u % 8 of row d (one panel under 128 keys).
      constexpr bool kOnePanel = Traits::kBlockN <= 128;
      const uint32_t panel = kOnePanel ? vt : vt + (u / 8) * Traits::kHeadDim * 128;
      const uint32_t at = panel + d * 128 + (((kOnePanel ? u : u & 7) ^ (d & 7)) << 4);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
  }
}

// The block's shared memory (dynamic, from smem_raw, rounded up to a swizzle atom): kQTiles Q
// tiles (q_smem: the first), the K, V (and V^T) rings, their barriers (and with two Q tiles the Q
// barriers), initialized by thread 0 and published by a block barrier, the last one the whole
// block meets: the roles part after it.
template <typename Traits, int kQTiles>
__device__ __forceinline__ Ring<Traits> make_ring(unsigned char* smem_raw, unsigned char*& q_smem) {
  static_assert(kQTiles == 1 || kQTiles == 2, "one Q tile, or two (the persistent kernel)");
  constexpr int kStages = Traits::kStages;
  const uint32_t raw_address = mma::shared_address(smem_raw);
  const uint32_t align_pad = (Traits::kAtomBytes - raw_address % Traits::kAtomBytes) % Traits::kAtomBytes;
  q_smem = smem_raw + align_pad;
  Ring<Traits> ring;
  ring.q_tile = raw_address + align_pad;
  ring.k_tile = ring.q_tile + kQTiles * Traits::kQTileBytes;
  ring.v_tile = ring.k_tile + kStages * Traits::kKVTileBytes;
  ring.vt_tile = ring.v_tile + kStages * Traits::kKVTileBytes;
  // The persistent e4m3 kernel's tile to stage O in (the one-block form stages O in the V ring).
  ring.o_stage = ring.vt_tile + kStages * Traits::kVtTileBytes;
  ring.barriers = ring.o_stage + (kQTiles == 2 ? Traits::kOStageBytes : 0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(ring.full_k(s), 1);
      tma::barrier_init(ring.full_v(s), 1);
      tma::barrier_init(ring.empty_k(s), Traits::kConsumerWarps);
      // V is read by the products, or with kTransposes by the transposer threads.
      tma::barrier_init(ring.empty_v(s), Traits::kTransposes ? Traits::kTransposerThreads : Traits::kConsumerWarps);
      if constexpr (Traits::kTransposes) {
        tma::barrier_init(ring.full_vt(s), Traits::kTransposerThreads);
        tma::barrier_init(ring.empty_vt(s), Traits::kConsumerWarps);
      }
    }
    if constexpr (kQTiles == 2) {
      for (int b = 0; b < 2; ++b) {
        tma::barrier_init(ring.full_q(b), 1);
        tma::barrier_init(ring.empty_q(b), Traits::kConsumerWarps);
      }
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  return ring;
}

// Transposer warp `warp` (0 .. kTransposerWarps - 1) on one visit of the ring (stage, phase): once V
// has landed and the products have released the stage's V^T buffer, V into V^T (transpose_values),
// then the V^T buffer handed to the products and the V buffer back to the producer.
template <typename Traits>
__device__ __forceinline__ void transpose_visit(const Ring<Traits>& ring, int stage, uint32_t phase, int warp) {
  tma::wait(ring.full_v(stage), phase);        // V landed
  tma::wait(ring.empty_vt(stage), phase ^ 1);  // the products kStages visits back have read the V^T buffer
  transpose_values<Traits>(ring.v_tile + stage * Traits::kKVTileBytes, ring.vt_tile + stage * Traits::kVtTileBytes,
                           warp, threadIdx.x % 32);
  wgmma::fence_proxy_async();  // this thread's V^T writes, visible to the products that wait for full_vt
  tma::arrive(ring.full_vt(stage));
  tma::arrive(ring.empty_v(stage));
}

// Producer: loads key tile `key_tile` of the block into the ring's visit `slot` (buffer slot %
// kStages) once the consumers have released that buffer's previous tile. The map's rows are the
// sequence's keys from its packed start (k_start: 0 unless varlen) of batch k_batch.
template <typename Traits>
__device__ __forceinline__ void produce_tile(const CUtensorMap* map, uint32_t tiles, uint32_t full, uint32_t empty,
                                             uint32_t slot, int key_tile, const FlashBlock& blk) {
  const int stage = static_cast<int>(slot % Traits::kStages);
  const uint32_t phase = (slot / Traits::kStages) & 1;
  tma::wait(empty + 8 * stage, phase ^ 1);
  tma::arrive_expect_tx(full + 8 * stage, Traits::kKVTileBytes);
  const int row = static_cast<int>(blk.k_start) + key_tile * Traits::kBlockN;
  const uint32_t dst = tiles + stage * Traits::kKVTileBytes;
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
    tma::load_4d(dst + panel * Traits::kBlockN * Traits::kRowBytes, map, full + 8 * stage, panel * Traits::kPanelCols,
                 row, static_cast<int>(blk.h_kv), static_cast<int>(blk.k_batch));
  }
}

// Producer: the K and V tiles of one block, visits visit0 .. visit0 + n - 1 of the ring in the
// order the consumers read them (K(0), then K(i), V(i-1), ..., V(n-1)); key tiles last to first.
template <typename Traits>
__device__ __forceinline__ void produce_block(const CUtensorMap* k_map, const CUtensorMap* v_map,
                                              const Ring<Traits>& ring, uint32_t visit0, int n_visits,
                                              const FlashBlock& blk) {
  const int tile_end = blk.n_tiles;
  const uint32_t full_k = ring.full_k(0), empty_k = ring.empty_k(0);
  const uint32_t full_v = ring.full_v(0), empty_v = ring.empty_v(0);
  produce_tile<Traits>(k_map, ring.k_tile, full_k, empty_k, visit0, tile_end - 1, blk);
  for (int i = 1; i < n_visits; ++i) {
    produce_tile<Traits>(k_map, ring.k_tile, full_k, empty_k, visit0 + i, tile_end - 1 - i, blk);
    produce_tile<Traits>(v_map, ring.v_tile, full_v, empty_v, visit0 + i - 1, tile_end - i, blk);
  }
  produce_tile<Traits>(v_map, ring.v_tile, full_v, empty_v, visit0 + n_visits - 1, tile_end - n_visits, blk);
}

// Zeros rows [first_row, kBlockN) of a V tile (every 64-column panel; a row is 128 B of a panel
// whatever the swizzle), the consumers' threads sharing the 16 B pieces; then hands the writes to
// the async proxy and meets the other consumers, so that no product reads the tile before.
template <typename Traits>
__device__ __forceinline__ void zero_rows_past(uint32_t tile, int first_row) {
  constexpr int kChunksPerRow = Traits::kRowBytes / 16;
  const int chunks = (Traits::kBlockN - first_row) * kChunksPerRow * Traits::kPanels;
  for (int c = static_cast<int>(threadIdx.x); c < chunks; c += Traits::kConsumerThreads) {
    const int panel = c / ((Traits::kBlockN - first_row) * kChunksPerRow);
    const int rest = c % ((Traits::kBlockN - first_row) * kChunksPerRow);
    const uint32_t at = tile + panel * Traits::kBlockN * Traits::kRowBytes +
                        (first_row + rest / kChunksPerRow) * Traits::kRowBytes + (rest % kChunksPerRow) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
  }
  wgmma::fence_proxy_async();
  tma::named_barrier_sync(2, Traits::kConsumerThreads);
}

// The consumers' work on one block: its key tiles as the ring's visits visit0 .., n_tiles of them,
// then its output (kReleaseLastValues: releasing the last V tile's buffer, which the ring
// reuses). Q lies at q_tile (q_smem) once load_q(negate_q) returns, which runs only for a
// block with key tiles and leaves the Q tile visible to wgmma and, where negate_q, negated (a
// negative softmax_scale, core/softmax.cuh). O is staged in the warp's own Q rows.
template <typename Traits, typename Mask, bool kSequences, bool kReleaseLastValues = false, typename LoadQ>
__device__ __forceinline__ void consume_block(const AttentionParams& p, FlashBlock& blk, const Ring<Traits>& ring,
                                              uint32_t q_tile, unsigned char* q_smem, uint32_t visit0, LoadQ load_q) {
  using Softmax = OnlineSoftmax<typename Traits::ScoreFragments>;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRowBytes = Traits::kRowBytes;
  constexpr int kStages = Traits::kStages;
  const int tile_end = blk.n_tiles;
  const int n_visits = tile_end;
  const int warpgroup = threadIdx.x / 128;

  const Mask mask = Mask::of(blk);
  const int warp = (threadIdx.x / 32) % 4;  // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int warp_row = warpgroup * Traits::kRowsPerWarpgroup + warp * 16;  // within the block
  const int64_t warp_m0 = blk.m0 + warp_row;
  float o[Traits::kOutRegs];
#pragma unroll
  for (int i = 0; i < Traits::kOutRegs; ++i) o[i] = 0.f;
  Softmax softmax;
  softmax.init();

  // The scale of the scores in log2 units; e4m3 inputs fold their q and k descale factors into
  // it (and v's into the output). A negative scale negates Q (core/softmax.cuh).
  float v_descale = 1.f;
  double scale = p.softmax_scale;
  if constexpr (Traits::kTransposes) {
    const auto descale = [&](const float* x, int64_t batch_stride, int64_t head_stride) {
      return x == nullptr ? 1.f : x[blk.b * batch_stride + blk.h_kv * head_stride];
    };
    scale *= static_cast<double>(descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride)) *
             descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride);
    v_descale = descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride);
  }
  const float scale_log2 = fmaxf(static_cast<float>(fabs(scale) * kLog2e), kSmallestNormalFloat);
  const bool negate_q = scale < 0;

  if (n_visits > 0) {  // otherwise every row sees no key: the epilogue writes zeros
    load_q(negate_q);

    const uint64_t q_desc =
        wgmma::descriptor_128b(q_tile + warpgroup * Traits::kRowsPerWarpgroup * kRowBytes, 16, 8 * kRowBytes);
    const uint64_t k_desc = wgmma::descriptor_128b(ring.k_tile, 16, 8 * kRowBytes);
    // V: MN-major, 64-column panels kBlockN rows apart; V^T (kTransposes): K-major like K.
    const uint64_t v_desc = Traits::kTransposes ? wgmma::descriptor_128b(ring.vt_tile, 16, 8 * kRowBytes)
                                                : wgmma::descriptor_128b(ring.v_tile, kBlockN * kRowBytes, 8 * kRowBytes);

    uint32_t p_prev[Traits::kKeySlices][4];  // P(i-1), the A operand of the product in flight in tile i

    // Keys of the first visited tile (the last key tile) inside the sequence: with kSequences
    // the rest of its V rows are zeroed once landed (zero_rows_past), before P(0) V(0) reads them.
    const int first_tile_keys = static_cast<int>(min(blk.seqlen_k - int64_t{tile_end - 1} * kBlockN, int64_t{kBlockN}));
    const bool zero_first_values = kSequences && first_tile_keys < kBlockN;

    const auto attend_key_tile = [&](const int i, auto masked, auto first) {
      constexpr bool kMasked = decltype(masked)::value;
      constexpr bool kFirst = decltype(first)::value;
      const int64_t n0 = static_cast<int64_t>(tile_end - 1 - i) * kBlockN;
      const int stage = static_cast<int>((visit0 + i) % kStages);
      const int prev_stage = static_cast<int>((visit0 + i + kStages - 1) % kStages);

      tma::wait(ring.full_k(stage), ((visit0 + i) / kStages) & 1);
      if constexpr (!kFirst) tma::wait(ring.values_full(prev_stage), ((visit0 + i - 1) / kStages) & 1);

      flash_wgmma::attend_tile<Traits, kMasked, kFirst>(
          o, p_prev, softmax, mask, q_desc, wgmma::advance(k_desc, stage * Traits::kKVTileBytes),
          wgmma::advance(v_desc, prev_stage * Traits::kValuesTileBytes), warp_m0 + g, n0, t, scale_log2,
          [&] {
            if (lane == 0) tma::arrive(ring.empty_k(stage));  // S(i) has read K(i)
          },
          [&] {
            if (lane == 0) tma::arrive(ring.values_empty(prev_stage));  // P(i-1) V(i-1) has read V(i-1)
          });
    };

    attend_key_tile(0, std::true_type{}, std::true_type{});
    // V(0) is zeroed here, once, not by a check inside the visits: inlined there it lengthened both
    // loop bodies of every sequence-layout block (benchmarks/NOTES.md, "Varlen"). Its first reader
    // (visit 1, or the last product when there is one visit) waits for V(0) anyway.
    if (zero_first_values) {
      const int stage = static_cast<int>(visit0 % kStages);
      tma::wait(ring.full_v(stage), (visit0 / kStages) & 1);
      zero_rows_past<Traits>(ring.v_tile + stage * Traits::kKVTileBytes, first_tile_keys);
    }
    int i = 1;
    const int n_masked = min(n_visits, tile_end - blk.n_unmasked);  // visits of tiles >= n_unmasked
    for (; i < n_masked; ++i) attend_key_tile(i, std::true_type{}, std::false_type{});
    for (; i < n_visits; ++i) attend_key_tile(i, std::false_type{}, std::false_type{});

    // The last product, P(n-1) V(n-1).
    const int last_stage = static_cast<int>((visit0 + n_visits - 1) % kStages);
    tma::wait(ring.values_full(last_stage), ((visit0 + n_visits - 1) / kStages) & 1);
    flash_wgmma::attend_last_values<Traits>(o, p_prev,
                                            wgmma::advance(v_desc, last_stage * Traits::kValuesTileBytes));
    // The ring runs on into the next block's tiles (the persistent kernel): V(n-1)'s buffer is free.
    if constexpr (kReleaseLastValues) {
      if (lane == 0) tma::arrive(ring.values_empty(last_stage));
    }
  }

  float inv_sum[Softmax::kRows];
  softmax.finalize(inv_sum);
  if constexpr (kSequences) blk.reload_query_rows(p);
  if constexpr (Traits::kTransposes) {
    // O in p.out_dtype, staged in the V ring: every V tile has been transposed (this warp's
    // products waited for the last V^T), and no copy into the ring is pending.
#pragma unroll
    for (int r = 0; r < Softmax::kRows; ++r) inv_sum[r] *= v_descale;
    // (The persistent kernel's ring runs on into the next item's V tiles: it stages in a tile of its own.)
    unsigned char* const staging = q_smem + ((kReleaseLastValues ? ring.o_stage : ring.v_tile) - q_tile);
    if (p.out_dtype == DType::kFloat16) {
      flash_wgmma::write_block_output<Traits, __half>(p, blk, o, inv_sum, softmax, staging, warp_row, warp_m0, lane);
    } else {
      flash_wgmma::write_block_output<Traits, __nv_bfloat16>(p, blk, o, inv_sum, softmax, staging, warp_row, warp_m0,
                                                             lane);
    }
  } else {
    flash_wgmma::write_block_output<Traits>(p, blk, o, inv_sum, softmax, q_smem, warp_row, warp_m0, lane);
  }
}

template <typename Traits, typename Mask, bool kSequences>
__device__ __forceinline__ void attend_block(const AttentionParams& p, const CUtensorMap* k_map,
                                             const CUtensorMap* v_map) {
  static_assert(!(Traits::kTransposes && kSequences), "e4m3 runs dense batches");
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* q_smem;
  const Ring<Traits> ring = make_ring<Traits, 1>(smem_raw, q_smem);

  FlashBlock blk;
  if (!locate_flash_block<Mask, kSequences>(p, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const int tile_end = blk.n_tiles;
  const int n_visits = tile_end;

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == Traits::kWarpgroups) {  // the producer
    tma::registers_shrink<Traits::kProducerRegisters>();
    if (threadIdx.x == Traits::kConsumerThreads && n_visits > 0) {
      tma::prefetch_map(k_map);
      tma::prefetch_map(v_map);
      produce_block<Traits>(k_map, v_map, ring, 0u, n_visits, blk);
    }
    if constexpr (Traits::kTransposes) {
      const int producer_warp = (threadIdx.x - Traits::kConsumerThreads) / 32;
      if (producer_warp >= 1) {
        for (int i = 0; i < n_visits; ++i) transpose_visit(ring, i % kStages, (i / kStages) & 1, producer_warp - 1);
      }
    }
    return;
  }
  tma::registers_grow<Traits::kConsumerRegisters>();
  consume_block<Traits, Mask, kSequences>(p, blk, ring, ring.q_tile, q_smem, 0u, [&](bool negate_q) {
    // Q by the consumers (threads 0 .. kConsumerThreads - 1, the wgmma kernel's copy pattern).
    flash_wgmma::load_tile<Traits, Traits::kBlockM, true>(ring.q_tile, blk.q_rows<typename Traits::Element>(p),
                                                         p.q_row_stride, blk.rows);
    mma::commit_copies();
    mma::wait_copies<0>();
    if (negate_q) flash_wgmma::negate_own_q_chunks<Traits>(q_smem);
    wgmma::fence_proxy_async();
    tma::named_barrier_sync(1, Traits::kConsumerThreads);
  });
}

// The persistent kernel (dense batches, wgmma_ws_persistent_shape): a grid of at most one wave of blocks, each
// taking its work items in the walk kOrder (core/schedule.cuh, PersistentWalk: non-causal in the one-block-per-item grid's order; causal
// that order dealt back and forth, the heaviest query blocks of every head first, or a head's query blocks in
// pairs of equal work, as wgmma_ws_causal_walk picks). The producer loads each item's Q tile by TMA into one of two
// Q tiles, then its K and V tiles into the ring, whose visits run on from item to item; so the next item's Q and
// first K/V tiles land while the consumers finish the current one (its last P V product and its output), and no
// block starts or ends between items. A Q tile is free again once every consumer warp has staged and stored its
// output rows through it. With e4m3 the transposer warps walk the same items, their V^T visits running on too,
// and O is staged in a tile of its own (the V ring already holds the next item's tiles). wgmma_ws_persistent_shape
// says which calls run it.
template <typename Traits, typename Mask, WalkOrder kOrder>
__device__ __forceinline__ void attend_items(const AttentionParams& p, const CUtensorMap* q_map,
                                             const CUtensorMap* k_map, const CUtensorMap* v_map) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* q_smem;
  const Ring<Traits> ring = make_ring<Traits, 2>(smem_raw, q_smem);

  const int64_t m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  using Walk = PersistentWalk<kOrder>;  // this block's items (core/schedule.cuh)
  const auto locate = [&](const Walk& it, FlashBlock& blk) {
    locate_flash_item<Mask>(p, it.at(), m_blocks, kBlockM, kBlockN, blk);
  };
  // The ring's visits so far, and the items so far (item q_uses takes Q tile q_uses % 2; one whose
  // rows see no key gets the tile without a load, to stage its zeros in): only their residues mod 4
  // matter (stage and phase), so they may wrap.
  uint32_t visit0 = 0;
  uint32_t q_uses = 0;
  if (threadIdx.x / 128 == Traits::kWarpgroups) {  // the producer
    tma::registers_shrink<Traits::kPersistentProducerRegisters>();
    if constexpr (Traits::kTransposes) {
      // Producer warps 1-3: each item's V tiles into V^T (as attend_block), the ring's visits running on.
      const int producer_warp = (threadIdx.x - Traits::kConsumerThreads) / 32;
      if (producer_warp >= 1) {
        uint32_t visit = 0;
        for (Walk it = Walk::start(m_blocks, p.batch * p.heads); it.more(); it.next()) {
          FlashBlock blk;
          locate(it, blk);
          for (int i = 0; i < blk.n_tiles; ++i, ++visit)
            transpose_visit(ring, static_cast<int>(visit % Traits::kStages), (visit / Traits::kStages) & 1,
                            producer_warp - 1);
        }
        return;
      }
    }
    if (threadIdx.x != Traits::kConsumerThreads) return;
    tma::prefetch_map(q_map);
    tma::prefetch_map(k_map);
    tma::prefetch_map(v_map);
    for (Walk it = Walk::start(m_blocks, p.batch * p.heads); it.more(); it.next()) {
      FlashBlock blk;
      locate(it, blk);
      const int n_visits = blk.n_tiles;
      const int b = static_cast<int>(q_uses % 2);
      tma::wait(ring.empty_q(b), ((q_uses / 2) & 1) ^ 1);
      ++q_uses;
      if (n_visits == 0) {  // rows that see no key: the consumers stage zeros in the tile
        tma::arrive(ring.full_q(b));
        continue;
      }
      tma::arrive_expect_tx(ring.full_q(b), Traits::kQTileBytes);
      const uint32_t q_tile = ring.q_tile + b * Traits::kQTileBytes;
#pragma unroll
      for (int panel = 0; panel < Traits::kPanels; ++panel) {
        tma::load_4d(q_tile + panel * kBlockM * Traits::kRowBytes, q_map, ring.full_q(b), panel * Traits::kPanelCols,
                     static_cast<int>(blk.m0), static_cast<int>(blk.h), static_cast<int>(blk.b));
      }
      produce_block<Traits>(k_map, v_map, ring, visit0, n_visits, blk);
      visit0 += n_visits;
    }
    return;
  }
  tma::registers_grow<Traits::kPersistentConsumerRegisters>();
  for (Walk it = Walk::start(m_blocks, p.batch * p.heads); it.more(); it.next()) {
    FlashBlock blk;
    locate(it, blk);
    const int n_visits = blk.n_tiles;
    const int b = static_cast<int>(q_uses % 2);
    const uint32_t q_parity = (q_uses / 2) & 1;
    const uint32_t q_tile = ring.q_tile + b * Traits::kQTileBytes;
    unsigned char* const q_bytes = q_smem + b * Traits::kQTileBytes;
    if (n_visits == 0) tma::wait(ring.full_q(b), q_parity);  // the tile is this item's to stage zeros in
    consume_block<Traits, Mask, false, true>(p, blk, ring, q_tile, q_bytes, visit0, [&](bool negate_q) {
      tma::wait(ring.full_q(b), q_parity);
      if (negate_q) {
        flash_wgmma::negate_own_q_chunks<Traits>(q_bytes);
        wgmma::fence_proxy_async();
        tma::named_barrier_sync(1, Traits::kConsumerThreads);
      }
    });
    // The warp's output rows have left the Q tile; its staging writes are ordered before the
    // producer's next TMA load into the tile (another proxy).
    wgmma::fence_proxy_async();
    __syncwarp();
    if (threadIdx.x % 32 == 0) tma::arrive(ring.empty_q(b));
    visit0 += n_visits;
    ++q_uses;
  }
}

}  // namespace flash_wgmma_ws

// Query rows per block of the warp-specialized kernel: 128 (two consumer warpgroups) at head dim 128.
// At head dim 64: 192 (three) for calls of at least kWgmmaWsMinRows192 query rows, where the
// softmax's dependency chains, not a pipe, bound two warps per scheduler (benchmarks/NOTES.md:
// 1.06-1.27x over 128 at 2k-16k). A query block of 192 rows wastes up to 191 rows of a sequence's
// last block, which shorter calls feel (0.85x at 1k causal); they take blocks of 64 rows (one
// consumer warpgroup), two per SM (16-bit causal calls and non-causal ones under 1024 rows: three, over
// 64-key tiles, see kWgmmaWsD64SmallTileBlocksPerSM), so that one block's start (Q copy, first loads, first softmax)
// and end run beside the other's main loop: 1.08-1.16x over blocks of 128 at 256-1024 rows on an
// H100 and an H200; from 2048 rows 192 stays ahead (H200: 64 at 0.95x non-causal at 2k, 0.84-0.99x
// from 4k), each K/V tile feeding 64 rows instead of 192. Causal calls keep 64 up to 4096 rows: with
// the 64-row causal blocks over 64-key tiles, three per SM, over 192 on an H200 1.00x at 3072 rows,
// 1.015-1.025x at 4096, 0.93x at 8192 (benchmarks/NOTES.md; with two blocks of 128-key tiles per SM
// the threshold had been 2304: H100 0.99x there, 0.95-0.97x at 3072).
constexpr int kWgmmaWsBlockMHeadDim64 = 192;
constexpr int64_t kWgmmaWsMinRows192 = 2048;
constexpr int64_t kWgmmaWsMinRows192Causal = 4097;
constexpr int kWgmmaWsBlockMShort = 64;
constexpr int kWgmmaWsShortBlocksPerSM = 2;

template <typename Element, int kHeadDim, int kBlockM, int kBlocksPerSM = 1, int kBlockN = kWgmmaBlockN>
using FlashWgmmaWsRingTraits = FlashWgmmaWsTraits<Element, kHeadDim, 2, kBlockM, kBlocksPerSM, kBlockN>;

// The instantiation of the largest shared memory per head dim (what the kernel table reports).
template <typename Element, int kHeadDim>
using FlashWgmmaWsDefaultTraits =
    FlashWgmmaWsRingTraits<Element, kHeadDim, kHeadDim == 64 ? kWgmmaWsBlockMHeadDim64 : kWgmmaBlockM>;

/// \brief Query rows per block for a call (p.seqlen_q: with cu_seqlens_q the longest sequence's bound).
inline int wgmma_ws_block_m(const AttentionParams& p) {
  // WAVEBOOST_WGMMA_D64_ROWS=64 or 192 (read once per process) picks the head dim 64 height of every call, to
  // measure the rule.
  static const int forced = [] {
    const char* v = std::getenv("WAVEBOOST_WGMMA_D64_ROWS");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n == kWgmmaWsBlockMShort || n == kWgmmaWsBlockMHeadDim64 ? n : 0;
  }();
  if (p.head_dim != 64) return kWgmmaBlockM;
  if (forced > 0) return forced;
  const int64_t min_rows_192 = p.is_causal ? kWgmmaWsMinRows192Causal : kWgmmaWsMinRows192;
  return p.seqlen_q >= min_rows_192 ? kWgmmaWsBlockMHeadDim64 : kWgmmaWsBlockMShort;
}

// Head dim 128, causal calls under kWgmmaWsD128ShortMaxRows query rows: blocks of 64 rows with
// 64-key tiles, two per SM (81 KB of shared memory each; with 128-key tiles a 64-row block takes
// 145 KB, one per SM). Over 128 x 128 blocks (H100, bf16 and fp16): causal 1.09x at 512 rows,
// 1.05-1.06x at 768, 1.02-1.03x at 1024, 0.98x at 1536; non-causal 1.01x at 512 and 0.91-0.98x from
// 768, so non-causal calls keep 128 x 128 (and no non-causal kernel of this shape is built). Dense
// 16-bit calls that fill a wave of 128-row blocks run the persistent grid instead, which leads it
// (wgmma_ws_persistent); the rest (sequence layouts, small grids) run this shape.
// WAVEBOOST_WGMMA_D128_ROWS=128 (read once per process) turns it off, to measure the rule.
constexpr int kWgmmaWsD128ShortBlockN = 64;
constexpr int64_t kWgmmaWsD128ShortMaxRows = 1280;

// Head dim 64, 16-bit causal calls in 64-row blocks (under kWgmmaWsMinRows192Causal query rows): tiles
// of 64 keys, three blocks per SM (~42 KB each; S, O and P in the 136 registers a consumer gets of a
// third of the register file), where two blocks of 128-key tiles (75 KB) left the SM waiting on each
// block's start and end (benchmarks/NOTES.md, "Head dim 64's short blocks at three blocks per SM":
// H200, bf16 and fp16, 1.20x at 512 rows, 1.13x at 1024, 1.07x at 2048). Non-causal calls take them under
// kWgmmaWsD64SmallTileMaxRowsNonCausal rows (on the persistent grid 1.04x at 512 rows, 1.00x at 1024-1536,
// "Short non-causal shapes and ring depths"; one block per query block 1.03x at 512), from there 128-key
// tiles, two per SM.
constexpr int kWgmmaWsD64SmallTileBlockN = 64;
constexpr int kWgmmaWsD64SmallTileBlocksPerSM = 3;
constexpr int64_t kWgmmaWsD64SmallTileMaxRowsNonCausal = 1024;

/// \brief Warp-specialized flash attention forward; grid as the wgmma kernel's (query blocks,
/// batch * heads folded over y and z), kBlockM / 64 consumer warpgroups and a producer per block.
/// kSequences: p may carry cu_seqlens_q / cu_seqlens_k / seqused_k (not a paged K/V).
template <typename Element, int kHeadDim, int kBlockM, int kBlocksPerSM, int kBlockN, bool kCausal, bool kSequences>
__global__ void __launch_bounds__(
    FlashWgmmaWsRingTraits<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN>::kBlockThreads, kBlocksPerSM)
    flash_wgmma_ws_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map) {
  flash_wgmma_ws::attend_block<FlashWgmmaWsRingTraits<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN>,
                               CausalMask<kCausal>, kSequences>(p, &k_map, &v_map);
}

/// \brief The persistent form (flash_wgmma_ws::attend_items) of the kernel above, dense batches
/// (wgmma_ws_persistent_shape): a 1-D grid of at most kBlocksPerSM blocks per SM walking its items in
/// the order kOrder.
template <typename Element, int kHeadDim, int kBlockM, int kBlocksPerSM, int kBlockN, bool kCausal, WalkOrder kOrder>
__global__ void __launch_bounds__(
    FlashWgmmaWsRingTraits<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN>::kBlockThreads, kBlocksPerSM)
    flash_wgmma_ws_persistent_kernel(const __grid_constant__ AttentionParams p,
                                     const __grid_constant__ CUtensorMap q_map,
                                     const __grid_constant__ CUtensorMap k_map,
                                     const __grid_constant__ CUtensorMap v_map) {
  flash_wgmma_ws::attend_items<FlashWgmmaWsRingTraits<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN>,
                               CausalMask<kCausal>, kOrder>(p, &q_map, &k_map, &v_map);
}

/// \brief Whether a dense call runs the persistent kernel, and in which walk (core/schedule.cuh).
/// Non-causal calls (walk kGrid) of head dim 128's 128 x 128 blocks up to kWgmmaWsPersistentMaxKeys keys and
/// of head dim 64's 64-row blocks (under 2048 query rows; three per SM over 64-key tiles under 1024) up to
/// kWgmmaWsPersistentMaxKeysHeadDim64, where a block's start and end (Q load, first K/V tiles, output) weigh
/// against its key tiles. H100, FA2 grid, over one block per query block (three alternating rounds,
/// benchmarks/NOTES.md, "The persistent wgmma forward"): head dim 128 bf16 1.20x at 1024 keys, 1.10-1.15x
/// at 1536-2048, 1.08-1.09x at 3072-4096, 1.01x at 8192 (timed by the bench suite, three rounds: 1.02x at
/// 4096, 1.01-1.06x at 8192, level at 16k); head dim 64 bf16 / fp16 1.28 / 1.20x at 256 keys, 1.11x at
/// 512, 1.10 / 1.05x at 1024, 1.09 / 1.03x at 1536.
/// Causal calls of head dim 128 in 128 x 128 blocks: from kWgmmaWsHeaviestFirstMinRows query rows the
/// heaviest query blocks of every head first (H200, paired in one process over one block per query
/// block, "The persistent causal forward": 1.03-1.05x at 8k, 1.03x at 16k, 1.01-1.03x at 32k); below it,
/// where the grid fills a wave of blocks, the grid's order dealt back and forth (H200, bf16 / fp16, over
/// main's one block per query block of 64 x 64 blocks under 1280 rows, 128 x 128 above, "Causal persistent
/// walks": 1.17-1.18x at 512, 1.13-1.15x at 1k, 1.12-1.14x at 2k, 1.04-1.05x at 3k, 1.07x at 4k, 1.04-1.05x
/// at 6k; 1.09-1.20x at 512-2k over the heaviest-first walk, which spreads the blocks in flight over every
/// head's K/V). Causal calls of head dim 64's 64-row blocks (three per SM) under
/// kWgmmaWsPersistentMaxRowsCausalHeadDim64 query rows whose pairs of query blocks fill a wave: the pairs
/// walk (1.11-1.12x at 512, 1.05-1.06x at 1k, level at 2k, 0.97-0.98x at 4k).
/// WAVEBOOST_WGMMA_PERSISTENT=0 or 1 (read once per process) decides for every call of those block shapes,
/// to measure the rules.
constexpr int64_t kWgmmaWsPersistentMaxKeys = 8192;
constexpr int64_t kWgmmaWsPersistentMaxKeysHeadDim64 = 2048;
constexpr int64_t kWgmmaWsHeaviestFirstMinRows = 8192;
constexpr int64_t kWgmmaWsPersistentMaxRowsCausalHeadDim64 = 2048;

/// \brief The walk of a causal call's persistent grid.
inline WalkOrder wgmma_ws_causal_walk(const AttentionParams& p) {
  if (p.head_dim == 64) return WalkOrder::kPairs;
  return p.seqlen_q >= kWgmmaWsHeaviestFirstMinRows ? WalkOrder::kHeaviestFirst : WalkOrder::kGridDealt;
}

/// \brief Whether a persistent grid of `blocks_per_sm` blocks per SM gives every block of a wave work
/// (`units`: its items, or pairs); where it would not, one block per query block starts them all at once.
inline bool wgmma_ws_fills_wave(const AttentionParams& p, int64_t units, int blocks_per_sm) {
  int sms = 0;
  if (!multiprocessor_count(p.device_id, &sms).ok()) return false;
  return units >= int64_t{sms} * blocks_per_sm;
}

inline bool wgmma_ws_persistent(const AttentionParams& p) {
  static const int forced = [] {
    const char* v = std::getenv("WAVEBOOST_WGMMA_PERSISTENT");
    return v == nullptr ? -1 : (std::atoi(v) != 0 ? 1 : 0);
  }();
  if (p.head_dim != 128 && p.head_dim != 64) return false;
  if (forced >= 0) return forced == 1;
  const int64_t heads = p.batch * p.heads;
  if (p.is_causal) {
    if (p.head_dim == 128) {
      if (p.seqlen_q >= kWgmmaWsHeaviestFirstMinRows) return true;
      return wgmma_ws_fills_wave(p, (p.seqlen_q + kWgmmaBlockM - 1) / kWgmmaBlockM * heads, 1);
    }
    if (p.seqlen_q >= kWgmmaWsPersistentMaxRowsCausalHeadDim64) return false;
    const int64_t tiles = (p.seqlen_q + kWgmmaWsBlockMShort - 1) / kWgmmaWsBlockMShort;
    return wgmma_ws_fills_wave(p, persistent_walk_units(WalkOrder::kPairs, tiles, heads),
                               kWgmmaWsD64SmallTileBlocksPerSM);
  }
  return p.seqlen_k <= (p.head_dim == 128 ? kWgmmaWsPersistentMaxKeys : kWgmmaWsPersistentMaxKeysHeadDim64);
}

// e4m3 calls with long rows run tiles of 192 keys (V^T in two panels; S 96, O 64 and P 24 registers
// per consumer thread), one block per query block: non-causal from kWgmmaWsE4m3WideMinKeys keys,
// causal from as many query rows (the calls the persistent grid leaves). Per tile the softmax's
// row max, sums, rescale and barrier waits cover 1.5x the keys (benchmarks/NOTES.md, "e4m3 tiles of
// 192 keys": 1.05x / 1.10x non-causal at 8k / 16k keys, 1.02x / 1.03x causal; 0.99x at 4k, below
// from 2k down, where the last tile's padding and the persistent grid's start weigh more).
constexpr int kWgmmaWsE4m3WideBlockN = 192;
constexpr int64_t kWgmmaWsE4m3WideMinKeys = 8192;
static_assert(kWgmmaWsE4m3WideMinKeys <= kWgmmaWsHeaviestFirstMinRows, "no e4m3 call walks heaviest first");

/// \brief Whether an e4m3 call runs the 192-key tiles (above).
inline bool wgmma_ws_e4m3_wide(const AttentionParams& p) {
  return p.is_fp8() && p.is_dense() && p.seqlen_k > 0 &&
         (p.is_causal ? p.seqlen_q : p.seqlen_k) >= kWgmmaWsE4m3WideMinKeys;
}

/// \brief Whether launch_flash_wgmma_ws gives a call one of the persistent kernel's block shapes (head
/// dim 128's 128-row blocks, head dim 64's 64-row blocks) and wgmma_ws_persistent takes it: dense,
/// fewer than 2^31 work items (the walks count them in 32 bits, with a grid of fewer than 2^31
/// blocks). The launch then runs the persistent kernel where TMA can describe Q (wgmma_tma_persistent).
/// e4m3 calls (head dim 128) take the same rules with keys present, except those of the 192-key tiles
/// (wgmma_ws_e4m3_wide), which include every causal call the heaviest-first walk would take: on the
/// persistent grid they ran 1.18 / 1.11 / 1.07 / 1.03x non-causal at 512 / 1k / 2k / 4k keys and
/// 1.21 / 1.16 / 1.07 / 1.01x causal at 512-4k rows, but heaviest first 0.98x at 16k causal rows
/// (benchmarks/NOTES.md, "The e4m3 forward on the persistent grid").
inline bool wgmma_ws_persistent_shape(const AttentionParams& p) {
  if (!p.is_dense() || !wgmma_ws_persistent(p)) return false;
  if ((p.is_fp8() && p.seqlen_k == 0) || wgmma_ws_e4m3_wide(p)) return false;
  if (p.head_dim == 64 && wgmma_ws_block_m(p) != kWgmmaWsBlockMShort) return false;
  const int block_m = p.head_dim == 128 ? kWgmmaBlockM : kWgmmaWsBlockMShort;
  return (p.seqlen_q + block_m - 1) / block_m * p.batch * p.heads < (int64_t{1} << 31);
}

// Head dim 128, 16-bit non-causal dense calls past the persistent grid's keys run tiles of 192 keys, one block per
// query block (S 96, O 64, P 48 registers of a consumer's 240; 225 KB of shared memory, too much for the
// persistent form's second Q tile): 1.02 / 1.04x at 16k keys bf16 / fp16, 1.01x at 8k against the persistent
// grid, 0.92-0.96x at 2k-4k (benchmarks/NOTES.md, "Head dim 128 16-bit non-causal tiles of 192 keys").
constexpr int kWgmmaWsD128WideBlockN = 192;

/// \brief Whether a call runs the 16-bit 192-key tiles (above).
inline bool wgmma_ws_d128_wide(const AttentionParams& p) {
  return !p.is_fp8() && p.head_dim == 128 && !p.is_causal && p.is_dense() &&
         p.seqlen_k > kWgmmaWsPersistentMaxKeys && !wgmma_ws_persistent_shape(p);
}

/// \brief Whether a causal head dim 128 call runs blocks of 64 rows over 64-key tiles, two per SM (above).
inline bool wgmma_ws_d128_short(const AttentionParams& p) {
  static const bool off = [] {
    const char* v = std::getenv("WAVEBOOST_WGMMA_D128_ROWS");
    return v != nullptr && std::atoi(v) == kWgmmaBlockM;
  }();
  return !off && p.is_causal && p.head_dim == 128 && p.seqlen_q < kWgmmaWsD128ShortMaxRows &&
         !wgmma_ws_persistent_shape(p);
}

/// \brief Whether the warp-specialized kernel takes a call's layout: keys, contiguous K/V (dense,
/// varlen with its packed extent p.total_k known, seqused_k), key indices in int.
inline bool wgmma_ws_takes(const AttentionParams& p) {
  const int64_t rows = p.is_varlen_k() ? p.total_k : p.seqlen_k;
  return p.seqlen_k > 0 && rows > 0 && rows < (int64_t{1} << 31) && !p.is_paged();
}

/// \brief Which masks a block shape's kernels are built for: the rules send only those calls to it.
enum class WsMasks { kBoth, kCausal, kNonCausal };

/// \brief The launch of one block height (launch_flash_wgmma_ws picks it), with kernels built for kMasks.
template <typename Element, int kHeadDim, int kBlockM, int kBlocksPerSM = 1, int kBlockN = kWgmmaBlockN,
          WsMasks kMasks = WsMasks::kBoth>
Status launch_flash_wgmma_ws_rows(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashWgmmaWsRingTraits<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN>;
  // Without keys (e4m3 only: the other dtypes run such calls on the wgmma kernel) no tile is
  // loaded and the maps are never read.
  CUtensorMap k_map{}, v_map{};
  if (p.seqlen_k > 0 && !tma::encode_kv_maps(p, Traits::kBlockN, &k_map, &v_map)) {
    return Status::NotSupported("TMA cannot describe k or v (strides must be positive multiples of 16 bytes)");
  }
  if (Status s = folded_grid_check(p, Traits::kBlockM, "wgmma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const bool sequences = !p.is_dense();
  // Sequence layouts run on the 16-bit tiles of at most 128 keys (e4m3 and the wide tiles: dense batches).
  constexpr bool kSequenceKernels = !Traits::kTransposes && kBlockN <= kWgmmaBlockN;
  if constexpr (!kSequenceKernels) {
    if (sequences) return Status::NotSupported("this wgmma tile shape runs dense batches");
  }
  // One block per query block: the kernel for the call's mask.
  const auto block_kernel = [sequences](auto causal) {
    constexpr bool kCausal = decltype(causal)::value;
    return sequences ? flash_wgmma_ws_kernel<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN, kCausal, kSequenceKernels>
                     : flash_wgmma_ws_kernel<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN, kCausal, false>;
  };
  void (*kernel)(AttentionParams, CUtensorMap, CUtensorMap) = nullptr;
  if constexpr (kMasks != WsMasks::kNonCausal) {
    if (p.is_causal) kernel = block_kernel(std::true_type{});
  }
  if constexpr (kMasks != WsMasks::kCausal) {
    if (!p.is_causal) kernel = block_kernel(std::false_type{});
  }
  if (kernel == nullptr) return Status::Internal("this wgmma block shape is not built for this call's mask");
  // The persistent kernel: head dim 128's 128 x 128 blocks and head dim 64's 64-row blocks.
  if constexpr ((kHeadDim == 128 && kBlockM == kWgmmaBlockM && kBlockN == kWgmmaBlockN) ||
                (kHeadDim == 64 && kBlockM == kWgmmaWsBlockMShort)) {
    if (wgmma_ws_persistent_shape(p)) {  // the shape condition above, and a dense call
      CUtensorMap q_map{};
      if (tma::encode_rows_map(&q_map, p.q, p.dtype, p.head_dim, p.seqlen_q, p.heads, p.batch, p.q_row_stride,
                               p.q_head_stride, p.q_batch_stride, Traits::kBlockM)) {
        // The walk wgmma_ws_causal_walk picks; each shape builds only the walks its calls can take.
        const WalkOrder order = p.is_causal ? wgmma_ws_causal_walk(p) : WalkOrder::kGrid;
        const auto persistent_kernel = [](auto causal, auto walk) {
          return flash_wgmma_ws_persistent_kernel<Element, kHeadDim, kBlockM, kBlocksPerSM, kBlockN,
                                                  decltype(causal)::value, decltype(walk)::value>;
        };
        using Grid = std::integral_constant<WalkOrder, WalkOrder::kGrid>;
        using Pairs = std::integral_constant<WalkOrder, WalkOrder::kPairs>;
        using GridDealt = std::integral_constant<WalkOrder, WalkOrder::kGridDealt>;
        using HeaviestFirst = std::integral_constant<WalkOrder, WalkOrder::kHeaviestFirst>;
        void (*persistent)(AttentionParams, CUtensorMap, CUtensorMap, CUtensorMap) = nullptr;
        if constexpr (kMasks != WsMasks::kCausal) {
          if (!p.is_causal) persistent = persistent_kernel(std::false_type{}, Grid{});
        }
        if constexpr (kMasks != WsMasks::kNonCausal) {
          if constexpr (kHeadDim == 64) {
            if (p.is_causal && order == WalkOrder::kPairs) persistent = persistent_kernel(std::true_type{}, Pairs{});
          } else {
            if (p.is_causal && order == WalkOrder::kGridDealt)
              persistent = persistent_kernel(std::true_type{}, GridDealt{});
            if constexpr (!Traits::kTransposes) {  // (e4m3 calls never walk heaviest first)
              if (p.is_causal && order == WalkOrder::kHeaviestFirst)
                persistent = persistent_kernel(std::true_type{}, HeaviestFirst{});
            }
          }
        }
        if (persistent == nullptr) return Status::Internal("no persistent wgmma kernel of this shape for this call");
        int sms = 0;
        if (Status s = multiprocessor_count(p.device_id, &sms); !s.ok()) return s;
        const int64_t units = persistent_walk_units(order, g.x, p.batch * p.heads);
        const int64_t slots = int64_t{sms} * kBlocksPerSM;
        const auto blocks = static_cast<unsigned>(std::min(units, slots));  // at most one wave
        WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(persistent, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   Traits::kPersistentSmemBytes));
        persistent<<<blocks, Traits::kBlockThreads, Traits::kPersistentSmemBytes, stream>>>(p, q_map, k_map, v_map);
        return cuda_status(cudaGetLastError(), "flash_wgmma_ws_persistent_kernel launch");
      }
    }
  }
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kBlockThreads, Traits::kSmemBytes, stream>>>(p, k_map, v_map);
  return cuda_status(cudaGetLastError(), "flash_wgmma_ws_kernel launch");
}

/// \brief Builds the tensor maps of K and V and launches the warp-specialized kernel on
/// `stream`, blocks of wgmma_ws_block_m(p) query rows. NotSupported (nothing launched) where TMA
/// cannot describe K or V or the call's layout is not one it runs: the caller then runs the wgmma kernel.
template <typename Element, int kHeadDim>
Status launch_flash_wgmma_ws(const AttentionParams& p, cudaStream_t stream) {
  // e4m3 has no other kernel: a dense batch without keys runs here too (zeros, LSE -inf).
  const bool no_keys = sizeof(Element) == 1 && p.seqlen_k == 0 && p.is_dense();
  if (!wgmma_ws_takes(p) && !no_keys) {
    return Status::NotSupported(
        "the warp-specialized wgmma kernel runs contiguous K/V with keys (with cu_seqlens_k: total_k set)");
  }
  if constexpr (kHeadDim == 64) {
    if (wgmma_ws_block_m(p) == kWgmmaWsBlockMHeadDim64)
      return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaWsBlockMHeadDim64>(p, stream);
    static_assert(sizeof(Element) == 2, "head dim 64 runs 16-bit inputs (no e4m3 kernel)");
    if (p.is_causal || p.seqlen_q < kWgmmaWsD64SmallTileMaxRowsNonCausal)
      return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaWsBlockMShort, kWgmmaWsD64SmallTileBlocksPerSM,
                                        kWgmmaWsD64SmallTileBlockN>(p, stream);
    return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaWsBlockMShort, kWgmmaWsShortBlocksPerSM, kWgmmaBlockN,
                                      WsMasks::kNonCausal>(p, stream);
  } else {
    if constexpr (sizeof(Element) == 1) {
      if (wgmma_ws_e4m3_wide(p))
        return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaBlockM, 1, kWgmmaWsE4m3WideBlockN>(p, stream);
    }
    if constexpr (sizeof(Element) == 2) {
      if (wgmma_ws_d128_wide(p))
        return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaBlockM, 1, kWgmmaWsD128WideBlockN,
                                          WsMasks::kNonCausal>(p, stream);
      if (wgmma_ws_d128_short(p))
        return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaWsBlockMShort, kWgmmaWsShortBlocksPerSM,
                                          kWgmmaWsD128ShortBlockN, WsMasks::kCausal>(p, stream);
    }
    return launch_flash_wgmma_ws_rows<Element, kHeadDim, kWgmmaBlockM>(p, stream);
  }
}

}  // namespace waveboost::cuda
