// Tensor-core flash attention backward on raw mma.sync + ldmatrix (backend "mma").
//
// FlashAttention-2's backward algorithm. With c = softmax_scale, s = c q.k, P = exp(s - lse)
// and D_i = rowsum(dO_i * O_i) - dlse_i:
//
//   preprocess   D and lse * log2(e) per query row (fp32 workspace; padded rows: D = 0 and
//                +inf, which sends P to 0), and a zeroed fp32 dQ accumulator
//   main         one block per (key block of kBlockN keys, batch, kv head); K and V stay in
//                shared memory, dK and dV in registers, while the query blocks of every query
//                head of the kv head's group stream by (Q, dO, lse, D double-buffered, cp.async):
//                  S   = Q K^T, dP = dO V^T      each warp a slab of query rows x 32 keys
//                  P   = exp2(c log2(e) S - lse log2(e))
//                  dS  = P * (dP - D)            (the gradient of the scaled score; dlse is in D)
//                                                P and dS to shared memory as [query][key] tiles
//                  dV += P^T dO                  each warp 32 keys x half the dims; P^T read back
//                                                by ldmatrix .trans
//                  dQ += dS K                    each warp 32 query rows x a slab of dims; each
//                                                lane's column pairs reduced into the accumulator
//                                                (red.global.add.v2.f32 on sm_90), or,
//                                                deterministic, 16 B plain adds by one key block at
//                                                a time in a fixed key-block order (a per-(head,
//                                                query block) semaphore)
//                  dK += dS^T Q                  as dV (c applied at the end); dQ's reductions
//                                                drain under these products
//   convert      dq = c * dQ accumulator, in the element type
//
// The fragment layouts are those of mma_primitives.cuh. Tiles in shared memory have their 16 B
// chunks XOR-swizzled by row (chunk ^ (row % 8)), so that eight rows of one ldmatrix (plain or
// .trans) hit eight distinct bank groups. Operands read "transposed" (dO, Q and K as the B
// operand with k along rows, P^T and dS^T as the A operands of dV and dK) use ldmatrix .trans.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/backward.cuh"
#include "waveboost/cuda/core/fragments.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

// The smallest key block of the mma backwards at a head dim (16-bit: 128; fp32: 64 at head dim 64,
// 128 at 128), 0 if unsupported: the host's grid and semaphore checks count blocks of it, which
// bounds every form's count. Each form's traits assert that their key block is not smaller.
inline constexpr int64_t flash_bwd_mma_block_n(int64_t head_dim) {
  return head_dim == 64 ? 64 : head_dim == 128 ? 128 : 0;
}

/// \brief Compile-time choices of the mma.sync backward (FlashAttention-2's warp layout): 128 keys per
/// block and 8 warps; 64 query rows per step at head dim 128, 128 at head dim 64. S and dP are split
/// 2 x 4 over the warps (kScoreRows query rows x 32 keys each), dK and dV 4 x 2 (32 keys x kHeadDim / 2
/// dims), dQ kDqWarpsM x kDqWarpsD (32 query rows x kDqDims dims); P and dS meet the dV, dK and dQ
/// products in shared memory ([query][key] tiles). Per warp and step that is 144 ldmatrix.x4 for 320
/// mma at head dim 128 (64 rows) and 144 per 128 rows at head dim 64; a layout of 16 keys per warp
/// with P^T kept in registers as dV's A operand took 184 per 64 rows at head dim 128, and ran
/// 1.08-1.19x slower on an H100 (benchmarks/NOTES.md). kBlockM_ 64 at head dim 64 is the form for
/// devices with less shared memory per block (97 KiB against 162 KiB: sm_86, sm_89, sm_120).
template <int kHeadDim>
inline constexpr int kFlashBwdMmaBlockM = kHeadDim == 64 ? 128 : 64;

template <typename Element_, int kHeadDim_, int kBlockM_ = kFlashBwdMmaBlockM<kHeadDim_>>
struct FlashBwdMmaTraits : BackwardSmemLayout<128, kBlockM_, kHeadDim_, 2> {
  using Element = Element_;
  using Layout = BackwardSmemLayout<128, kBlockM_, kHeadDim_, 2>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 128;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kScoreRows = kBlockM / 2;  // S / dP rows per warp
  static constexpr int kScoreTiles = kScoreRows / 16;
  static constexpr int kKvDims = kHeadDim / 2;  // dK / dV dims per warp
  static constexpr int kKvDimTiles = kKvDims / 8;
  static constexpr int kDqWarpsM = kBlockM / 32;  // dQ: warps along the rows (32 each) and the dims
  static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqDims = kHeadDim / kDqWarpsD;
  static constexpr int kDqDimTiles = kDqDims / 8;
  // P ([query][key], 16-bit) after the layout's tiles and vectors; dS lies in the layout's dS tile.
  static constexpr int kPOffset = (Layout::kLayoutBytes + 127) / 128 * 128;
  static constexpr int kSmemBytes = kPOffset + Layout::kDsTileBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kBlockN >= flash_bwd_mma_block_n(kHeadDim), "the host's grid check (flash_bwd_mma_block_n)");
  static_assert(kKvDimTiles % 2 == 0 && kDqDimTiles % 2 == 0, "n8 tiles in pairs (ldmatrix.x4)");
  static_assert(Layout::kDsOffset % 128 == 0 && Layout::kQOffset % 128 == 0 && Layout::kDoOffset % 128 == 0 &&
                Layout::kVOffset % 128 == 0 && Layout::kQTileBytes % 128 == 0, "128 B-aligned tiles");
};

namespace flash_bwd {

// Byte address of 16 B chunk `chunk` of row `row` in a swizzled tile with kWidth-element rows.
template <int kWidth>
__device__ __forceinline__ uint32_t swizzled(uint32_t tile, int row, int chunk) {
  return tile + static_cast<uint32_t>(2 * (row * kWidth + ((chunk ^ (row % 8)) * 8)));
}

// Per-lane ldmatrix addressing in a swizzled kWidth-wide tile. An x4 load covers 16 rows x 2
// chunks; the lane addresses row `row0 + row` (row0 a multiple of 8) and chunk `2 * pair + high`.
// Its physical chunk is 8 (pair / 4) + ((2 (pair % 4)) ^ y) with y = high ^ (row % 8), so with
// 128 B-aligned rows one register per operand (tile + row + 16 y) serves every load: XOR in
// 32 (pair % 4), add 128 (pair / 4) and the row0 rows (bits 0..6 of the sum are untouched).
template <int kWidth>
struct LaneAddress {
  uint32_t base;
  __device__ __forceinline__ static LaneAddress make(uint32_t tile, int row, int high) {
    return {tile + static_cast<uint32_t>(row * kWidth * 2 + ((high ^ (row % 8)) * 16))};
  }
  __device__ __forceinline__ uint32_t at(int row0, int pair) const {
    return (base ^ static_cast<uint32_t>(32 * (pair % 4))) + static_cast<uint32_t>((pair / 4) * 128 + row0 * kWidth * 2);
  }
  // The addressing of the sub-tile from row row0 and pair pair0: its at(r, j) is at(row0 + r, pair0 + j)
  // here, for j below a power of 2 that divides pair0 (the XORs and the carries then stay apart), so a
  // warp's own rows and pairs cost one add per operand instead of one per load.
  __device__ __forceinline__ LaneAddress from(int row0, int pair0, uint32_t offset = 0) const {
    return {at(row0, pair0) + offset};
  }
};

// cp.async of rows [0, kRows) of a kWidth-wide tile; rows >= valid_rows are zero-filled. Thread x
// copies chunk x % kChunks of rows x / kChunks + i kRowsPerPass: one global address and one swizzled
// shared address per thread (kRowsPerPass is a multiple of the swizzle's 8 rows), the passes a
// stride and an immediate away; tiles that the sequence fills skip the row checks.
template <int kRows, int kWidth, int kThreads, typename Element>
__device__ __forceinline__ void load_rows(uint32_t tile, const Element* src, int64_t row_stride, int64_t valid_rows) {
  constexpr int kChunks = kWidth / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0);
  const int row0 = static_cast<int>(threadIdx.x) / kChunks;
  const int chunk = static_cast<int>(threadIdx.x) % kChunks;
  const Element* from = src + row0 * row_stride + chunk * 8;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  const uint32_t to = swizzled<kWidth>(tile, row0, chunk);
  constexpr uint32_t kPassBytes = kRowsPerPass * kWidth * 2;
  if (valid_rows >= kRows) {
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) mma::copy_async_16B(to + i * kPassBytes, from + i * pass_stride, true);
  } else {
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const bool valid = row0 + i * kRowsPerPass < valid_rows;
      mma::copy_async_16B(to + i * kPassBytes, valid ? from + i * pass_stride : src, valid);
    }
  }
}

/// \brief D = rowsum(dO * O) - dlse and lse * log2(e) per (padded) query row, and a zeroed dQ
/// accumulator row. kLanes threads per row, each with 16 B of O and of dO (the flash backwards
/// take 16 B aligned rows only: kernel_registry's vector_elements), so a warp covers 32 / kLanes
/// rows; the block's 256 threads step through the rows together (every lane reaches the
/// shuffles).
template <typename Element, int kHeadDim>
struct PreprocessShape {
  static constexpr int kThreads = 256;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(Element));  // elements per 16 B
  static constexpr int kLanes = kHeadDim / kVec;                        // threads per row
  static constexpr int kRowsPerBlock = kThreads / kLanes;
  static_assert(kHeadDim % kVec == 0 && kLanes <= 32 && 32 % kLanes == 0, "a row in a power-of-2 part of a warp");
};

template <typename Element, int kHeadDim>
__global__ void preprocess_kernel(const __grid_constant__ AttentionBackwardParams p, FlashBwdWorkspace ws) {
  using Shape = PreprocessShape<Element, kHeadDim>;
  constexpr int kVec = Shape::kVec;
  constexpr int kLanes = Shape::kLanes;
  constexpr int kRowsPerPass = Shape::kRowsPerBlock;
  const int lane = threadIdx.x % kLanes;
  const int64_t num_rows = p.batch * p.heads * ws.m_pad;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerPass; first < num_rows;
       first += static_cast<int64_t>(gridDim.x) * kRowsPerPass) {
    const int64_t row = first + threadIdx.x / kLanes;
    const bool valid = row < num_rows;
    const int64_t i = row % ws.m_pad;
    const int64_t bh = row / ws.m_pad;
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const bool live = valid && i < p.seqlen_q;
    float acc = 0.f;
    if (live) {
      const uint4 o_chunk = *reinterpret_cast<const uint4*>(
          static_cast<const Element*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride +
          lane * kVec);
      const uint4 do_chunk = *reinterpret_cast<const uint4*>(
          static_cast<const Element*>(p.dout) + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride +
          lane * kVec);
      const Element* o = reinterpret_cast<const Element*>(&o_chunk);
      const Element* dout = reinterpret_cast<const Element*>(&do_chunk);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc = fmaf(to_float(dout[e]), to_float(o[e]), acc);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (!valid) continue;
    if (lane == 0) {
      float d_row = 0.f, lse_log2 = INFINITY;
      if (live) {
        const float dlse = p.dlse != nullptr ? p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + i] : 0.f;
        d_row = acc - dlse;
        const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i];
        lse_log2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
      ws.d_rows[row] = d_row;
      ws.lse_log2[row] = lse_log2;
    }
    float4* dq_row = reinterpret_cast<float4*>(ws.dq_accum + row * kHeadDim + lane * kVec);
#pragma unroll
    for (int e = 0; e < kVec / 4; ++e) dq_row[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/// \brief dq[b, i, h, :] = softmax_scale * dQ accumulator, eight elements per thread (16-bit or fp32).
template <typename Element, int kHeadDim>
__global__ void convert_dq_kernel(const __grid_constant__ AttentionBackwardParams p, const float* dq_accum,
                                  int64_t m_pad) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  const int64_t rows = p.batch * p.heads * p.seqlen_q;
  const int64_t total = rows * kChunksPerRow;
  const float scale = static_cast<float>(p.softmax_scale);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(idx % kChunksPerRow);
    const int64_t row = idx / kChunksPerRow;
    const int64_t i = row % p.seqlen_q;
    const int64_t bh = row / p.seqlen_q;
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const float4* src = reinterpret_cast<const float4*>(dq_accum + (bh * m_pad + i) * kHeadDim + chunk * 8);
    const float4 x = src[0], y = src[1];
    Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride;
    if constexpr (std::is_same_v<Element, float>) {
      float4* out = reinterpret_cast<float4*>(dq + chunk * 8);
      out[0] = make_float4(x.x * scale, x.y * scale, x.z * scale, x.w * scale);
      out[1] = make_float4(y.x * scale, y.y * scale, y.z * scale, y.w * scale);
    } else {
      uint4 packed;
      packed.x = pack_pair<Element>(x.x * scale, x.y * scale);
      packed.y = pack_pair<Element>(x.z * scale, x.w * scale);
      packed.z = pack_pair<Element>(y.x * scale, y.y * scale);
      packed.w = pack_pair<Element>(y.z * scale, y.w * scale);
      *reinterpret_cast<uint4*>(dq + chunk * 8) = packed;
    }
  }
}

// The deterministic dQ (core/backward.cuh): thread 0 waits for key block n_block's turn at query
// block m_index, and the block barrier orders every thread's reads of dQ after its acquire.
template <bool kCausal>
__device__ __forceinline__ void wait_for_dq_turn(const int* semaphore, int64_t n_block, int64_t m_index,
                                                 int64_t block_m, int64_t block_n, int64_t causal_offset) {
  if (threadIdx.x == 0) spin_until_turn(semaphore, dq_turn<kCausal>(n_block, m_index, block_m, block_n, causal_offset));
  __syncthreads();
}

// After the block barrier, one release at gpu scope publishes every thread's dQ writes.
__device__ __forceinline__ void pass_turn(int* semaphore) {
  __syncthreads();
  if (threadIdx.x == 0) count_turn(semaphore);
}

// The top of step s (in buffers `buf`) of a block's walk over its steps: issue step s + 1's copies
// into the other buffers (read last in step s - 1, before its final barrier), wait for step s's,
// and meet at a block barrier.
template <typename IssueStep>
__device__ __forceinline__ void begin_step(int64_t s, int64_t steps, int buf, const IssueStep& issue_step) {
  if (s + 1 < steps) {
    issue_step(s + 1, buf ^ 1);
    mma::commit_copies();
    mma::wait_copies<1>();
  } else {
    mma::wait_copies<0>();
  }
  __syncthreads();  // step s's tiles visible to every warp; every warp is done with step s - 1's shared dS
}

// The start of a block's walk: the block's K and V rows by cp.async
// (keys past the sequence zero-filled), and step s's copies into buffers `buf` (Q and dO rows of its
// query block, lse * log2(e) and D), which begin_step issues a step ahead.
template <typename Traits>
__device__ __forceinline__ void load_key_block(const AttentionBackwardParams& p, const BackwardBlock& blk,
                                               uint32_t base) {
  using Element = typename Traits::Element;
  load_rows<Traits::kBlockN, Traits::kHeadDim, Traits::kThreads>(base + Traits::kKOffset, blk.k_rows<Element>(p),
                                                                 p.k_row_stride, p.seqlen_k - blk.n0);
  load_rows<Traits::kBlockN, Traits::kHeadDim, Traits::kThreads>(base + Traits::kVOffset, blk.v_rows<Element>(p),
                                                                 p.v_row_stride, p.seqlen_k - blk.n0);
}

template <typename Traits>
struct StepCopies {
  const AttentionBackwardParams& p;
  const BackwardBlock& blk;
  const FlashBwdWorkspace& ws;
  uint32_t base;

  __device__ __forceinline__ void operator()(int64_t s, int buf) const {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    const int64_t h = blk.head(s);
    const int64_t m0 = blk.m_block(s) * kBlockM;
    load_rows<kBlockM, Traits::kHeadDim, Traits::kThreads>(base + Traits::kQOffset + buf * Traits::kQTileBytes,
                                                           blk.q_rows<Element>(p, h, m0), p.q_row_stride,
                                                           p.seqlen_q - m0);
    load_rows<kBlockM, Traits::kHeadDim, Traits::kThreads>(base + Traits::kDoOffset + buf * Traits::kQTileBytes,
                                                           blk.dout_rows<Element>(p, h, m0), p.do_row_stride,
                                                           p.seqlen_q - m0);
    static_assert(kBlockM / 2 <= Traits::kThreads);
    copy_step_vectors<kBlockM>(ws, blk.workspace_row(p, ws.m_pad, h, m0),
                               base + Traits::kLseOffset + buf * Traits::kVecBytes,
                               base + Traits::kDOffset + buf * Traits::kVecBytes);
  }
};

/// \brief One block: kBlockN keys of one (batch, kv head), the query blocks of every query head of
/// its group streaming by.
template <typename Traits, bool kCausal, bool kDeterministic>
__device__ __forceinline__ void backward_block(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kKvDimTiles = Traits::kKvDimTiles;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = mma::shared_address(smem);
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

  load_key_block<Traits>(p, blk, base);
  const StepCopies<Traits> issue_step{p, blk, ws, base};

  if (steps > 0) issue_step(0, 0);
  mma::commit_copies();

  constexpr int kScoreTiles = Traits::kScoreTiles;
  constexpr int kScoreRows = Traits::kScoreRows;
  // dK and dV: this warp's 32 keys (two m16 tiles) x kKvDims dims (kKvDimTiles n8 tiles).
  float dk[2][kKvDimTiles][4];
  float dv[2][kKvDimTiles][4];
  zero_fill(dk[0]);
  zero_fill(dk[1]);
  zero_fill(dv[0]);
  zero_fill(dv[1]);

  const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  // The warps' tiles: S and dP kScoreRows query rows (sm) x 32 keys (sn); dK and dV 32 keys (kn) x
  // kKvDims dims (kd); dQ 32 query rows (qm) x kDqDims dims (qd).
  const int sm = warp % 2, sn = warp / 2;
  const int kn = warp % 4, kd = warp / 4;
  const int qm = warp % Traits::kDqWarpsM, qd = warp / Traits::kDqWarpsM;

  // Lane addresses (tiles 128 B multiples apart, so one base serves every tile of a width): A from
  // [row][k] rows (Q, dO; dS); B from [n][k] rows (K, V); B with k along the rows (.trans: dO, Q, K);
  // A with k along the rows (.trans: P^T and dS^T from the [query][key] tiles).
  const auto a_dim = LaneAddress<kHeadDim>::make(base, lane % 16, lane / 16);
  const auto b_dim = LaneAddress<kHeadDim>::make(base, lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
  const auto bt_dim = LaneAddress<kHeadDim>::make(base, lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
  const auto a_key = LaneAddress<kBlockN>::make(base, lane % 16, lane / 16);
  const auto at_key = LaneAddress<kBlockN>::make(base, lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
  constexpr uint32_t kDoFromQ = Traits::kDoOffset - Traits::kQOffset;
  // Each warp's share of the tiles, its rows and pairs folded into the lane addresses once: S and dP
  // read K and V rows 32 sn..; dV and dK read P^T and dS^T keys 32 kn.. (pairs 2 kn..) and dO / Q
  // dims (pairs) kKvDimTiles / 2 kd..; dQ reads dS rows 32 qm.. and K^T dims kDqDimTiles / 2 qd...
  const auto kv_rows = b_dim.from(32 * sn, 0);
  const auto key_cols = at_key.from(0, 2 * kn);
  const auto dq_rows_ds = a_key.from(32 * qm, 0, Traits::kDsOffset);
  const auto dq_dims_k = bt_dim.from(0, Traits::kDqDimTiles / 2 * qd, Traits::kKOffset);
  // P and dS stores: lane (g, t) writes rows kScoreRows sm + g + 8 i and 16 B chunks (4 sn + nt) ^ g
  // (rows of kBlockN 16-bit keys, swizzled as `swizzled`); 4 sn and nt < 4 share no bits, so
  // chunk nt of the lane's chunks is its first XOR 16 nt.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // sm_90 stores them by stmatrix instead, 16 rows x 16 keys at a time from a_key's lane addresses:
  // the warp's rows kScoreRows sm.. and key pairs 2 sn...
  const auto ps_lanes = a_key.from(kScoreRows * sm, 2 * sn);
#else
  const uint32_t lane_ps = base + static_cast<uint32_t>((kScoreRows * sm + g) * kBlockN * 2 + ((4 * sn) ^ g) * 16 + 4 * t);
#endif

  for (int64_t s = 0; s < steps; ++s) {
    const int buf = static_cast<int>(s & 1);
    begin_step(s, steps, buf, issue_step);

    const int64_t h = blk.head(s);
    const int64_t m_index = blk.m_block(s);
    const int64_t m0 = m_index * kBlockM;
    const uint32_t q_buf = Traits::kQOffset + buf * Traits::kQTileBytes;
    const auto q_rows = a_dim.from(kScoreRows * sm, 0, q_buf);
    const auto qdo_dims = bt_dim.from(0, kKvDimTiles / 2 * kd, q_buf);

    // S = Q K^T and dP = dO V^T for kScoreRows query rows x 32 keys. Accumulator [mt][nt][e]: query
    // row kScoreRows sm + 16 mt + g + 8 (e / 2), key 32 sn + 8 nt + 2 t + e % 2 (of the block).
    float sc[kScoreTiles][4][4];
    float dp[kScoreTiles][4][4];
#pragma unroll
    for (int mt = 0; mt < kScoreTiles; ++mt) {
      zero_fill(sc[mt]);
      zero_fill(dp[mt]);
    }
#pragma unroll
    for (int ds = 0; ds < kHeadDim / 16; ++ds) {
      uint32_t a[kScoreTiles][4];
#pragma unroll
      for (int mt = 0; mt < kScoreTiles; ++mt) {
        mma::load_matrix_x4(a[mt], q_rows.at(16 * mt, ds));
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        mma::load_matrix_x4(b, kv_rows.at(16 * np, ds) + Traits::kKOffset);
#pragma unroll
        for (int mt = 0; mt < kScoreTiles; ++mt) {
          mma::mma_16x8x16<Element>(sc[mt][2 * np], a[mt], b[0], b[1]);
          mma::mma_16x8x16<Element>(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int ds = 0; ds < kHeadDim / 16; ++ds) {
      uint32_t a[kScoreTiles][4];
#pragma unroll
      for (int mt = 0; mt < kScoreTiles; ++mt) {
        mma::load_matrix_x4(a[mt], q_rows.at(16 * mt, ds) + kDoFromQ);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        mma::load_matrix_x4(b, kv_rows.at(16 * np, ds) + Traits::kVOffset);
#pragma unroll
        for (int mt = 0; mt < kScoreTiles; ++mt) {
          mma::mma_16x8x16<Element>(dp[mt][2 * np], a[mt], b[0], b[1]);
          mma::mma_16x8x16<Element>(dp[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // P, then dS = P (dP - D), both to shared memory as [query][key] 16-bit tiles.
    const float* lse_row = lse_smem + buf * kBlockM;
    const float* d_row = d_smem + buf * kBlockM;
    with_step_mask<true>(backward_tile_masked<kCausal>(p, blk, kBlockN, m0), [&](auto masked) {
#pragma unroll
      for (int mt = 0; mt < kScoreTiles; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = kScoreRows * sm + 16 * mt + g + 8 * (e / 2);
          const float lse = lse_row[row];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int key = 32 * sn + 8 * nt + 2 * t + e % 2;
            sc[mt][nt][e] = backward_probability<kCausal>(sc[mt][nt][e], scale_log2, lse, bool(masked), n0 + key,
                                                          m0 + row, p, causal_offset);
          }
        }
      }
    });
    // The 16-bit pairs of P and dS = P (dP - D): [nt][half] holds rows g + 8 half of the 8-key tile nt.
#pragma unroll
    for (int mt = 0; mt < kScoreTiles; ++mt) {
      const int row = kScoreRows * sm + 16 * mt + g;
      const float d[2] = {d_row[row], d_row[row + 8]};
      uint32_t p_pairs[4][2], ds_pairs[4][2];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float p0 = sc[mt][nt][2 * half], p1 = sc[mt][nt][2 * half + 1];
          p_pairs[nt][half] = pack_pair<Element>(p0, p1);
          ds_pairs[nt][half] = pack_pair<Element>(p0 * (dp[mt][nt][2 * half] - d[half]),
                                                  p1 * (dp[mt][nt][2 * half + 1] - d[half]));
        }
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // sm_90: one stmatrix per 16 rows x 16 keys of each, registers in A-fragment order (nt 2 j rows g
      // and g + 8, then nt 2 j + 1), lanes addressing as ldmatrix's A loads of that tile.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t at = ps_lanes.at(16 * mt, j);
        mma::store_matrix_x4(at + Traits::kPOffset, p_pairs[2 * j][0], p_pairs[2 * j][1], p_pairs[2 * j + 1][0],
                             p_pairs[2 * j + 1][1]);
        mma::store_matrix_x4(at + Traits::kDsOffset, ds_pairs[2 * j][0], ds_pairs[2 * j][1],
                             ds_pairs[2 * j + 1][0], ds_pairs[2 * j + 1][1]);
      }
#else
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const uint32_t at = (lane_ps ^ (16u * nt)) + static_cast<uint32_t>((16 * mt + 8 * half) * kBlockN * 2);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + Traits::kPOffset), "r"(p_pairs[nt][half]) : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + Traits::kDsOffset), "r"(ds_pairs[nt][half]) : "memory");
        }
      }
#endif
    }
    __syncthreads();  // P and dS complete

    // dV += P^T dO, then dQ, then dK += dS^T Q: A from the [query][key] tiles (.trans), B from dO / Q
    // (.trans). dQ's reductions drain while dK's products run (FlashAttention-2's order).
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      uint32_t a_p[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) mma::load_matrix_x4_trans(a_p[mt], key_cols.at(16 * ks, mt) + Traits::kPOffset);
#pragma unroll
      for (int dpair = 0; dpair < kKvDimTiles / 2; ++dpair) {
        uint32_t b_do[4];
        mma::load_matrix_x4_trans(b_do, qdo_dims.at(16 * ks, dpair) + kDoFromQ);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma::mma_16x8x16<Element>(dv[mt][2 * dpair], a_p[mt], b_do[0], b_do[1]);
          mma::mma_16x8x16<Element>(dv[mt][2 * dpair + 1], a_p[mt], b_do[2], b_do[3]);
        }
      }
    }

    // dQ (kBlockM x kHeadDim) += dS K: this warp's 32 query rows x kDqDims dims.
    static_assert(Traits::kDqWarpsM * 32 == kBlockM);
    float* dq_rows = ws.dq_accum + (blk.workspace_row(p, ws.m_pad, h, m0) + 32 * qm) * kHeadDim;
    // This lane's first pair (row g, dims 2 t, 2 t + 1 of the warp's first 8-dim tile): every other
    // pair lies a compile-time offset away, which the reductions take as immediates.
    float* const lane_dq = dq_rows + g * kHeadDim + (Traits::kDqDims * qd + 2 * t);
    int* semaphore = kDeterministic ? ws.semaphores + blk.workspace_row(p, ws.m_pad, h, m0) / kBlockM : nullptr;
    if constexpr (kDeterministic) {
      wait_for_dq_turn<kCausal>(semaphore, n_block, m_index, kBlockM, kBlockN, causal_offset);
    }
    float dq[2][Traits::kDqDimTiles][4];
    zero_fill(dq[0]);
    zero_fill(dq[1]);
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) mma::load_matrix_x4(a[mt], dq_rows_ds.at(16 * mt, ks));
#pragma unroll
      for (int dpair = 0; dpair < Traits::kDqDimTiles / 2; ++dpair) {
        uint32_t b_k[4];
        mma::load_matrix_x4_trans(b_k, dq_dims_k.at(16 * ks, dpair));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma::mma_16x8x16<Element>(dq[mt][2 * dpair], a[mt], b_k[0], b_k[1]);
          mma::mma_16x8x16<Element>(dq[mt][2 * dpair + 1], a[mt], b_k[2], b_k[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int dt = 0; dt < Traits::kDqDimTiles; ++dt) {
        if constexpr (kDeterministic) {
          const DqQuad quad = dq_quad(dq[mt][dt][0], dq[mt][dt][1], dq[mt][dt][2], dq[mt][dt][3], g, t);
          const int dim = Traits::kDqDims * qd + 8 * dt + quad.col;
          add_dq_16B<true>(reinterpret_cast<float4*>(dq_rows + (16 * mt + quad.row) * kHeadDim + dim), quad.sum);
        } else {
          // Each lane's two column pairs as they stand (rows g and g + 8): no shuffles.
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            reduce_add_8B(lane_dq + ((16 * mt + 8 * half) * kHeadDim + 8 * dt), dq[mt][dt][2 * half],
                          dq[mt][dt][2 * half + 1]);
          }
        }
      }
    }
    if constexpr (kDeterministic) pass_turn(semaphore);

#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      uint32_t a_ds[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) mma::load_matrix_x4_trans(a_ds[mt], key_cols.at(16 * ks, mt) + Traits::kDsOffset);
#pragma unroll
      for (int dpair = 0; dpair < kKvDimTiles / 2; ++dpair) {
        uint32_t b_q[4];
        mma::load_matrix_x4_trans(b_q, qdo_dims.at(16 * ks, dpair));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma::mma_16x8x16<Element>(dk[mt][2 * dpair], a_ds[mt], b_q[0], b_q[1]);
          mma::mma_16x8x16<Element>(dk[mt][2 * dpair + 1], a_ds[mt], b_q[2], b_q[3]);
        }
      }
    }

    // The next step's copies go into this step's Q and dO buffers at its top (begin_step): every warp
    // must be done reading them, and dK was their last reader.
    __syncthreads();
  }
  mma::wait_copies<0>();  // with no step, K and V were loaded for nothing: never exit with copies in flight

  // dK (times softmax_scale) and dV of this warp's 32 keys x kKvDims dims, one m16 tile of keys at a time.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    store_key_rows<Element, kKvDimTiles>(p, blk, n0 + 32 * kn + 16 * mt, Traits::kKvDims * kd, g, t,
                                         [&](int i, int j) { return dk[mt][i][j]; },
                                         [&](int i, int j) { return dv[mt][i][j]; });
  }
}

}  // namespace flash_bwd

/// \brief The main backward kernel; grid (key blocks, batch * heads_kv folded over y and z), one
/// block of 8 warps per SM.
template <typename Element, int kHeadDim, int kBlockM, bool kCausal, bool kDeterministic>
__global__ void __launch_bounds__(FlashBwdMmaTraits<Element, kHeadDim, kBlockM>::kThreads, 1)
    flash_bwd_mma_kernel(const __grid_constant__ AttentionBackwardParams p, const FlashBwdWorkspace ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async and bf16 mma need sm_80; mma_can_implement_backward refuses older devices
#else
  flash_bwd::backward_block<FlashBwdMmaTraits<Element, kHeadDim, kBlockM>, kCausal, kDeterministic>(p, ws);
#endif
}

template <int kHeadDim, int kBlockM = kFlashBwdMmaBlockM<kHeadDim>>
using FlashBwdMmaTraitsFor = FlashBwdMmaTraits<__half, kHeadDim, kBlockM>;

// Head dim 64 in 64-row steps: the form that fits devices with less shared memory per block.
inline constexpr int kFlashBwdMmaSmallBlockM = 64;

// The smallest query block (rows per step) of the flash backwards sharing the workspace layout:
// the deterministic semaphores are counted in it (the fp32 backward's at head dim 128).
inline constexpr int kFlashBwdMinBlockM = 32;

// Shared memory per main-kernel block for a head dim (the same for both 16-bit types), 0 if unsupported:
// the smallest of its forms, which the kernel table checks against the device (the launch takes the
// larger form where the device has room for it).
inline int flash_bwd_mma_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 64: return FlashBwdMmaTraitsFor<64, kFlashBwdMmaSmallBlockM>::kSmemBytes;
    case 128: return FlashBwdMmaTraitsFor<128>::kSmemBytes;
    default: return 0;
  }
}

// The workspace's rows per (batch, head): seqlen_q rounded up to kFlashBwdPadM, a multiple of every
// flash backward's query block (the largest: the 16-bit mma backward's 128 rows at head dim 64).
inline constexpr int kFlashBwdPadM = 128;

// Bytes of the workspace: dQ accumulator, lse * log2(e), D, and (deterministic) the semaphores,
// one per query block of the smallest query block of any flash backward (kFlashBwdMinBlockM).
inline size_t flash_bwd_mma_workspace_bytes(const AttentionBackwardParams& p, int64_t* m_pad) {
  constexpr int64_t kBlockM = kFlashBwdPadM;
  static_assert(kBlockM % FlashBwdMmaTraitsFor<64>::kBlockM == 0 && kBlockM % kFlashBwdMinBlockM == 0);
  *m_pad = (p.seqlen_q + kBlockM - 1) / kBlockM * kBlockM;
  const int64_t rows = p.batch * p.heads * *m_pad;
  size_t bytes = static_cast<size_t>(rows) * (p.head_dim + 2) * sizeof(float);
  if (p.deterministic) bytes += static_cast<size_t>(rows / kFlashBwdMinBlockM) * sizeof(int);
  return bytes;
}

/// \brief Launches preprocess, main and convert kernels on `stream` (params.device_id current)
/// over `workspace` (flash_bwd_mma_workspace_bytes).
template <typename Element, int kHeadDim>
Status launch_flash_bwd_mma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream);

/// \brief Launches a flash backward's main kernel, kernel(p, ws), on `grid` (backward_grid).
template <typename Kernel>
Status launch_backward_main(Kernel kernel, const AttentionBackwardParams& p, const FlashBwdWorkspace& ws,
                            const dim3& grid, int threads, int smem_bytes, cudaStream_t stream, const char* what) {
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(p, ws);
  return cuda_status(cudaGetLastError(), what);
}

/// \brief Calls launch(causal, deterministic) with p's flags as std::bool_constant values.
template <typename Launch>
Status with_backward_flags(const AttentionBackwardParams& p, Launch launch) {
  if (p.is_causal) {
    return p.deterministic ? launch(std::true_type{}, std::true_type{}) : launch(std::true_type{}, std::false_type{});
  }
  return p.deterministic ? launch(std::false_type{}, std::true_type{}) : launch(std::false_type{}, std::false_type{});
}

/// \brief Every flash backward's launch sequence over `workspace` (flash_bwd_mma_workspace_bytes):
/// preprocess (D, lse * log2(e), zeroed dQ accumulator; deterministic: zeroed semaphores), the
/// main kernel (`main(ws)` returning Status, skipped without keys), and the dQ conversion.
template <typename Element, int kHeadDim, int kBlockM, typename MainLaunch>
Status launch_flash_backward(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream, MainLaunch main) {
  constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride kernels: enough blocks to fill any GPU
  FlashBwdWorkspace ws;
  flash_bwd_mma_workspace_bytes(p, &ws.m_pad);
  static_assert(kFlashBwdPadM % kBlockM == 0 && kBlockM >= kFlashBwdMinBlockM,
                "the workspace's row padding and semaphores");
  const int64_t rows = p.batch * p.heads * ws.m_pad;
  ws.dq_accum = static_cast<float*>(workspace);
  ws.lse_log2 = ws.dq_accum + rows * kHeadDim;
  ws.d_rows = ws.lse_log2 + rows;
  if (p.deterministic) {
    ws.semaphores = reinterpret_cast<int*>(ws.d_rows + rows);
    WAVEBOOST_CUDA_RETURN(cudaMemsetAsync(ws.semaphores, 0, static_cast<size_t>(rows / kBlockM) * sizeof(int), stream));
  }
  if (rows > 0) {
    using Shape = flash_bwd::PreprocessShape<Element, kHeadDim>;
    const auto grid =
        static_cast<unsigned>(std::min<int64_t>((rows + Shape::kRowsPerBlock - 1) / Shape::kRowsPerBlock, kMaxGrid));
    flash_bwd::preprocess_kernel<Element, kHeadDim><<<grid, Shape::kThreads, 0, stream>>>(p, ws);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  if (p.seqlen_k > 0) {
    if (Status s = main(ws); !s.ok()) return s;
  }
  const int64_t chunks = p.batch * p.heads * p.seqlen_q * (kHeadDim / 8);
  if (chunks > 0) {
    const auto grid = static_cast<unsigned>(std::min<int64_t>((chunks + 255) / 256, kMaxGrid));
    flash_bwd::convert_dq_kernel<Element, kHeadDim><<<grid, 256, 0, stream>>>(p, ws.dq_accum, ws.m_pad);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  return Status::Ok();
}

template <typename Element, int kHeadDim, int kBlockM>
Status launch_flash_bwd_mma_rows(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  using Traits = FlashBwdMmaTraits<Element, kHeadDim, kBlockM>;
  return launch_flash_backward<Element, kHeadDim, kBlockM>(p, workspace, stream, [&](const FlashBwdWorkspace& ws) {
    dim3 grid;
    if (Status s = backward_grid(p, Traits::kBlockN, "mma", &grid); !s.ok()) return s;
    return with_backward_flags(p, [&](auto causal, auto deterministic) {
      const auto kernel =
          flash_bwd_mma_kernel<Element, kHeadDim, kBlockM, decltype(causal)::value, decltype(deterministic)::value>;
      return launch_backward_main(kernel, p, ws, grid, Traits::kThreads, Traits::kSmemBytes, stream,
                                  "flash_bwd_mma_kernel launch");
    });
  });
}

/// \brief Whether a head dim 64 call takes the 64-row steps: on devices whose shared memory per block is
/// short of the 128-row form's, or when WAVEBOOST_MMA_BACKWARD_ROWS=64 (read at every call; to test that
/// form on any device).
inline Status mma_backward_small_steps(const AttentionBackwardParams& p, bool* small) {
  const char* v = std::getenv("WAVEBOOST_MMA_BACKWARD_ROWS");
  if (v != nullptr && std::string(v) == "64") {
    *small = true;
    return Status::Ok();
  }
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  *small = smem_optin < FlashBwdMmaTraitsFor<64>::kSmemBytes;
  return Status::Ok();
}

template <typename Element, int kHeadDim>
Status launch_flash_bwd_mma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  if constexpr (kHeadDim == 64) {
    bool small = false;
    if (Status s = mma_backward_small_steps(p, &small); !s.ok()) return s;
    if (small) return launch_flash_bwd_mma_rows<Element, kHeadDim, kFlashBwdMmaSmallBlockM>(p, workspace, stream);
  }
  return launch_flash_bwd_mma_rows<Element, kHeadDim, kFlashBwdMmaBlockM<kHeadDim>>(p, workspace, stream);
}

}  // namespace waveboost::cuda
