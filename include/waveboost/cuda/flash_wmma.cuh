// Tensor-core flash attention forward through nvcuda::wmma (backend "wmma").
//
// One block owns kBlockM query rows of one (batch, head); each of its warps owns
// kRowsPerWarp of them and walks the visible key tiles with the online softmax:
//
//   S = Q K^T                       wmma, fp32 accumulators
//   m_new = max(m, rowmax(S * c))   c = softmax_scale * log2(e), lane-owned rows
//   P = exp2(S * c - m_new)         written to shared memory in the element type
//   O = exp2(m - m_new) * O + P V   wmma; O stays in accumulator fragments
//
// The accumulator layout of wmma is unspecified, which leaves two problems:
//  * Row statistics need the scores by row, so each warp stores S to its own
//    shared-memory scratch, and lane r reduces row r there.
//  * Rescaling O by a per-row factor needs to know the row of every fragment
//    element. The kernel learns that map once: it loads a matrix whose entry
//    (r, c) is r into an accumulator fragment, so element i of every fragment of
//    that type holds row x[i]. O then never leaves its fragments; the rescale is
//    skipped when no row max of the warp grew (exp2(0) == 1 exactly), which is
//    most tiles after the first few on typical data.
//
// Pipeline: K and V each have one shared-memory buffer, loaded a half tile apart
// with cp.async: V(j) lands while S(j) and its softmax run, K(j+1) while P V(j)
// runs. Double-buffering both would add 35 KB at D=128 and drop the kernel
// from two blocks per H100 SM to one.
#pragma once

#include <mma.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/mma_primitives.cuh"

namespace waveboost::cuda {

/// \brief Compile-time choices of the WMMA flash kernel.
/// \tparam Element  __half or __nv_bfloat16 (Q, K, V, O, P); accumulation is fp32.
/// \tparam kHeadDim_ 64 or 128.
/// \tparam kBlockN_ keys per tile: 64, or 32 where the 64-key tile's shared memory does not fit.
template <typename Element_, int kHeadDim_, int kBlockN_>
struct FlashWmmaTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  // 4 warps: with 105 KB of shared memory at D=128, two such blocks (8 warps) share an H100 SM.
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  // 32 rows = two 16-row fragments that share every K and V fragment load: half the shared-memory reads per flop of 16 rows.
  static constexpr int kRowsPerWarp = 32;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  // wmma m16n16k16: every fragment is a 16 x 16 tile.
  static constexpr int kFrag = 16;
  static constexpr int kRowFrags = kRowsPerWarp / kFrag;
  static constexpr int kKeyFrags = kBlockN / kFrag;
  static constexpr int kDimFrags = kHeadDim / kFrag;
  // S is computed and stored in passes of 32 keys: with O resident (128 registers per lane at
  // D=128), a whole 64-key S (64 more) spilled; the cost is one more read of the Q fragments per tile.
  static constexpr int kScorePassKeys = 32;
  static constexpr int kScorePassFrags = kScorePassKeys / kFrag;

  // +8 elements (16 B) per Q/K/V row: consecutive rows start 16 B apart modulo 128 B, so the
  // eight 16 B rows of one fragment-load phase fall in distinct banks.
  static constexpr int kTileLd = kHeadDim + 8;
  // +4 floats per score row: eight lanes reading float4s of eight consecutive rows hit distinct banks.
  static constexpr int kScoreLd = kBlockN + 4;
  // +8 elements per probability row: same 16 B stagger as the Q/K/V tiles; wmma needs a multiple of 8.
  static constexpr int kProbLd = kBlockN + 8;

  // Per-warp scratch: the fp32 score tile, which P (element type) then overwrites in place,
  // and in the epilogue one kBlockN-column slice of O. Also hosts the 16 x 16 row map at start.
  static constexpr int kScratchFloats = kRowsPerWarp * kScoreLd;
  static_assert(kRowsPerWarp * kProbLd * int(sizeof(Element)) <= kScratchFloats * int(sizeof(float)));
  static_assert(kFrag * kFrag <= kScratchFloats);

  static constexpr int kQTileBytes = kBlockM * kTileLd * int(sizeof(Element));
  static constexpr int kKVTileBytes = kBlockN * kTileLd * int(sizeof(Element));
  static constexpr int kScratchBytes = kWarps * kScratchFloats * int(sizeof(float));
  static constexpr int kRowScaleBytes = kWarps * kRowsPerWarp * int(sizeof(float));
  static constexpr int kSmemBytes = kQTileBytes + 2 * kKVTileBytes + kScratchBytes + kRowScaleBytes;

  // 16 B copies: each thread moves whole 8-element chunks of a row.
  static constexpr int kChunk = 16 / int(sizeof(Element));

  static_assert(kHeadDim % kBlockN == 0, "the epilogue writes O in kBlockN-column slices");
  static_assert(kBlockN % kScorePassKeys == 0);
  static_assert(kRowsPerWarp == 32, "one lane per query row of the warp");
  // Whole passes of 16 B chunks over the Q and K/V tiles.
  static_assert(kThreads % (kHeadDim / kChunk) == 0 && kBlockN % (kThreads / (kHeadDim / kChunk)) == 0 &&
                kBlockM % (kThreads / (kHeadDim / kChunk)) == 0);
  static_assert(kQTileBytes % 128 == 0 && kKVTileBytes % 128 == 0 && kScratchBytes % 128 == 0);
};

// bf16 wmma exists from sm_80 on; the bf16 kernels compile to a trap for older targets
// (wmma_can_implement refuses those devices at run time).
template <typename Element>
inline constexpr bool kWmmaElementOnThisArch =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    !std::is_same_v<Element, __nv_bfloat16>;
#else
    true;
#endif

// Blocks per SM the register allocation must allow. On sm_90, three D=64 blocks (72 KB each)
// fit the 228 KB of shared memory if each thread stays within 168 registers, which ptxas meets
// without spilling; elsewhere shared memory allows two at most and 255 registers keep two.
template <int kHeadDim, int kBlockN>
inline constexpr int kFlashWmmaMinBlocksPerSm =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    kHeadDim == 64 && kBlockN == 64 ? 3 : 1;
#else
    1;
#endif

namespace flash_wmma {

using namespace nvcuda;

using AccumFragment = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename Element>
using RowFragmentA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Element, wmma::row_major>;
// K^T: K rows are the columns of the B operand of Q K^T.
template <typename Element>
using KeyFragmentB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, wmma::col_major>;
template <typename Element>
using ValueFragmentB = wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, wmma::row_major>;

static_assert(AccumFragment::num_elements <= 8, "the row map packs one 4-bit row per accumulator element");

// nvcc 13.0 emits wmma.load for bf16 without the .shared state space even for shared-memory
// pointers (fp16 gets it), and generic wmma loads lower to 32-bit LDs plus MOVM transposes
// instead of ldmatrix: twice the instructions and enough extra registers to spill at D=128.
// For bf16 this issues the same wmma.load with .shared spelled out, writing the fragment's
// four 32-bit registers exactly as the nvcuda::wmma intrinsic does.
template <typename Use, typename Layout, typename Element>
__device__ __forceinline__ void load_fragment(wmma::fragment<Use, 16, 16, 16, Element, Layout>& f, const Element* smem,
                                              unsigned ldm) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    uint32_t* r = reinterpret_cast<uint32_t*>(&f);
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    if constexpr (std::is_same_v<Use, wmma::matrix_a> && std::is_same_v<Layout, wmma::row_major>) {
      asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr), "r"(ldm) : "memory");
    } else if constexpr (std::is_same_v<Use, wmma::matrix_b> && std::is_same_v<Layout, wmma::col_major>) {
      asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr), "r"(ldm) : "memory");
    } else {
      static_assert(std::is_same_v<Use, wmma::matrix_b> && std::is_same_v<Layout, wmma::row_major>);
      asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr), "r"(ldm) : "memory");
    }
  } else {
    wmma::load_matrix_sync(f, smem, ldm);
  }
}

// ----------------------------------------------------------------------------
// Global -> shared copies
// ----------------------------------------------------------------------------

// 16 B global -> shared copy; zero-fills the destination when !valid. sm_80+: the shared
// cp.async (mma_primitives.cuh); sm_70/75 (fp16 wmma) copy through registers, and the
// commit / wait below are then no-ops.
__device__ __forceinline__ void copy_16B(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  mma::copy_async_16B(mma::shared_address(smem), gmem, valid);
#else
  *static_cast<uint4*>(smem) = valid ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  mma::commit_copies();
#endif
}

__device__ __forceinline__ void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  mma::wait_copies<0>();
#endif
}

// Copies rows [0, kRows) x [0, kHeadDim) of a tile whose rows are row_stride elements apart
// into shared memory (pitch kTileLd); rows >= valid_rows become zeros, so neither garbage nor
// NaN from beyond the sequence ever enters a product. `vectorized` (16 B aligned base and
// strides) selects cp.async; otherwise a scalar copy serves any stride.
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile(typename Traits::Element* tile, const typename Traits::Element* src,
                                          int64_t row_stride, int64_t valid_rows, bool vectorized) {
  using Element = typename Traits::Element;
  constexpr int kChunksPerRow = Traits::kHeadDim / Traits::kChunk;
  if (vectorized) {
    // Thread t copies chunk t % kChunksPerRow of rows t / kChunksPerRow + i * kRowsPerPass.
    constexpr int kRowsPerPass = Traits::kThreads / kChunksPerRow;
    const int col = (threadIdx.x % kChunksPerRow) * Traits::kChunk;
    int row = threadIdx.x / kChunksPerRow;
    const Element* src_row = src + row * row_stride + col;
    Element* dst_row = tile + row * Traits::kTileLd + col;
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const bool valid = row < valid_rows;
      copy_16B(dst_row, valid ? src_row : src, valid);
      row += kRowsPerPass;
      src_row += kRowsPerPass * row_stride;
      dst_row += kRowsPerPass * Traits::kTileLd;
    }
  } else {
    for (int e = threadIdx.x; e < kRows * Traits::kHeadDim; e += Traits::kThreads) {
      const int row = e / Traits::kHeadDim;
      const int col = e % Traits::kHeadDim;
      tile[row * Traits::kTileLd + col] = row < valid_rows ? src[row * row_stride + col] : from_float<Element>(0.f);
    }
  }
}

// ----------------------------------------------------------------------------
// Fragment row map and per-row rescale
// ----------------------------------------------------------------------------

// Row (0..15) of each accumulator fragment element for this lane, 4 bits per element.
__device__ __forceinline__ uint32_t accumulator_row_map(float* scratch, int lane) {
  for (int e = lane; e < 16 * 16; e += 32) scratch[e] = static_cast<float>(e / 16);
  __syncwarp();
  AccumFragment rows;
  wmma::load_matrix_sync(rows, scratch, 16, wmma::mem_row_major);
  uint32_t map = 0;
#pragma unroll
  for (int i = 0; i < AccumFragment::num_elements; ++i) map |= static_cast<uint32_t>(rows.x[i]) << (4 * i);
  __syncwarp();
  return map;
}

__device__ __forceinline__ int fragment_row(uint32_t row_map, int i) { return (row_map >> (4 * i)) & 15; }

// O[r, :] *= row_scale[r] for the warp's rows, O held in fragments.
template <typename Traits>
__device__ __forceinline__ void rescale(AccumFragment (&o)[Traits::kRowFrags][Traits::kDimFrags],
                                        const float* row_scale, uint32_t row_map) {
#pragma unroll
  for (int rb = 0; rb < Traits::kRowFrags; ++rb) {
    float scale[AccumFragment::num_elements];
#pragma unroll
    for (int i = 0; i < AccumFragment::num_elements; ++i) scale[i] = row_scale[rb * 16 + fragment_row(row_map, i)];
#pragma unroll
    for (int cb = 0; cb < Traits::kDimFrags; ++cb) {
#pragma unroll
      for (int i = 0; i < AccumFragment::num_elements; ++i) o[rb][cb].x[i] *= scale[i];
    }
  }
}

// ----------------------------------------------------------------------------
// The two products
// ----------------------------------------------------------------------------

// S = Q K^T for the warp's kRowsPerWarp rows and kScorePassKeys keys (rows of k_keys), stored
// to the score scratch at column `first_col`.
template <typename Traits>
__device__ __forceinline__ void scores(float* scratch, int first_col, const typename Traits::Element* q_warp,
                                       const typename Traits::Element* k_keys) {
  using Element = typename Traits::Element;
  AccumFragment s[Traits::kRowFrags][Traits::kScorePassFrags];
#pragma unroll
  for (int rb = 0; rb < Traits::kRowFrags; ++rb) {
#pragma unroll
    for (int cb = 0; cb < Traits::kScorePassFrags; ++cb) wmma::fill_fragment(s[rb][cb], 0.f);
  }
#pragma unroll
  for (int kk = 0; kk < Traits::kDimFrags; ++kk) {
    RowFragmentA<Element> q[Traits::kRowFrags];
#pragma unroll
    for (int rb = 0; rb < Traits::kRowFrags; ++rb)
      load_fragment(q[rb], q_warp + rb * 16 * Traits::kTileLd + kk * 16, Traits::kTileLd);
#pragma unroll
    for (int cb = 0; cb < Traits::kScorePassFrags; ++cb) {
      KeyFragmentB<Element> k;
      load_fragment(k, k_keys + cb * 16 * Traits::kTileLd + kk * 16, Traits::kTileLd);
#pragma unroll
      for (int rb = 0; rb < Traits::kRowFrags; ++rb) wmma::mma_sync(s[rb][cb], q[rb], k, s[rb][cb]);
    }
  }
#pragma unroll
  for (int rb = 0; rb < Traits::kRowFrags; ++rb) {
#pragma unroll
    for (int cb = 0; cb < Traits::kScorePassFrags; ++cb) {
      wmma::store_matrix_sync(scratch + rb * 16 * Traits::kScoreLd + first_col + cb * 16, s[rb][cb], Traits::kScoreLd,
                              wmma::mem_row_major);
    }
  }
}

// O += P V with P (kRowsPerWarp x kBlockN, element type) in the warp's scratch.
template <typename Traits>
__device__ __forceinline__ void accumulate_pv(AccumFragment (&o)[Traits::kRowFrags][Traits::kDimFrags],
                                              const typename Traits::Element* prob,
                                              const typename Traits::Element* v_tile) {
  using Element = typename Traits::Element;
#pragma unroll
  for (int kk = 0; kk < Traits::kKeyFrags; ++kk) {
    RowFragmentA<Element> p[Traits::kRowFrags];
#pragma unroll
    for (int rb = 0; rb < Traits::kRowFrags; ++rb)
      load_fragment(p[rb], prob + rb * 16 * Traits::kProbLd + kk * 16, Traits::kProbLd);
#pragma unroll
    for (int cb = 0; cb < Traits::kDimFrags; ++cb) {
      ValueFragmentB<Element> v;
      load_fragment(v, v_tile + kk * 16 * Traits::kTileLd + cb * 16, Traits::kTileLd);
#pragma unroll
      for (int rb = 0; rb < Traits::kRowFrags; ++rb) wmma::mma_sync(o[rb][cb], p[rb], v, o[rb][cb]);
    }
  }
}

// ----------------------------------------------------------------------------
// Online softmax on lane-owned rows
// ----------------------------------------------------------------------------

template <int kCols>
__device__ __forceinline__ float row_max(const float (&t)[kCols]) {
  float m = t[0];
#pragma unroll
  for (int c = 1; c < kCols; ++c) m = fmaxf(m, t[c]);
  return m;
}

// Lane r turns score row r of the warp's scratch into probabilities in place: scales by
// scale_log2, masks keys >= visible_keys when `masked`, updates the running max and sum
// (log2 units) and writes P in the element type over the scores. Returns exp2(m_old - m_new),
// the factor by which the row's O must shrink (0 while the row has seen no key).
template <typename Traits>
__device__ __forceinline__ float online_softmax(float* scratch, int lane, float scale_log2, bool masked,
                                                int visible_keys, float& running_max, float& running_sum) {
  using Element = typename Traits::Element;
  constexpr int kCols = Traits::kBlockN;
  float t[kCols];
  const float4* score_row = reinterpret_cast<const float4*>(scratch + lane * Traits::kScoreLd);
#pragma unroll
  for (int c = 0; c < kCols / 4; ++c) {
    const float4 s = score_row[c];
    t[4 * c + 0] = s.x * scale_log2;
    t[4 * c + 1] = s.y * scale_log2;
    t[4 * c + 2] = s.z * scale_log2;
    t[4 * c + 3] = s.w * scale_log2;
  }
  if (masked) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) t[c] = c < visible_keys ? t[c] : -INFINITY;
  }
  const float new_max = fmaxf(running_max, row_max(t));
  // A row that has seen no key yet keeps max -inf; subtracting 0 instead keeps its
  // probabilities 0 (never exp2(-inf - -inf) = NaN).
  const float reference = new_max == -INFINITY ? 0.f : new_max;
  const float alpha = mma::exp2(running_max - reference);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    t[c] = mma::exp2(t[c] - reference);
    sum += t[c];
  }
  running_sum = running_sum * alpha + sum;
  running_max = new_max;

  __syncwarp();  // every lane has read its scores before P overwrites them
  uint4* prob_row = reinterpret_cast<uint4*>(reinterpret_cast<Element*>(scratch) + lane * Traits::kProbLd);
#pragma unroll
  for (int c = 0; c < kCols / 8; ++c) {
    prob_row[c] = make_uint4(pack_pair<Element>(t[8 * c + 0], t[8 * c + 1]), pack_pair<Element>(t[8 * c + 2], t[8 * c + 3]),
                             pack_pair<Element>(t[8 * c + 4], t[8 * c + 5]), pack_pair<Element>(t[8 * c + 6], t[8 * c + 7]));
  }
  return alpha;
}

// ----------------------------------------------------------------------------
// Epilogue
// ----------------------------------------------------------------------------

// Writes the warp's normalized O (rows m_warp.., valid while < seqlen_q) through the scratch,
// one kBlockN-column slice at a time, as 4-element stores along each row.
template <typename Traits>
__device__ __forceinline__ void store_output(const AccumFragment (&o)[Traits::kRowFrags][Traits::kDimFrags],
                                             float* scratch, int lane, typename Traits::Element* out,
                                             int64_t row_stride, int64_t valid_rows, bool vectorized) {
  using Element = typename Traits::Element;
  constexpr int kSlices = Traits::kHeadDim / Traits::kBlockN;
  constexpr int kQuadsPerRow = Traits::kBlockN / 4;
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
    __syncwarp();  // the previous slice (or P) has been read
#pragma unroll
    for (int rb = 0; rb < Traits::kRowFrags; ++rb) {
#pragma unroll
      for (int cb = 0; cb < Traits::kKeyFrags; ++cb) {
        wmma::store_matrix_sync(scratch + rb * 16 * Traits::kScoreLd + cb * 16, o[rb][slice * Traits::kKeyFrags + cb],
                                Traits::kScoreLd, wmma::mem_row_major);
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < Traits::kRowsPerWarp * kQuadsPerRow / 32; ++i) {
      const int quad = lane + 32 * i;
      const int row = quad / kQuadsPerRow;
      const int col = (quad % kQuadsPerRow) * 4;
      if (row >= valid_rows) continue;
      const float4 x = *reinterpret_cast<const float4*>(scratch + row * Traits::kScoreLd + col);
      Element* dst = out + row * row_stride + slice * Traits::kBlockN + col;
      if (vectorized) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack_pair<Element>(x.x, x.y), pack_pair<Element>(x.z, x.w));
      } else {
        dst[0] = from_float<Element>(x.x);
        dst[1] = from_float<Element>(x.y);
        dst[2] = from_float<Element>(x.z);
        dst[3] = from_float<Element>(x.w);
      }
    }
  }
}

// ----------------------------------------------------------------------------
// One block: kBlockM query rows of one (batch, head)
// ----------------------------------------------------------------------------

template <typename Traits>
__device__ __forceinline__ void attend_block(const AttentionParams& p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_tile = reinterpret_cast<Element*>(smem);
  Element* k_tile = reinterpret_cast<Element*>(smem + Traits::kQTileBytes);
  Element* v_tile = reinterpret_cast<Element*>(smem + Traits::kQTileBytes + Traits::kKVTileBytes);
  float* scratch_base = reinterpret_cast<float*>(smem + Traits::kQTileBytes + 2 * Traits::kKVTileBytes);
  float* row_scale_base = scratch_base + Traits::kWarps * Traits::kScratchFloats;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* scratch = scratch_base + warp * Traits::kScratchFloats;
  float* row_scale = row_scale_base + warp * Traits::kRowsPerWarp;

  // Key tiles entirely above the diagonal of the block's last row are never visited.
  FlashBlock blk;
  if (!locate_flash_block(p, p.is_causal, blockIdx.x, gridDim.x, kBlockM, kBlockN, blk)) return;
  const Element* q = blk.q_rows<Element>(p);
  const Element* k = blk.k_rows<Element>(p);
  const Element* v = blk.v_rows<Element>(p);
  const bool vectorized = vector_friendly(p, 8);

  if (blk.n_tiles > 0) {  // otherwise every row sees no key: nothing to load, the epilogue writes zeros
    load_tile<Traits, kBlockM>(q_tile, q, p.q_row_stride, blk.rows, vectorized);
    load_tile<Traits, kBlockN>(k_tile, k, p.k_row_stride, p.seqlen_k, vectorized);
    commit_copies();
  }

  const uint32_t row_map = accumulator_row_map(scratch, lane);
  const float scale_log2 = static_cast<float>(p.softmax_scale * kLog2e);
  const int64_t warp_m0 = blk.m0 + warp * Traits::kRowsPerWarp;
  // Lane r owns query row warp_m0 + r for the softmax statistics.
  const int64_t lane_keys = p.is_causal ? causal_keys_visible(warp_m0 + lane, p) : p.seqlen_k;
  const int64_t warp_first_keys = p.is_causal ? causal_keys_visible(warp_m0, p) : p.seqlen_k;
  float running_max = -INFINITY;
  float running_sum = 0.f;

  AccumFragment o[Traits::kRowFrags][Traits::kDimFrags];
#pragma unroll
  for (int rb = 0; rb < Traits::kRowFrags; ++rb) {
#pragma unroll
    for (int cb = 0; cb < Traits::kDimFrags; ++cb) wmma::fill_fragment(o[rb][cb], 0.f);
  }

  const Element* q_warp = q_tile + warp * Traits::kRowsPerWarp * Traits::kTileLd;
  const Element* prob = reinterpret_cast<const Element*>(scratch);
  for (int64_t j = 0; j < blk.n_tiles; ++j) {
    const int64_t n0 = j * kBlockN;
    wait_copies();
    __syncthreads();  // K(j) (and Q) visible to all warps; every warp is done reading V(j-1)
    load_tile<Traits, kBlockN>(v_tile, v + n0 * p.v_row_stride, p.v_row_stride, p.seqlen_k - n0, vectorized);
    commit_copies();

#pragma unroll
    for (int pass = 0; pass < kBlockN / Traits::kScorePassKeys; ++pass) {
      const int first_key = pass * Traits::kScorePassKeys;
      scores<Traits>(scratch, first_key, q_warp, k_tile + first_key * Traits::kTileLd);
    }
    __syncwarp();

    // Only the sequence tail and tiles crossing the warp's diagonal need a mask; the warp's
    // first row sees the fewest keys, so if it sees the whole tile every row does.
    const bool masked = n0 + kBlockN > warp_first_keys;
    const int visible = static_cast<int>(max(int64_t{0}, min(lane_keys - n0, static_cast<int64_t>(kBlockN))));
    const float alpha = online_softmax<Traits>(scratch, lane, scale_log2, masked, visible, running_max, running_sum);

    wait_copies();
    __syncthreads();  // V(j) visible to all warps; every warp is done reading K(j)
    if (j + 1 < blk.n_tiles) {
      load_tile<Traits, kBlockN>(k_tile, k + (n0 + kBlockN) * p.k_row_stride, p.k_row_stride,
                                 p.seqlen_k - n0 - kBlockN, vectorized);
      commit_copies();
    }

    if (!__all_sync(kFullWarpMask, alpha == 1.f)) {
      row_scale[lane] = alpha;
      __syncwarp();
      rescale<Traits>(o, row_scale, row_map);
    }
    accumulate_pv<Traits>(o, prob, v_tile);
    __syncwarp();  // P and row_scale are read before the next tile overwrites them
  }

  // O /= row sum; a row that saw no key has sum 0 and O 0, and stays 0. A NaN (or +inf)
  // score makes the sum NaN: `== 0`, not `> 0`, so that NaN reaches O and the LSE
  // instead of reading as "no key" (LSE -inf).
  row_scale[lane] = running_sum == 0.f ? 0.f : 1.f / running_sum;
  __syncwarp();
  rescale<Traits>(o, row_scale, row_map);

  const int64_t lane_row = warp_m0 + lane;
  if (p.lse != nullptr && lane_row < p.seqlen_q) {
    p.lse[blk.b * p.lse_batch_stride + blk.h * p.lse_head_stride + lane_row] =
        running_sum == 0.f ? -INFINITY : (running_max + log2f(running_sum)) * kLn2;
  }
  Element* out =
      static_cast<Element*>(p.out) + blk.b * p.o_batch_stride + blk.h * p.o_head_stride + warp_m0 * p.o_row_stride;
  store_output<Traits>(o, scratch, lane, out, p.o_row_stride, p.seqlen_q - warp_m0, vectorized);
}

}  // namespace flash_wmma

/// \brief Flash attention forward on tensor cores; grid (query blocks, batch*heads folded over y and z).
template <typename Element, int kHeadDim, int kBlockN>
__global__ void __launch_bounds__(FlashWmmaTraits<Element, kHeadDim, kBlockN>::kThreads,
                                  kFlashWmmaMinBlocksPerSm<kHeadDim, kBlockN>)
    flash_wmma_kernel(const __grid_constant__ AttentionParams p) {
  if constexpr (kWmmaElementOnThisArch<Element>) {
    flash_wmma::attend_block<FlashWmmaTraits<Element, kHeadDim, kBlockN>>(p);
  } else {
    __trap();
  }
}

// Shared memory of a configuration; it does not depend on which 16-bit element type.
template <int kHeadDim, int kBlockN>
inline constexpr int kFlashWmmaSmemBytes = FlashWmmaTraits<__half, kHeadDim, kBlockN>::kSmemBytes;

// Keys per tile for a head dim on a device allowing `smem_optin` bytes of shared memory per
// block: 64 where it fits (sm_80, sm_90; sm_86/89 at D=64), else 32 (sm_86/89 at D=128,
// sm_75 at D=64); 0 if neither fits (sm_75 at D=128).
inline int flash_wmma_block_n(int64_t head_dim, int smem_optin) {
  switch (head_dim) {
    case 64:
      return kFlashWmmaSmemBytes<64, 64> <= smem_optin ? 64 : kFlashWmmaSmemBytes<64, 32> <= smem_optin ? 32 : 0;
    case 128:
      return kFlashWmmaSmemBytes<128, 64> <= smem_optin ? 64 : kFlashWmmaSmemBytes<128, 32> <= smem_optin ? 32 : 0;
    default:
      return 0;
  }
}

// Shared memory the smallest WMMA configuration of a head dim needs (for error messages).
inline int flash_wmma_min_smem_bytes(int64_t head_dim) {
  return head_dim == 64 ? kFlashWmmaSmemBytes<64, 32> : kFlashWmmaSmemBytes<128, 32>;
}

// Query rows per block, the same in every configuration (the launch grid is folded_grid's).
inline constexpr int64_t kFlashWmmaBlockM = FlashWmmaTraits<__half, 64, 64>::kBlockM;

template <typename Element, int kHeadDim, int kBlockN>
Status launch_flash_wmma_tiles(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashWmmaTraits<Element, kHeadDim, kBlockN>;
  static_assert(Traits::kBlockM == kFlashWmmaBlockM);
  if (Status s = folded_grid_check(p, Traits::kBlockM, "wmma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = flash_wmma_kernel<Element, kHeadDim, kBlockN>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cuda_status(cudaGetLastError(), "flash_wmma_kernel launch");
}

/// \brief Launches the WMMA forward on `stream` (params.device_id current, batch * heads *
/// seqlen_q > 0, as attention_forward guarantees). Picks 64-key tiles where their shared
/// memory fits the device, else 32-key tiles.
template <typename Element, int kHeadDim>
Status launch_flash_wmma(const AttentionParams& p, cudaStream_t stream) {
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  switch (flash_wmma_block_n(kHeadDim, smem_optin)) {
    case 64:
      return launch_flash_wmma_tiles<Element, kHeadDim, 64>(p, stream);
    case 32:
      return launch_flash_wmma_tiles<Element, kHeadDim, 32>(p, stream);
    default:
      return Status::NotSupported("backend 'wmma' needs " + std::to_string(flash_wmma_min_smem_bytes(kHeadDim)) +
                                  " bytes of shared memory per block for head_dim " + std::to_string(kHeadDim) +
                                  "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  }
}

}  // namespace waveboost::cuda
