// Split-KV decode (backend "decode"): attention for few query rows per sequence against a long
// KV cache, at the memory-bandwidth limit.
//
// One block owns one (sequence, kv head, piece of the keys) and packs every query row that reads
// that kv head, seqlen_q x (heads / heads_kv) of them ordered (query position, head of the
// group), into one tile of kBlockM rows: each K/V byte then leaves HBM once per kv head, not once
// per query head. (More rows than kBlockM take further row tiles, each reading the keys again.)
// K/V tiles of kBlockN keys stream through kStages shared-memory stages with 16 B cp.async,
// their addresses from core::KVAddress (dense, packed or paged: the page of key j through the
// block table); on sm_90, dense and paged caches stream by TMA instead
// (kTma, decode_tma_takes: one thread loads each tile as 64-column boxes that complete an mbarrier per stage, and issues tile
// i + kStages - 1 before the wait for tile i). Scores and P V run on mma.sync m16n8k16 with fp32
// accumulators and the online softmax in fp32, FlashAttention-2 style; with kBlockM = 16 the four
// warps split each key tile instead of the rows (with 32, two pairs of warps do), and merge their
// states at the end.
//
// Keys are cut into num_splits pieces (flash-decoding) when batch x kv heads leaves SMs idle:
// each piece writes O / l (fp32) and its LSE to a workspace, and the pieces are merged through
// their LSEs, either inside this kernel (the last piece of a row tile to finish merges them, see
// merge_pieces; on sm_90 the pieces of a (sequence, kv head) may instead run as one thread block
// cluster and merge through its shared memory, see merge_cluster) or by core::combine afterwards. The pieces are cut from each sequence's own
// length, read on the device (seqused_k, cu_seqlens), so nothing is read on the host and the
// launch shape depends only on the shapes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/kv_iterator.cuh"
#include "waveboost/cuda/mma_primitives.cuh"
#include "waveboost/cuda/tma_primitives.cuh"

namespace waveboost::cuda {

/// Split-KV pieces per (sequence, kv head) at most: bounds the merge's reads per output row and
/// its shared memory (a weight per piece and row).
constexpr int kDecodeMaxSplits = 128;

/// \brief Compile-time choices of the decode kernel.
/// \tparam Element_  __half or __nv_bfloat16.
/// \tparam kHeadDim_ 64 or 128.
/// \tparam kBlockM_  query rows per block: 16 (the four warps split the keys of a tile), 32 (two
///                   warps of 16 rows, each pair splitting the keys), 64 (each warp owns 16
///                   rows, as FlashAttention-2) or 128 (eight warps of 16 rows; the TMA variant).
/// \tparam kTma_    K/V tiles by TMA (one thread, boxes of 64 columns, an mbarrier per stage; sm_90,
///                   dense and paged caches) instead of 16 B cp.async from every thread.
template <typename Element_, int kHeadDim_, int kBlockM_, bool kTma_ = false>
struct DecodeTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr bool kTma = kTma_;
  static constexpr int kWarps = kBlockM_ == 128 ? 8 : 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpsM = kBlockM / 16;         // warps along the rows
  static constexpr int kWarpsN = kWarps / kWarpsM;     // warps along the keys of a tile
  // 32 KB of K and V per stage at either head dim: enough bytes in flight per SM to cover HBM
  // latency with two stages outstanding.
  static constexpr int kBlockN = kHeadDim == 64 ? 128 : 64;
  static constexpr int kStages = 3;
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys of a tile one warp scores

  static constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16 B
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kRowsPerCopyPass = kThreads / kChunksPerRow;

  static constexpr int kTileBytes = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kQBytes = kBlockM * kHeadDim * int(sizeof(Element));
  // Epilogue: each warp's O (fp32) per row, padded by 8 floats against bank conflicts.
  static constexpr int kOStride = kHeadDim + 8;
  static constexpr int kEpilogueBytes = kWarpsN * kBlockM * kOStride * 4 + 2 * kWarpsN * kBlockM * 4;
  // A cluster's piece (DecodeSplit::cluster) after the epilogue's tiles: O [kBlockM][kHeadDim] and
  // the LSE per row (fp32), read by the cluster's other blocks.
  static constexpr int kPieceBytes = kBlockM * kHeadDim * 4 + kBlockM * 4;
  // TMA: the K/V stages start at a 1024 B boundary (the 128 B swizzle's period), then a barrier per stage.
  static constexpr int kKVBytes = kStages * 2 * kTileBytes;
  static constexpr int kSmemBytes = kQBytes + kKVBytes + (kTma ? 1024 + kStages * 8 : 0);
  static constexpr int kPanelCols = 64;  // a TMA box's columns: 128 B of a row
  static constexpr int kPanels = kHeadDim / kPanelCols;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kBlockM == 16 || kBlockM == 32 || kBlockM == 64 || kBlockM == 128, "16, 32, 64 or 128 rows");
  static_assert(kWarpKeys % 16 == 0, "a warp scores whole k16 slices of keys");
  static_assert(kChunksPerRow >= 8 && kRowsPerCopyPass % 8 == 0, "swizzle period");
  static_assert(kBlockN % kRowsPerCopyPass == 0 && kBlockM % kRowsPerCopyPass == 0, "whole copy passes");
  static_assert(kEpilogueBytes + (kBlockM == 16 ? kPieceBytes : 0) <= kKVBytes,
                "the epilogue (and a cluster's piece: 16-row tiles) reuse the K/V stages");
  static_assert(kEpilogueBytes % 16 == 0, "the piece's O quads are 16 B aligned");
};

/// \brief Split-KV pieces of the decode kernel: with num_splits > 1, piece s of each block's keys
/// goes to o_accum [s][b][i][h][d] (fp32, normalized) and lse_accum [s][b][h][i], with i < seqlen_q.
/// With `arrivals` the kernel merges the pieces itself: arrivals holds one int32 counter per row
/// tile of each (sequence, kv head), [b][h_kv][row tile], all 0 at launch (the launcher clears
/// them in the kernel's stream); the piece that brings a counter to the number of pieces merges
/// them into out. Without it every piece is written, empty ones as O = 0, LSE = -inf, and the
/// caller runs core::combine. With `cluster` (the TMA kernel, 16-row tiles: one row tile per
/// (sequence, kv head)), the num_splits (2-8) pieces of a (sequence, kv head) run as one thread block
/// cluster of num_splits blocks and merge through distributed shared memory (decode::merge_cluster):
/// no workspace, no counters.
struct DecodeSplit {
  int num_splits = 1;
  float* o_accum = nullptr;
  float* lse_accum = nullptr;
  int* arrivals = nullptr;
  bool cluster = false;
  int extra_smem = 0;  // bytes of dynamic shared memory beyond the kernel's (blocks per SM, measured)
};

/// \brief Rows of the TMA decode kernel's K/V boxes (its tensor maps and its loads): a key tile, or
/// a page where pages are smaller.
__host__ __device__ __forceinline__ int decode_tma_box_rows(bool paged, int64_t page_size, int block_n) {
  return paged && page_size < block_n ? static_cast<int>(page_size) : block_n;
}

namespace decode {

// Element offset of 16 B chunk `chunk` of row `row` in a [rows][kHeadDim] tile whose chunks are
// XOR-swizzled by row: eight consecutive rows' chunk c land in eight distinct bank groups.
template <typename Traits>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * Traits::kHeadDim + ((chunk ^ (row & 7)) * Traits::kChunk);
}

// Element offset of chunk `chunk` of key row `row` in a K/V tile: 64-column panels of kBlockN rows
// in the 128 B swizzle (the layout a TMA box of 64 columns writes; at head dim 64 the same offsets
// as tile_offset).
template <typename Traits>
__device__ __forceinline__ int kv_offset(int row, int chunk) {
  static_assert(Traits::kPanelCols * sizeof(typename Traits::Element) == 128, "128 B panel rows");
  return static_cast<int>(mma::swizzle_128b_offset<Traits::kBlockN, sizeof(typename Traits::Element)>(row, chunk));
}

// A row's softmax state merged over the kWarpsN warps that scored its keys: m the max (log2
// units of the scaled scores), l the sum of exp2(score - m).
struct MergedRow {
  float m, l;
  __device__ __forceinline__ float m_use() const { return m == -INFINITY ? 0.f : m; }
  __device__ __forceinline__ float lse() const { return l == 0.f ? -INFINITY : m * kLn2 + logf(l); }
};

template <typename Traits>
__device__ __forceinline__ MergedRow merge_warps(const float* m_smem, const float* l_smem, int r) {
  MergedRow row{-INFINITY, 0.f};
#pragma unroll
  for (int w = 0; w < Traits::kWarpsN; ++w) row.m = fmaxf(row.m, m_smem[w * Traits::kBlockM + r]);
#pragma unroll
  for (int w = 0; w < Traits::kWarpsN; ++w)
    row.l += l_smem[w * Traits::kBlockM + r] * mma::exp2(m_smem[w * Traits::kBlockM + r] - row.m_use());
  return row;
}

// 16 B global -> shared copy (zero-filled when !valid) that also asks L2 to fetch the whole
// 256 B around it: a K/V row of one head is 128 or 256 contiguous bytes, read by 8 or 16 threads.
__device__ __forceinline__ void copy_row_chunk(uint32_t smem_addr, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Writes one merged item, columns 4 quad .. 4 quad + 3 of query row i and head h, to out (and its
// row's LSE from the item of quad 0): acc / sum of the pieces folded against their largest LSE max; a
// row that no piece saw a key of (max -inf) is zeros with LSE -inf, one with a NaN LSE is NaN.
template <typename Element>
__device__ __forceinline__ void write_merged_item(const AttentionParams& p, const core::SequenceInfo& seq, int64_t b,
                                                  int i, int h, int quad, float4 acc, float max, float sum,
                                                  bool nan) {
  const bool empty = max == -INFINITY;
  const float inv = nan || empty ? 0.f : 1.f / sum;
  float4 out = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (nan) out = make_float4(NAN, NAN, NAN, NAN);
  Element* dst = static_cast<Element*>(p.out) + seq.o_offset(p, b, i, h) + quad * 4;
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_pair<Element>(out.x, out.y), pack_pair<Element>(out.z, out.w));
  if (p.lse != nullptr && quad == 0) p.lse[seq.lse_offset(p, b, i, h)] = nan ? NAN : (empty ? -INFINITY : max + logf(sum));
}

// The in-kernel merge of one row tile's pieces by the block that finished last, as core::combine
// computes it: per row, with piece LSEs l_s and L = log sum_s exp(l_s), out = sum_s exp(l_s - L) O_s
// and lse = L; a piece with l_s = -inf does not count (its O may be anything, NaN included), a row
// whose pieces are all -inf is zeros with LSE -inf, and a NaN LSE makes the row NaN. Each thread
// takes kItems items (a live row, four columns) and walks the pieces kChunk at a time, the chunk's
// LSEs and O quads loaded together, folding them into a running maximum, sum and accumulator: one
// L2 round trip per chunk, where the LSEs first and then the O quads took two and a block barrier
// between them (benchmarks/NOTES.md, "Decode: where a batch-1 step's time goes"). The pieces were
// just written, so they are read from L2 (ld.cg: never a line this SM's L1 may hold from an earlier
// kernel).
template <typename Traits, int kItems, int kChunk>
__device__ __forceinline__ void merge_items(const AttentionParams& p, const DecodeSplit& split,
                                            const core::SequenceInfo& seq, int64_t b, int64_t h_kv, int64_t row0,
                                            int pieces, int live_rows) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int kQuads = D / 4;  // items per row: 32 or 16, so a row's items fill a warp or a half
  static_assert(kChunk <= 16 && kQuads >= 16, "a chunk's LSEs come from one load per lane of a 16-lane group");
  const int group = static_cast<int>(p.heads / p.heads_kv);
  const int64_t piece_stride = p.batch * p.seqlen_q * p.heads * D;  // o_accum [s][b][i][h][d]
  const int64_t lse_piece_stride = p.batch * p.heads * p.seqlen_q;  // lse_accum [s][b][h][i]
  const int items = live_rows * kQuads;
  const int lane16 = threadIdx.x % 16;
  // Every thread walks the same passes (the shuffles below take whole warps); items past the
  // live rows load nothing and write nothing.
  for (int base = threadIdx.x - threadIdx.x % 32; base < items; base += kItems * Traits::kThreads) {
    const float* part[kItems];
    const float* part_lse[kItems];
    bool live[kItems], nan[kItems];
    float4 acc[kItems];
    float run_max[kItems], run_sum[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int item = base + threadIdx.x % 32 + j * Traits::kThreads;
      live[j] = item < items;
      const int row = static_cast<int>(row0) + (live[j] ? item : 0) / kQuads;  // rows < 2^31 (launch)
      const int i = row / group, h = static_cast<int>(h_kv) * group + row % group;
      part[j] = split.o_accum + ((b * p.seqlen_q + i) * p.heads + h) * D + (item % kQuads) * 4;
      part_lse[j] = split.lse_accum + (b * p.heads + h) * p.seqlen_q + i;
      acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      run_max[j] = -INFINITY;
      run_sum[j] = 0.f;
      nan[j] = false;
    }
    for (int s0 = 0; s0 < pieces; s0 += kChunk) {
      // Lane u of each 16-lane group loads its row's LSE of piece s0 + u, and every thread its
      // quads of the chunk's pieces, all before any is used.
      float mine[kItems];
      float4 o[kItems][kChunk];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const bool in = live[j] && lane16 < kChunk && s0 + lane16 < pieces;
        mine[j] = in ? __ldcg(part_lse[j] + (s0 + lane16) * lse_piece_stride) : -INFINITY;
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          o[j][u] = live[j] && s0 + u < pieces
                        ? __ldcg(reinterpret_cast<const float4*>(part[j] + (s0 + u) * piece_stride))
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        float l[kChunk];
        float chunk_max = -INFINITY;
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          l[u] = __shfl_sync(0xffffffffu, mine[j], u, 16);
          nan[j] |= isnan(l[u]);
          chunk_max = fmaxf(chunk_max, l[u]);  // fmaxf passes over NaN
        }
        const float new_max = fmaxf(run_max[j], chunk_max);
        if (new_max == -INFINITY) continue;  // no piece with keys yet
        const float rescale = expf(run_max[j] - new_max);  // 0 from -inf: acc and sum are 0 then
        acc[j].x *= rescale;
        acc[j].y *= rescale;
        acc[j].z *= rescale;
        acc[j].w *= rescale;
        run_sum[j] *= rescale;
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          // -inf (no key seen) and NaN LSEs weigh 0, and their O is never multiplied in.
          const float w = l[u] > -INFINITY ? expf(l[u] - new_max) : 0.f;
          run_sum[j] += w;
          acc[j].x += w != 0.f ? w * o[j][u].x : 0.f;
          acc[j].y += w != 0.f ? w * o[j][u].y : 0.f;
          acc[j].z += w != 0.f ? w * o[j][u].z : 0.f;
          acc[j].w += w != 0.f ? w * o[j][u].w : 0.f;
        }
        run_max[j] = new_max;
      }
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (!live[j]) continue;
      const int item = base + threadIdx.x % 32 + j * Traits::kThreads;
      const int row = static_cast<int>(row0) + item / kQuads;
      const int i = row / group, h = static_cast<int>(h_kv) * group + row % group;
      write_merged_item<Element>(p, seq, b, i, h, item % kQuads, acc[j], run_max[j], run_sum[j], nan[j]);
    }
  }
}

template <typename Traits>
__device__ __forceinline__ void merge_pieces(const AttentionParams& p, const DecodeSplit& split,
                                             const core::SequenceInfo& seq, int64_t b, int64_t h_kv, int64_t row0,
                                             int64_t rows, int pieces) {
  const int live_rows = static_cast<int>(rows - row0 < Traits::kBlockM ? rows - row0 : Traits::kBlockM);
  // 16 O quads in flight per thread (2 items x 8 pieces or 1 x 16); 4 at head dim 64, where ptxas
  // spilled the 32-row tiles' TMA kernel with 8.
  constexpr int kInFlight = Traits::kHeadDim == 128 ? 16 : 4;
  if (pieces <= kInFlight / 2) {
    merge_items<Traits, 2, kInFlight / 2>(p, split, seq, b, h_kv, row0, pieces, live_rows);
  } else {
    merge_items<Traits, 1, kInFlight>(p, split, seq, b, h_kv, row0, pieces, live_rows);
  }
}

// The merge of a cluster's pieces (DecodeSplit::cluster): each block of the cluster left its piece's
// normalized O and LSE at the same offsets of its own shared memory (o_piece, lse_piece: this
// block's addresses), visible after a cluster barrier. The (live row, four columns) items are dealt
// over every thread of the cluster; each reads the pieces' LSEs and O quads of its item from the
// cluster's blocks and merges them as merge_items does (a -inf LSE weighs 0, a NaN one makes the row
// NaN). The caller keeps its shared memory until every block is done (a second cluster barrier).
constexpr int kMaxClusterPieces = 8;  // the portable cluster size
template <typename Traits>
__device__ __forceinline__ void merge_cluster(const AttentionParams& p, const core::SequenceInfo& seq, int b,
                                              int h_kv, int row0, int live_rows, int pieces, uint32_t o_piece,
                                              uint32_t lse_piece) {
  constexpr int D = Traits::kHeadDim;
  constexpr int kQuads = D / 4;
  const int group = static_cast<int>(p.heads / p.heads_kv);
  const int items = live_rows * kQuads;
  const int stride = pieces * Traits::kThreads;
  for (int item = static_cast<int>(tma::cluster_rank()) * Traits::kThreads + static_cast<int>(threadIdx.x);
       item < items; item += stride) {
    const int r = item / kQuads, quad = item % kQuads;
    // The LSEs first, then the O quads kChunk pieces at a time, each chunk's loads issued together.
    constexpr int kChunk = 4;
    float l[kMaxClusterPieces];
#pragma unroll
    for (int u = 0; u < kMaxClusterPieces; ++u)
      l[u] = u < pieces ? tma::cluster_load(tma::cluster_address(lse_piece + 4 * r, u)) : -INFINITY;
    float max = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int u = 0; u < kMaxClusterPieces; ++u) {
      nan |= isnan(l[u]);
      max = fmaxf(max, l[u]);  // fmaxf passes over NaN
    }
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const uint32_t o_item = o_piece + 4 * (r * D + quad * 4);
#pragma unroll
    for (int u0 = 0; u0 < kMaxClusterPieces; u0 += kChunk) {
      if (u0 >= pieces) break;
      float4 o[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u)
        o[u] = u0 + u < pieces ? tma::cluster_load4(tma::cluster_address(o_item, u0 + u)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        // -inf (no key seen) and NaN LSEs weigh 0, and their O is never multiplied in.
        const float w = l[u0 + u] > -INFINITY ? expf(l[u0 + u] - max) : 0.f;
        if (w != 0.f) {
          sum += w;
          acc.x += w * o[u].x;
          acc.y += w * o[u].y;
          acc.z += w * o[u].z;
          acc.w += w * o[u].w;
        }
      }
    }
    const int row = row0 + r;
    const int i = row / group, h = h_kv * group + row % group;
    write_merged_item<typename Traits::Element>(p, seq, b, i, h, quad, acc, max, sum, nan);
  }
}

template <typename Traits>
__device__ __forceinline__ void attend(const AttentionParams& p, const DecodeSplit& split, const CUtensorMap* k_map,
                                       const CUtensorMap* v_map) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* q_smem = reinterpret_cast<Element*>(smem_raw);
  // [stage][K, V][panel][kBlockN][64]
  const uint32_t kv_pad = Traits::kTma ? (1024 - (mma::shared_address(smem_raw) + Traits::kQBytes) % 1024) % 1024 : 0;
  Element* kv_smem = reinterpret_cast<Element*>(smem_raw + Traits::kQBytes + kv_pad);
  const uint32_t full_bar = mma::shared_address(smem_raw) + Traits::kQBytes + kv_pad + Traits::kKVBytes;  // TMA
  const int tid = threadIdx.x;
  if constexpr (Traits::kTma) {
    // First, so that the tensor maps' fetch overlaps the sequence's lengths and Q: the first box waits
    // for its map (a batch-1 step spent ~0.8 us there when the prefetch came just before the boxes).
    if (tid == 0) {
      tma::prefetch_map(k_map);
      tma::prefetch_map(v_map);
      for (int s = 0; s < Traits::kStages; ++s) tma::barrier_init(full_bar + 8 * s, 1);
      tma::fence_barrier_init();
    }
  }

  // Block -> (row tile, split, sequence and kv head), row tiles fastest so that the blocks
  // reading the same keys run together. Rows, keys and tiles in 32 bits (launch_decode_kernel
  // bounds the grid, a sequence's query rows and its keys below 2^31): a 64-bit division is a
  // subroutine of ~70 dependent instructions, and the first box waits on this arithmetic.
  const int heads_kv = static_cast<int>(p.heads_kv);
  const int group = static_cast<int>(p.heads) / heads_kv;
  const int row_tiles = static_cast<int>((p.seqlen_q * group + kBlockM - 1) / kBlockM);
  int index = static_cast<int>(blockIdx.x);
  const int row_tile = index % row_tiles;
  index /= row_tiles;
  const int split_index = index % split.num_splits;
  index /= split.num_splits;
  const int b = index / heads_kv;
  const int h_kv = index % heads_kv;
  const bool causal = p.is_causal;

  // The TMA kernel is launched with programmatic stream serialization (launch_decode_kernel): all
  // above (parameters, barriers, the maps' prefetch) overlaps the kernel ahead of it in the stream,
  // usually this call's zeroing of the arrival counters; every global read and write comes after.
  if constexpr (Traits::kTma) tma::grid_dependency_wait();
  const core::SequenceInfo seq = core::SequenceInfo::of(p, b);
  const int rows = static_cast<int>(seq.len_q) * group;  // live rows of the sequence
  const int row0 = row_tile * kBlockM;
  if (row0 >= rows) return;  // a row tile past this sequence's queries (varlen): nothing to write
  const int last_row = (row0 + kBlockM < rows ? row0 + kBlockM : rows) - 1;
  // Keys the block's rows see: the last row sees the most under the causal mask.
  const int key_end = static_cast<int>(seq.keys_visible(last_row / group, causal));
  const int key_tiles = static_cast<int>((int64_t{key_end} + kBlockN - 1) / kBlockN);
  // The key tiles are dealt evenly over min(num_splits, key_tiles) pieces (one, empty, when no
  // key is seen): pieces differ by one tile at most, and splits past them hold nothing.
  const int pieces = key_tiles < split.num_splits ? (key_tiles > 0 ? key_tiles : 1) : split.num_splits;
  // A cluster's pieces merge through its shared memory: every block of the cluster takes part in
  // its barriers (those past the pieces with no keys: an empty piece), unless one piece holds every
  // key (the cluster's blocks all see that and skip the merge).
  const bool in_cluster = Traits::kTma && kBlockM == 16 && split.cluster;
  const bool merge_here = split.arrivals != nullptr || in_cluster;
  if (merge_here && split_index >= pieces && (!in_cluster || pieces == 1)) return;  // nothing to read or merge
  // Piece s starts at tile s x key_tiles / pieces; (s + 1) x key_tiles <= 128 x 2^25 fits 32 unsigned bits.
  const auto piece_start = [&](int s) { return static_cast<int>(uint32_t(s) * uint32_t(key_tiles) / uint32_t(pieces)); };
  const int tile_begin = split_index < pieces ? piece_start(split_index) : key_tiles;
  const int tile_end = split_index < pieces ? piece_start(split_index + 1) : key_tiles;
  const int n_tiles = tile_end - tile_begin;
  // A block that holds every key of its rows writes out directly; otherwise a piece.
  const bool write_out = split.num_splits == 1 || (merge_here && pieces == 1);
  // Keys from which some row of the block needs a mask (the first row sees the fewest).
  const int mask_from = static_cast<int>(seq.keys_visible(row0 / group, causal));

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int warp_m = warp % Traits::kWarpsM;
  const int warp_n = warp / Traits::kWarpsM;
  const int g = lane / 4;
  const int t = lane % 4;

  // ---- Q: the block's rows (query position i, head h_kv * group + j) into shared memory ----
  {
    const Element* q = static_cast<const Element*>(p.q);
    const int chunk = tid % Traits::kChunksPerRow;
#pragma unroll
    for (int pass = 0; pass < kBlockM / Traits::kRowsPerCopyPass; ++pass) {
      const int r = pass * Traits::kRowsPerCopyPass + tid / Traits::kChunksPerRow;
      const int row = row0 + r;
      const bool valid = row < rows;
      const int64_t off = valid ? seq.q_offset(p, b, row / group, h_kv * group + row % group) : 0;
      mma::copy_async_16B(mma::shared_address(q_smem + tile_offset<Traits>(r, chunk)),
                          q + off + chunk * Traits::kChunk, valid);
    }
    mma::commit_copies();
  }

  // ---- K/V tile producer: keys [j0, j0 + kBlockN) into stage `stage`, zeros past key_end ----
  const core::KVAddress kv = core::KVAddress::of(p, seq, b, h_kv);
  const Element* k_gmem = static_cast<const Element*>(p.k);
  const Element* v_gmem = static_cast<const Element*>(p.v);
  const auto load_tile = [&](int64_t tile, int stage) {
    const int64_t j0 = tile * kBlockN;
    Element* k_tile = kv_smem + stage * 2 * (kBlockN * D);
    Element* v_tile = k_tile + kBlockN * D;
    if constexpr (Traits::kTma) {  // thread 0 only: rows past the cache's extent arrive as zeros
      const uint32_t bar = full_bar + 8 * stage;
      tma::arrive_expect_tx(bar, 2 * Traits::kTileBytes);
      // Dense: one box of kBlockN rows per panel at (key j0, sequence b). Paged (power-of-two pages
      // of >= 16 keys, decode_tma_takes): boxes of min(page_size, kBlockN) rows, each inside one
      // page, at core::KVAddress::page_coordinates. A box wholly past key_end reads page 0 (its K
      // rows are masked, its V rows zeroed below). The page ids are all read before the first box
      // goes out, so that their loads overlap.
      constexpr int kMaxBoxes = kBlockN / 16;
      const int box_rows = decode_tma_box_rows(kv.table_row != nullptr, kv.page_size, kBlockN);
      int rows[kMaxBoxes], outer[kMaxBoxes];
#pragma unroll
      for (int i = 0; i < kMaxBoxes; ++i) {
        const int64_t j = j0 + int64_t{i} * box_rows;
        rows[i] = static_cast<int>(j);
        outer[i] = b;
        if (kv.table_row != nullptr && i * box_rows < kBlockN) {
          int64_t page = 0;
          rows[i] = 0;
          if (j < key_end) {
            const core::KVAddress::PageCoordinates at = kv.page_coordinates(j);
            page = at.page;
            rows[i] = at.row;
          }
          outer[i] = static_cast<int>(page);
        }
      }
#pragma unroll
      for (int i = 0; i < kMaxBoxes; ++i) {
        if (i * box_rows >= kBlockN) break;
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
          const int at = (panel * kBlockN + i * box_rows) * Traits::kPanelCols;
          tma::load_4d(mma::shared_address(k_tile + at), k_map, bar, panel * Traits::kPanelCols, rows[i], h_kv,
                       outer[i]);
          tma::load_4d(mma::shared_address(v_tile + at), v_map, bar, panel * Traits::kPanelCols, rows[i], h_kv,
                       outer[i]);
        }
      }
      return;
    }
    const int chunk = tid % Traits::kChunksPerRow;
#pragma unroll
    for (int pass = 0; pass < kBlockN / Traits::kRowsPerCopyPass; ++pass) {
      const int r = pass * Traits::kRowsPerCopyPass + tid / Traits::kChunksPerRow;
      const int64_t j = j0 + r;
      int64_t k_off = 0, v_off = 0;
      bool valid = j < key_end;
      if (valid) valid = kv.locate(j, k_off, v_off);
      if (!valid) k_off = v_off = 0;
      const int at = kv_offset<Traits>(r, chunk);
      copy_row_chunk(mma::shared_address(k_tile + at), k_gmem + k_off + chunk * Traits::kChunk, valid);
      copy_row_chunk(mma::shared_address(v_tile + at), v_gmem + v_off + chunk * Traits::kChunk, valid);
    }
  };

  if constexpr (Traits::kTma) {
    if (tid == 0) {
      for (int s = 0; s < Traits::kStages - 1 && s < n_tiles; ++s) load_tile(tile_begin + s, s);
    }
    mma::wait_copies<0>();  // Q
  } else {
#pragma unroll
    for (int s = 0; s < Traits::kStages - 1; ++s) {
      if (s < n_tiles) load_tile(tile_begin + s, s);
      mma::commit_copies();
    }
  }

  // ---- per-row state: this thread holds rows g and g + 8 of its warp's 16 ----
  const int warp_row = warp_m * 16;
  int64_t row_keys[2];  // keys each of the two rows sees
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + warp_row + g + 8 * half;
    row_keys[half] = row < rows ? seq.keys_visible(row / group, causal) : key_end;
  }
  const float scale_log2 = static_cast<float>(p.softmax_scale) * kLog2e;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this thread's part of the row sums
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;


  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % Traits::kStages;
    const Element* k_tile = kv_smem + stage * 2 * (kBlockN * D);
    const Element* v_tile = k_tile + kBlockN * D;
    if constexpr (Traits::kTma) {
      // Every warp is done with the stage of tile it - 1 (and, at it = 0, the barriers are set up and
      // Q has landed): tile it + kStages - 1 goes there before the wait for tile it, so that kStages
      // tiles are in flight during the wait.
      __syncthreads();
      const int next = it + Traits::kStages - 1;
      if (tid == 0 && next < n_tiles) load_tile(tile_begin + next, next % Traits::kStages);
      tma::wait(full_bar + 8 * stage, (it / Traits::kStages) & 1);
      // V rows past the keys the block sees, inside the cache (its unused slots may hold anything,
      // and P = 0 times a NaN is NaN): zeros, before any warp reads the tile.
      const int64_t j_first = (tile_begin + it) * kBlockN;
      if (j_first + kBlockN > key_end) {
        const int first_row = static_cast<int>(key_end - j_first);
        Element* v_zero = kv_smem + stage * 2 * (kBlockN * D) + kBlockN * D;
        for (int c = tid; c < (kBlockN - first_row) * Traits::kChunksPerRow; c += Traits::kThreads) {
          const int r = first_row + c / Traits::kChunksPerRow;
          Element* at = v_zero + kv_offset<Traits>(r, c % Traits::kChunksPerRow);
          *reinterpret_cast<uint4*>(at) = make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
      }
    } else {
      mma::wait_copies<Traits::kStages - 2>();
      __syncthreads();
      // The stage consumed in the previous iteration is free for tile it + kStages - 1.
      const int next = it + Traits::kStages - 1;
      if (next < n_tiles) load_tile(tile_begin + next, next % Traits::kStages);
      mma::commit_copies();
    }
    const int key0 = warp_n * Traits::kWarpKeys;  // the warp's keys within the tile

    // S = Q K^T over the warp's keys.
    float s[Traits::kWarpKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < Traits::kWarpKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    // Q's A fragments come from shared memory each tile (ldmatrix is cheap here; registers
    // held across the loop would not be).
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t q_frag[4];
      mma::load_matrix_x4(q_frag, mma::shared_address(q_smem + tile_offset<Traits>(warp_row + (lane & 15),
                                                                                    2 * ks + (lane >> 4))));
#pragma unroll
      for (int np = 0; np < Traits::kWarpKeys / 16; ++np) {
        uint32_t kf[4];
        const int key = key0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = 2 * ks + ((lane >> 3) & 1);
        mma::load_matrix_x4(kf, mma::shared_address(k_tile + kv_offset<Traits>(key, chunk)));
        mma::mma_16x8x16<Element>(s[2 * np], q_frag, kf[0], kf[1]);
        mma::mma_16x8x16<Element>(s[2 * np + 1], q_frag, kf[2], kf[3]);
      }
    }

    // Mask keys past what each row sees (the sequence end, the causal diagonal), as offsets from
    // the warp's first key j0: key j0 + c is masked for a row iff c >= that row's keys - j0
    // (clamped to [0, kWarpKeys], which keeps every comparison), in 32 bits per score.
    const int64_t j0 = (tile_begin + it) * kBlockN + key0;
    if (j0 + Traits::kWarpKeys > mask_from) {
      int limit[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t seen = row_keys[half] - j0;
        limit[half] = seen < 0 ? 0 : (seen > Traits::kWarpKeys ? Traits::kWarpKeys : static_cast<int>(seen));
      }
#pragma unroll
      for (int nt = 0; nt < Traits::kWarpKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (nt * 8 + 2 * t + (e & 1) >= limit[e >> 1]) s[nt][e] = -INFINITY;
        }
      }
    }

    // Online softmax in log2 units of the scaled scores.
    float scale_o[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = row_max[half];
#pragma unroll
      for (int nt = 0; nt < Traits::kWarpKeys / 8; ++nt)
        m = fmaxf(m, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]) * scale_log2);
      m = mma::quad_max(m);
      // A row that has seen only -inf keeps m = -inf; subtract 0 then, so exp2 gives 0, not NaN.
      const float m_use = m == -INFINITY ? 0.f : m;
      scale_o[half] = mma::exp2(row_max[half] - m_use);
      row_max[half] = m;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < Traits::kWarpKeys / 8; ++nt) {
        s[nt][2 * half] = mma::exp2(fmaf(s[nt][2 * half], scale_log2, -m_use));
        s[nt][2 * half + 1] = mma::exp2(fmaf(s[nt][2 * half + 1], scale_log2, -m_use));
        sum += s[nt][2 * half] + s[nt][2 * half + 1];
      }
      row_sum[half] = row_sum[half] * scale_o[half] + sum;
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= scale_o[0];
      o[dt][1] *= scale_o[0];
      o[dt][2] *= scale_o[1];
      o[dt][3] *= scale_o[1];
    }

    // O += P V: P's accumulators are the A operand of each k16 key slice.
#pragma unroll
    for (int ks = 0; ks < Traits::kWarpKeys / 16; ++ks) {
      const uint32_t a[4] = {pack_pair<Element>(s[2 * ks][0], s[2 * ks][1]),
                             pack_pair<Element>(s[2 * ks][2], s[2 * ks][3]),
                             pack_pair<Element>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                             pack_pair<Element>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        const int key = key0 + ks * 16 + (lane & 15);
        const int chunk = 2 * dp + (lane >> 4);
        mma::load_matrix_x4_trans(vf, mma::shared_address(v_tile + kv_offset<Traits>(key, chunk)));
        mma::mma_16x8x16<Element>(o[2 * dp], a, vf[0], vf[1]);
        mma::mma_16x8x16<Element>(o[2 * dp + 1], a, vf[2], vf[3]);
      }
    }
  }
  mma::wait_copies<0>();
  __syncthreads();  // every warp is done with the stages: the epilogue reuses them
  if constexpr (Traits::kTma) {
    // Done with the barriers (invalidated before their memory could serve anything else).
    if (tid == 0) {
      for (int s = 0; s < Traits::kStages; ++s) tma::barrier_inval(full_bar + 8 * s);
    }
  }

  // ---- Epilogue: merge the warps of a row (kWarpsN of them), normalize, write ----
  float* o_smem = reinterpret_cast<float*>(smem_raw + Traits::kQBytes);  // [kWarpsN][kBlockM][kOStride]
  float* m_smem = o_smem + Traits::kWarpsN * kBlockM * Traits::kOStride;  // [kWarpsN][kBlockM]
  float* l_smem = m_smem + Traits::kWarpsN * kBlockM;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] = mma::quad_sum(row_sum[half]);
    if (t == 0) {
      const int r = warp_row + g + 8 * half;
      m_smem[warp_n * kBlockM + r] = row_max[half];
      l_smem[warp_n * kBlockM + r] = row_sum[half];
    }
  }
  __syncthreads();
  // Each warp scales its O by exp2(m_w - m) / l, with m and l the row's merged max and sum. A
  // row that saw no key has l = 0 and O = 0 (LSE -inf below); a NaN l makes O NaN.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp_row + g + 8 * half;
    const MergedRow merged = merge_warps<Traits>(m_smem, l_smem, r);
    const float mine = merged.l == 0.f ? 0.f : mma::exp2(row_max[half] - merged.m_use()) / merged.l;
    float* o_row = o_smem + (warp_n * kBlockM + r) * Traits::kOStride;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<float2*>(o_row + dt * 8 + 2 * t) = make_float2(o[dt][2 * half] * mine, o[dt][2 * half + 1] * mine);
  }
  __syncthreads();

  // 8 columns per thread per pass: one 16 B store of the output, or two of the fp32 piece.
  constexpr int kColGroups = D / 8;
  float* piece_o = reinterpret_cast<float*>(smem_raw + Traits::kQBytes + Traits::kEpilogueBytes);
  float* piece_lse = piece_o + kBlockM * D;
  for (int idx = tid; idx < kBlockM * kColGroups; idx += Traits::kThreads) {
    const int r = idx / kColGroups;
    const int c = (idx % kColGroups) * 8;
    const int row = row0 + r;
    if (row >= rows) continue;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
#pragma unroll
    for (int w = 0; w < Traits::kWarpsN; ++w) {
      const float* src = o_smem + (w * kBlockM + r) * Traits::kOStride + c;
      const float4 x = *reinterpret_cast<const float4*>(src);
      const float4 y = *reinterpret_cast<const float4*>(src + 4);
      acc[0] += x.x, acc[1] += x.y, acc[2] += x.z, acc[3] += x.w;
      acc[4] += y.x, acc[5] += y.y, acc[6] += y.z, acc[7] += y.w;
    }
    const int i = row / group;
    const int h = h_kv * group + row % group;
    if (!write_out && in_cluster) {
      float* dst = piece_o + r * D + c;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else if (!write_out) {
      float* dst = split.o_accum + (((split_index * p.batch + b) * p.seqlen_q + i) * p.heads + h) * D + c;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      Element* dst = static_cast<Element*>(p.out) + seq.o_offset(p, b, i, h) + c;
      *reinterpret_cast<uint4*>(dst) = make_uint4(pack_pair<Element>(acc[0], acc[1]), pack_pair<Element>(acc[2], acc[3]),
                                                  pack_pair<Element>(acc[4], acc[5]), pack_pair<Element>(acc[6], acc[7]));
    }
  }
  // LSE of each row: the merged max and sum, recomputed by one thread per row.
  for (int r = tid; r < kBlockM; r += Traits::kThreads) {
    const int row = row0 + r;
    if (row >= rows) continue;
    const float row_lse = merge_warps<Traits>(m_smem, l_smem, r).lse();
    const int i = row / group;
    const int h = h_kv * group + row % group;
    if (!write_out && in_cluster) {
      piece_lse[r] = row_lse;
    } else if (!write_out) {
      split.lse_accum[((split_index * p.batch + b) * p.heads + h) * p.seqlen_q + i] = row_lse;
    } else if (p.lse != nullptr) {
      p.lse[seq.lse_offset(p, b, i, h)] = row_lse;
    }
  }
  if (write_out || !merge_here) return;
  if constexpr (Traits::kTma && kBlockM == 16) {
    if (in_cluster) {
      tma::cluster_sync();  // every piece is in its block's shared memory
      merge_cluster<Traits>(p, seq, b, h_kv, row0, rows - row0 < kBlockM ? rows - row0 : kBlockM, split.num_splits,
                            mma::shared_address(piece_o), mma::shared_address(piece_lse));
      tma::cluster_sync();  // no block leaves while another may read its piece
      return;
    }
  }

  // ---- Arrival: the last piece of this row tile to finish merges them all ----
  // The block's piece stores are ordered before thread 0's fence by the barrier, and the fence
  // before its count (release); the thread that sees the last count fences again (acquire) before
  // the barrier that starts the merge: the pattern of cooperative groups' grid barrier.
  __syncthreads();
  bool last = false;
  if (tid == 0) {
    int* arrived = split.arrivals + (b * p.heads_kv + h_kv) * row_tiles + row_tile;
    __threadfence();
    last = atomicAdd(arrived, 1) == pieces - 1;
    if (last) __threadfence();
  }
  if (!__syncthreads_or(last)) return;
  merge_pieces<Traits>(p, split, seq, b, h_kv, row0, rows, pieces);
}

}  // namespace decode

/// \brief The decode kernel; a 1-D grid of row tiles x splits x batch x kv heads.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads) decode_kernel(const __grid_constant__ AttentionParams p,
                                                                  const DecodeSplit split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and bf16 mma need sm_80; decode_can_implement refuses older devices
#else
  decode::attend<Traits>(p, split, nullptr, nullptr);
#endif
}

/// \brief The decode kernel with K/V tiles by TMA (Traits::kTma; sm_90, decode_tma_takes).
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    decode_tma_kernel(const __grid_constant__ AttentionParams p, const DecodeSplit split,
                      const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // TMA needs sm_90
#else
  decode::attend<Traits>(p, split, &k_map, &v_map);
#endif
}

/// \brief What a miss of the TMA variant's K/V boxes brings into L2 on device_id
/// (src/cuda/decode_launch.cu).
tma::L2Promotion decode_l2_promotion(int device_id);

/// \brief Zeroes the n arrival counters of a split decode call on `stream` (src/cuda/decode_arrivals.cu):
/// a kernel, not a memset, so that the decode kernel behind it in the stream may start its setup
/// while it runs (programmatic dependent launch).
Status zero_decode_arrivals(int* counters, int64_t n, cudaStream_t stream);

/// \brief Launches the decode kernel on `stream` (params.device_id current). With
/// split.num_splits > 1 the pieces go to split's workspace, merged by the kernel with
/// split.arrivals, else by the caller.
template <typename Element, int kHeadDim, int kBlockM, bool kTma = false>
Status launch_decode_kernel(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  using Traits = DecodeTraits<Element, kHeadDim, kBlockM, kTma>;
  const int64_t row_tiles = (p.seqlen_q * (p.heads / p.heads_kv) + kBlockM - 1) / kBlockM;
  const int64_t blocks = row_tiles * split.num_splits * p.batch * p.heads_kv;
  if (blocks > INT32_MAX)
    return Status::NotSupported("backend 'decode' runs up to 2147483647 blocks (query row tiles x splits x batch x "
                                "heads_kv); got " + std::to_string(blocks));
  // The kernel counts a sequence's rows (queries x group) and keys in 32 bits.
  if (p.seqlen_q * (p.heads / p.heads_kv) > INT32_MAX - kBlockM || p.seqlen_k > INT32_MAX - Traits::kBlockN)
    return Status::NotSupported("backend 'decode' takes up to 2^31 query rows (seqlen_q x heads / heads_kv) and "
                                "keys per sequence; got " + std::to_string(p.seqlen_q * (p.heads / p.heads_kv)) +
                                " and " + std::to_string(p.seqlen_k));
  if constexpr (kTma) {
    CUtensorMap k_map{}, v_map{};
    if (!tma::encode_kv_maps(p, decode_tma_box_rows(p.is_paged(), p.page_size, Traits::kBlockN), &k_map, &v_map,
                             decode_l2_promotion(p.device_id)))
      return Status::NotSupported("TMA cannot describe k or v (strides must be positive multiples of 16 bytes)");
    const auto kernel = decode_tma_kernel<Traits>;
    const int smem = Traits::kSmemBytes + split.extra_smem;
    WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // Programmatic stream serialization: the kernel's setup overlaps the tail of the kernel ahead
    // of it (it waits for that kernel before touching global memory: tma::grid_dependency_wait).
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(Traits::kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[2] = {};
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    if (split.cluster) {
      // The pieces of a (sequence, kv head) are consecutive blocks (one row tile, the splits next):
      // one cluster each.
      if (row_tiles != 1 || split.num_splits < 2 || split.num_splits > decode::kMaxClusterPieces)
        return Status::NotSupported("a decode cluster holds the 2-8 pieces of one row tile");
      attribute[1].id = cudaLaunchAttributeClusterDimension;
      attribute[1].val.clusterDim.x = static_cast<unsigned>(split.num_splits);
      attribute[1].val.clusterDim.y = 1;
      attribute[1].val.clusterDim.z = 1;
      config.numAttrs = 2;
    }
    return cuda_status(cudaLaunchKernelEx(&config, kernel, p, split, k_map, v_map), "decode_tma_kernel launch");
  } else {
    const auto kernel = decode_kernel<Traits>;
    WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
    kernel<<<static_cast<unsigned>(blocks), Traits::kThreads, Traits::kSmemBytes, stream>>>(p, split);
    return cuda_status(cudaGetLastError(), "decode_kernel launch");
  }
}

// Query rows of one block for these params: the query rows of a kv head (seqlen_q x heads /
// heads_kv) in one tile of 16 or 32 rows when they fit, else in 64-row tiles (rows of a 64-row tile
// past the last live one still cost the warps that own them, so a group of 17-32 rows, e.g. MQA
// with 32 heads, takes the 32-row tile); and shared memory per block.
inline int64_t decode_block_m(const AttentionParams& p) {
  const int64_t rows = p.seqlen_q * (p.heads / p.heads_kv);
  return rows <= 16 ? 16 : (rows <= 32 ? 32 : 64);
}
template <int kHeadDim>
inline int decode_smem_bytes_for(int64_t block_m) {
  if (block_m == 16) return DecodeTraits<__half, kHeadDim, 16>::kSmemBytes;
  if (block_m == 32) return DecodeTraits<__half, kHeadDim, 32>::kSmemBytes;
  return DecodeTraits<__half, kHeadDim, 64>::kSmemBytes;
}
inline int decode_smem_bytes(const AttentionParams& p) {
  return p.head_dim == 64 ? decode_smem_bytes_for<64>(decode_block_m(p)) : decode_smem_bytes_for<128>(decode_block_m(p));
}

/// \brief The decode kernel for one dtype and head dim, on tiles of decode_block_m(p) rows.
template <typename Element, int kHeadDim>
Status launch_decode(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  const int64_t block_m = decode_block_m(p);
  if (block_m == 16) return launch_decode_kernel<Element, kHeadDim, 16>(p, split, stream);
  if (block_m == 32) return launch_decode_kernel<Element, kHeadDim, 32>(p, split, stream);
  return launch_decode_kernel<Element, kHeadDim, 64>(p, split, stream);
}
inline int64_t decode_block_n(int64_t head_dim) {
  return head_dim == 64 ? DecodeTraits<__half, 64, 16>::kBlockN : DecodeTraits<__half, 128, 16>::kBlockN;
}
/// \brief Whether each of the TMA variant's K/V boxes for p is a whole key tile (a dense cache, or
/// pages of at least a tile) rather than a page of fewer keys (decode_tma_box_rows).
inline bool decode_tma_tile_boxes(const AttentionParams& p) {
  const int block_n = static_cast<int>(decode_block_n(p.head_dim));
  return decode_tma_box_rows(p.is_paged(), p.page_size, block_n) == block_n;
}
/// \brief Whether the TMA decode kernel takes p's layout: a cache with keys, dense (not packed by
/// cu_seqlens_k) or paged in power-of-two pages of at least 16 keys (a box of 16 rows keeps the 1 KB
/// swizzle atom). Tiles of 16 and 32 rows on either; 64-row tiles, which with the stages' alignment
/// slack take one block per SM (decode_tma_blocks_per_sm), only where each box is a whole key tile
/// (dense, or pages of at least a tile): a box per smaller page wants the two blocks per SM that the
/// cp.async kernel keeps there. Whether TMA can describe K and V (extents under 2^31, so key rows
/// and page ids fit the maps' int coordinates) is checked apart (tma::kv_maps_fit,
/// tma::encode_kv_maps).
inline bool decode_tma_takes(const AttentionParams& p) {
  const bool layout = p.is_paged() ? p.page_size >= 16 && (p.page_size & (p.page_size - 1)) == 0 : !p.is_varlen_k();
  return layout && p.seqlen_k > 0 && (decode_block_m(p) <= 32 || decode_tma_tile_boxes(p));
}
/// \brief Query rows per tile of the TMA variant (where decode_tma_takes(p)): decode_block_m's 16, 32 or
/// 64, and 128 in place of 64 past 128 rows per kv head (eight warps), so that each 128 rows read the
/// keys once, not twice. At exactly 128 rows (four queries at 32 heads per kv head) two 64-row tiles
/// stay: one 128-row tile there ran the decode kernel no faster and left twice the pieces to combine.
inline int64_t decode_tma_block_m(const AttentionParams& p) {
  const int64_t block_m = decode_block_m(p);
  return block_m == 64 && p.seqlen_q * (p.heads / p.heads_kv) > 128 ? 128 : block_m;
}
/// \brief Blocks of the TMA decode kernel that fit one SM's 228 KB of shared memory at most, by
/// tile height: two of 16 and 32 rows, one of 64 (16 KB of Q, 96 KB of K/V stages and the 1 KB
/// alignment slack, twice, pass the SM's limit with the 1 KB each block reserves) and of 128.
inline int decode_tma_blocks_per_sm(const AttentionParams& p) { return decode_tma_block_m(p) >= 64 ? 1 : 2; }

/// \brief The decode kernel with K/V tiles by TMA (sm_90); NotSupported, nothing launched, where
/// decode_tma_takes(p) is false or TMA cannot describe K or V (the caller then runs launch_decode).
template <typename Element, int kHeadDim>
Status launch_decode_tma(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  if (!decode_tma_takes(p))
    return Status::NotSupported("the TMA decode kernel reads dense caches and caches in power-of-two pages of >= 16 "
                                "keys");
  const int64_t block_m = decode_tma_block_m(p);
  if (block_m == 16) return launch_decode_kernel<Element, kHeadDim, 16, true>(p, split, stream);
  if (block_m == 32) return launch_decode_kernel<Element, kHeadDim, 32, true>(p, split, stream);
  if (block_m == 64) return launch_decode_kernel<Element, kHeadDim, 64, true>(p, split, stream);
  return launch_decode_kernel<Element, kHeadDim, 128, true>(p, split, stream);
}

}  // namespace waveboost::cuda
