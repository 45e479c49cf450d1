// SIMT flash forward (backend "simt"): FlashAttention-2 style online softmax
// on CUDA cores, fp32 accumulation, register-blocked like a SIMT SGEMM. It is
// the fp32 path; fp16/bf16 inputs are converted to fp32 when they are staged
// into shared memory.
//
// One block owns kBlockM query rows of one (batch, head). Its Q tile (scaled by
// softmax_scale * log2(e), so the softmax is exp2) stays in shared memory; K
// and V tiles of kBlockN keys pass through one shared buffer, K then V, each
// fetched into registers while the block computes on the previous buffer.
#pragma once

#include <cstdint>
#include <string>

#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

/// \brief Every compile-time choice of the SIMT flash forward.
/// \tparam Element  float, __half or __nv_bfloat16 (storage type of q, k, v, out).
/// \tparam kHeadDim 64 or 128.
template <typename Element, int kHeadDim>
struct FlashSimtTraits {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the SIMT path is specialized for head_dim 64 and 128");

  // 4 warps: with the 4-row micro-tile below that is 64 query rows and 52-60 KB
  // of shared memory per block, which fits every target from sm_75 (64 KB) up.
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;

  // A warp's lanes are 4 row groups x 8 column groups. A row's scores live in
  // the 8 lanes of one row group, so row max/sum are 3 xor-shuffles, and every
  // query row is owned by one warp: no cross-warp softmax reduction.
  static constexpr int kRowGroups = 4;
  static constexpr int kColGroups = 8;
  // Rows per thread; thread rows are row_base + kRowGroups * i (interleaved)
  // so the 4 row groups read 4 consecutive padded Q/P rows: no bank conflicts.
  static constexpr int kRowsPerThread = 4;
  static constexpr int kRowsPerWarp = kRowGroups * kRowsPerThread;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;

  // Keys per tile: 64 at D=64, 32 at D=128 keeps the K/V buffer at 16-17 KB
  // and the whole block under the 64 KB opt-in limit of sm_75.
  static constexpr int kBlockN = kHeadDim <= 64 ? 64 : 32;
  // Keys per thread in S = Q K^T (keys tx + kColGroups * j) and head dims per
  // thread in O += P V (dims 4 * tx + 4 * kColGroups * c, float4 groups).
  static constexpr int kKeysPerThread = kBlockN / kColGroups;
  static constexpr int kDimsPerThread = kHeadDim / kColGroups;
  static constexpr int kDimGroups = kDimsPerThread / 4;

  // Q and K/V rows are padded by 4 floats: row stride = 4 banks mod 32, so 8
  // consecutive rows read as float4 at one column hit 32 distinct banks, and
  // rows stay 16-byte aligned for LDS.128.
  static constexpr int kRowStride = kHeadDim + 4;
  // P rows padded by 8 floats: the scalar P stores of a warp (4 rows x 8 keys)
  // land in 32 distinct banks; rows stay 16-byte aligned.
  static constexpr int kProbStride = kBlockN + 8;

  // Global loads are 16 bytes (4 fp32 or 8 fp16/bf16 elements) when aligned.
  static constexpr int kVec = 16 / static_cast<int>(sizeof(Element));
  static constexpr int kChunksPerRow = kHeadDim / kVec;
  // Rows one pass of all threads covers when fetching a tile.
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  // 16-byte chunks of one K or V tile each thread stages in registers.
  static constexpr int kStageChunks = kBlockN * kChunksPerRow / kThreads;
  static constexpr int kQChunks = kBlockM * kChunksPerRow / kThreads;

  // The d loop of S and the key loop of P V are unrolled by these factors,
  // not fully: that is enough for ptxas to pipeline the shared-memory loads,
  // and keeps the loop bodies a few KB of SASS for the instruction cache.
  static constexpr int kUnrollQK = 8;
  static constexpr int kUnrollPV = 2;

  static constexpr int kQTileFloats = kBlockM * kRowStride;
  static constexpr int kKvTileFloats = kBlockN * kRowStride;
  static constexpr int kProbTileFloats = kBlockM * kProbStride;
  static constexpr int kSmemBytes =
      static_cast<int>(sizeof(float)) * (kQTileFloats + kKvTileFloats + kProbTileFloats);

  // Occupancy target for __launch_bounds__: 2 blocks (8 warps) per SM, the
  // regime of register-blocked SIMT GEMMs: up to 255 registers per thread
  // buys 64 accumulators, 32 staging registers and pipelined fragments with
  // no spills. At 3 (<= 168 registers) ptxas spills 16-60 bytes at D=128.
  static constexpr int kMinBlocksPerSm = 2;

  static_assert(kBlockN % kColGroups == 0 && kBlockN % 4 == 0, "keys per thread must be whole float4 steps");
  static_assert(kDimsPerThread % 4 == 0, "head dims per thread must be whole float4 groups");
  static_assert(kThreads % kChunksPerRow == 0, "a fetch pass must cover whole rows");
  static_assert(kBlockN % kRowsPerPass == 0 && kBlockM % kRowsPerPass == 0, "tiles must be whole fetch passes");
  static_assert(kVec % 4 == 0, "a 16-byte chunk must be whole float4 groups in shared memory");
};

namespace simt_detail {

__device__ __forceinline__ float component(const float4& v, int c) {
  return c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w));
}

// 16-bit element bits -> float.
__device__ __forceinline__ float bits_to_float(unsigned int bits, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float bits_to_float(unsigned int bits, __nv_bfloat16) {
  return __uint_as_float(bits << 16);  // bf16 is the top half of an fp32
}

// Unpacks one 16-byte chunk of elements into floats.
__device__ __forceinline__ void unpack_chunk(const uint4& raw, float (&dst)[4], float) {
  dst[0] = __uint_as_float(raw.x);
  dst[1] = __uint_as_float(raw.y);
  dst[2] = __uint_as_float(raw.z);
  dst[3] = __uint_as_float(raw.w);
}
template <typename Half>
__device__ __forceinline__ void unpack_chunk(const uint4& raw, float (&dst)[8], Half tag) {
  const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    dst[2 * w] = bits_to_float(words[w] & 0xffffu, tag);
    dst[2 * w + 1] = bits_to_float(words[w] >> 16, tag);
  }
}

// Loads 16 bytes of elements as floats: one 128-bit load when the caller
// proved alignment, else element by element (odd strides, offset views).
template <typename Element, int kVec>
__device__ __forceinline__ void load_chunk(const Element* src, bool vectorized, float (&dst)[kVec]) {
  if (vectorized) {
    unpack_chunk(__ldg(reinterpret_cast<const uint4*>(src)), dst, Element());
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) dst[e] = to_float(src[e]);
  }
}

// Stores 4 consecutive outputs: one 16-byte (fp32) or 8-byte (fp16/bf16)
// store when aligned, else element by element.
__device__ __forceinline__ void store_quad(float* dst, const float (&v)[4], bool vectorized) {
  if (vectorized) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = v[e];
  }
}
__device__ __forceinline__ unsigned int element_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned int element_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <typename Half>
__device__ __forceinline__ void store_quad(Half* dst, const float (&v)[4], bool vectorized) {
  if (vectorized) {
    uint2 packed;
    packed.x = element_bits(from_float<Half>(v[0])) | (element_bits(from_float<Half>(v[1])) << 16);
    packed.y = element_bits(from_float<Half>(v[2])) | (element_bits(from_float<Half>(v[3])) << 16);
    *reinterpret_cast<uint2*>(dst) = packed;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[e] = from_float<Half>(v[e]);
  }
}

// Whether every row of a view starting at `base` with `row_stride` elements can
// be read in aligned groups of `group_bytes`.
template <typename Element>
__device__ __forceinline__ bool rows_aligned(const Element* base, int64_t row_stride, int group_bytes) {
  const int64_t group_elems = group_bytes / static_cast<int64_t>(sizeof(Element));
  return reinterpret_cast<uintptr_t>(base) % group_bytes == 0 && row_stride % group_elems == 0;
}

// Fetches rows [0, rows_left) of a kBlockN x kHeadDim K or V tile into this
// thread's staging registers; rows past the end are zeros (P V must never see
// garbage: 0 * NaN is NaN). Thread tid fetches the 16-byte chunk at column
// (tid % kChunksPerRow) * kVec of rows tid / kChunksPerRow + kRowsPerPass * s.
template <typename Traits, typename Element>
__device__ __forceinline__ void fetch_kv_tile(float (&staged)[Traits::kStageChunks][Traits::kVec],
                                              const Element* tile, int64_t row_stride, int64_t rows_left,
                                              bool vectorized, int tid) {
  const int first_row = tid / Traits::kChunksPerRow;
  const int rows_valid = static_cast<int>(min(rows_left, static_cast<int64_t>(Traits::kBlockN)));
  const Element* src = tile + first_row * row_stride + (tid % Traits::kChunksPerRow) * Traits::kVec;
  const int64_t pass_stride = Traits::kRowsPerPass * row_stride;
#pragma unroll
  for (int s = 0; s < Traits::kStageChunks; ++s) {
    if (first_row + Traits::kRowsPerPass * s < rows_valid) {
      load_chunk<Element, Traits::kVec>(src, vectorized, staged[s]);
    } else {
#pragma unroll
      for (int e = 0; e < Traits::kVec; ++e) staged[s][e] = 0.0f;
    }
    src += pass_stride;
  }
}

// Writes the staged tile to the shared K/V buffer, same chunk mapping.
template <typename Traits>
__device__ __forceinline__ void store_kv_tile(float* kv_tile, const float (&staged)[Traits::kStageChunks][Traits::kVec],
                                              int tid) {
  float* dst = kv_tile + (tid / Traits::kChunksPerRow) * Traits::kRowStride + (tid % Traits::kChunksPerRow) * Traits::kVec;
#pragma unroll
  for (int s = 0; s < Traits::kStageChunks; ++s) {
#pragma unroll
    for (int e = 0; e < Traits::kVec; e += 4) {
      *reinterpret_cast<float4*>(&dst[Traits::kRowsPerPass * s * Traits::kRowStride + e]) =
          make_float4(staged[s][e], staged[s][e + 1], staged[s][e + 2], staged[s][e + 3]);
    }
  }
}

}  // namespace simt_detail

/// \brief SIMT flash attention forward; one block per (kBlockM query rows, batch, head).
///
/// Grid: blockIdx.x = (batch * heads + head) * num_m_blocks + reversed m block,
/// all in x so neither batch * heads nor seqlen_q meets the 65535 limit of y/z.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(FlashSimtTraits<Element, kHeadDim>::kThreads,
                                  FlashSimtTraits<Element, kHeadDim>::kMinBlocksPerSm)
    flash_simt_kernel(const __grid_constant__ AttentionParams p) {
  using Traits = FlashSimtTraits<Element, kHeadDim>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRows = Traits::kRowsPerThread;
  constexpr int kKeys = Traits::kKeysPerThread;
  constexpr int kDimGroups = Traits::kDimGroups;
  constexpr int kRowStride = Traits::kRowStride;
  constexpr int kProbStride = Traits::kProbStride;
  constexpr int kColGroups = Traits::kColGroups;
  constexpr int kRowGroups = Traits::kRowGroups;

  extern __shared__ float4 smem[];  // float4: the tiles are read as 16-byte vectors
  float* q_tile = reinterpret_cast<float*>(smem);       // [kBlockM][kRowStride], pre-scaled Q
  float* kv_tile = q_tile + Traits::kQTileFloats;       // [kBlockN][kRowStride], K then V
  float* prob_tile = kv_tile + Traits::kKvTileFloats;   // [kBlockM][kProbStride], P

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int ty = lane / kColGroups;  // row group in the warp
  const int tx = lane % kColGroups;  // column group: low lane bits, so row reductions are xor 1, 2, 4
  // This thread's rows in the block are row_base + kRowGroups * i.
  const int row_base = warp * Traits::kRowsPerWarp + ty;

  // Heaviest causal blocks (the last query rows) are launched first so the
  // tail of the grid is short ones.
  const int64_t num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t bh = blockIdx.x / num_m_blocks;
  const int64_t m0 = (num_m_blocks - 1 - blockIdx.x % num_m_blocks) * kBlockM;
  const int64_t batch = bh / p.heads;
  const int64_t head = bh % p.heads;
  const int64_t head_kv = head / (p.heads / p.heads_kv);

  const Element* q = static_cast<const Element*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Element* k = static_cast<const Element*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Element* v = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Element* out = static_cast<Element*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;

  constexpr int kVecBytes = 16;
  const bool q_vectorized = simt_detail::rows_aligned(q, p.q_row_stride, kVecBytes);
  const bool k_vectorized = simt_detail::rows_aligned(k, p.k_row_stride, kVecBytes);
  const bool v_vectorized = simt_detail::rows_aligned(v, p.v_row_stride, kVecBytes);
  const bool o_vectorized =
      simt_detail::rows_aligned(out, p.o_row_stride, 4 * static_cast<int>(sizeof(Element)));

  // Q tile, scaled so that scores come out in the log2 domain.
  const float scale_log2 = static_cast<float>(p.softmax_scale) * kLog2e;
  {
    const Element* q_rows = q + m0 * p.q_row_stride;
    const int64_t rows_left = p.seqlen_q - m0;
#pragma unroll 4
    for (int s = 0; s < Traits::kQChunks; ++s) {
      const int chunk = tid + s * Traits::kThreads;
      const int row = chunk / Traits::kChunksPerRow;
      const int col = (chunk % Traits::kChunksPerRow) * Traits::kVec;
      float vals[Traits::kVec];
      if (row < rows_left) {
        simt_detail::load_chunk<Element, Traits::kVec>(q_rows + row * p.q_row_stride + col, q_vectorized, vals);
      } else {
#pragma unroll
        for (int e = 0; e < Traits::kVec; ++e) vals[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < Traits::kVec; e += 4) {
        *reinterpret_cast<float4*>(&q_tile[row * kRowStride + col + e]) =
            make_float4(vals[e] * scale_log2, vals[e + 1] * scale_log2, vals[e + 2] * scale_log2,
                        vals[e + 3] * scale_log2);
      }
    }
  }

  // Key range: under the bottom-right causal mask the last valid row of the block sees the
  // most keys; tiles past those are skipped, not masked.
  const int64_t causal_offset = p.seqlen_k - p.seqlen_q;
  const int64_t m_end = min(m0 + kBlockM, p.seqlen_q);
  const int64_t n_end = p.is_causal ? causal_keys_visible(m_end - 1, p) : p.seqlen_k;
  const int64_t num_n_tiles = (n_end + kBlockN - 1) / kBlockN;

  float row_max[kRows];  // running max of the log2-domain scores, shared by the row's 8 lanes
  float row_sum[kRows];  // this lane's partial sum of exp2(score - row_max); reduced at the end
  float acc_o[kRows][kDimGroups][4];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimGroups; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[i][c][e] = 0.0f;
    }
  }

  float staged[Traits::kStageChunks][Traits::kVec];
  if (num_n_tiles > 0) simt_detail::fetch_kv_tile<Traits>(staged, k, p.k_row_stride, p.seqlen_k, k_vectorized, tid);

  for (int64_t tile = 0; tile < num_n_tiles; ++tile) {
    const int64_t n0 = tile * kBlockN;
    const int64_t keys_left = p.seqlen_k - n0;

    __syncthreads();  // the previous tile's P V is done with kv_tile
    simt_detail::store_kv_tile<Traits>(kv_tile, staged, tid);
    __syncthreads();  // K (and, the first time, Q) visible to every warp

    // V of this tile travels from global memory while S is computed.
    simt_detail::fetch_kv_tile<Traits>(staged, v + n0 * p.v_row_stride, p.v_row_stride, keys_left, v_vectorized,
                                       tid);

    // scores = (scaled Q) K^T for rows row_base + 4i and keys tx + 8j.
    float scores[kRows][kKeys];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kKeys; ++j) scores[i][j] = 0.0f;
    }
#pragma unroll Traits::kUnrollQK
    for (int d = 0; d < kHeadDim; d += 4) {
      float4 q_frag[kRows];
      float4 k_frag[kKeys];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        q_frag[i] = *reinterpret_cast<const float4*>(&q_tile[(row_base + kRowGroups * i) * kRowStride + d]);
      }
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        k_frag[j] = *reinterpret_cast<const float4*>(&kv_tile[(tx + kColGroups * j) * kRowStride + d]);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          scores[i][j] = fmaf(q_frag[i].x, k_frag[j].x, scores[i][j]);
          scores[i][j] = fmaf(q_frag[i].y, k_frag[j].y, scores[i][j]);
          scores[i][j] = fmaf(q_frag[i].z, k_frag[j].z, scores[i][j]);
          scores[i][j] = fmaf(q_frag[i].w, k_frag[j].w, scores[i][j]);
        }
      }
    }

    // Only the tail tile and the tiles crossing the causal diagonal mask;
    // the test is uniform over the block.
    const bool needs_mask =
        n0 + kBlockN > p.seqlen_k || (p.is_causal && n0 + kBlockN - 1 > m0 + causal_offset);
    if (needs_mask) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int64_t row = m0 + row_base + kRowGroups * i;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          const int64_t key = n0 + tx + kColGroups * j;
          if (key >= p.seqlen_k || (p.is_causal && key > row + causal_offset)) scores[i][j] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max, rescale what was accumulated so far,
    // scores become probabilities exp2(score - row_max).
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float tile_max = scores[i][0];
#pragma unroll
      for (int j = 1; j < kKeys; ++j) tile_max = fmaxf(tile_max, scores[i][j]);
#pragma unroll
      for (int offset = 1; offset < kColGroups; offset *= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarpMask, tile_max, offset));
      }
      const float new_max = fmaxf(row_max[i], tile_max);
      // A row that has seen no key yet keeps max -inf; subtracting 0 instead
      // keeps exp2 at exactly 0 rather than exp2(-inf + inf) = NaN.
      const float ref_max = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = exp2f(row_max[i] - ref_max);
      row_max[i] = new_max;
      row_sum[i] *= correction;
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        scores[i][j] = exp2f(scores[i][j] - ref_max);
        row_sum[i] += scores[i][j];
      }
#pragma unroll
      for (int c = 0; c < kDimGroups; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[i][c][e] *= correction;
      }
    }

    __syncthreads();  // every warp is done reading K from kv_tile
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        prob_tile[(row_base + kRowGroups * i) * kProbStride + tx + kColGroups * j] = scores[i][j];
      }
    }
    simt_detail::store_kv_tile<Traits>(kv_tile, staged, tid);
    __syncthreads();  // P and V visible

    // The next K tile travels while P V is computed.
    if (tile + 1 < num_n_tiles) {
      simt_detail::fetch_kv_tile<Traits>(staged, k + (n0 + kBlockN) * p.k_row_stride, p.k_row_stride,
                                         keys_left - kBlockN, k_vectorized, tid);
    }

    // acc_o += P V for rows row_base + 4i and dims 4 tx + 32 c + e.
#pragma unroll Traits::kUnrollPV
    for (int n = 0; n < kBlockN; n += 4) {
      float4 prob_frag[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        prob_frag[i] = *reinterpret_cast<const float4*>(&prob_tile[(row_base + kRowGroups * i) * kProbStride + n]);
      }
#pragma unroll
      for (int key = 0; key < 4; ++key) {
#pragma unroll
        for (int c = 0; c < kDimGroups; ++c) {
          const float4 v_frag =
              *reinterpret_cast<const float4*>(&kv_tile[(n + key) * kRowStride + 4 * (tx + kColGroups * c)]);
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
            const float prob = simt_detail::component(prob_frag[i], key);
            acc_o[i][c][0] = fmaf(prob, v_frag.x, acc_o[i][c][0]);
            acc_o[i][c][1] = fmaf(prob, v_frag.y, acc_o[i][c][1]);
            acc_o[i][c][2] = fmaf(prob, v_frag.z, acc_o[i][c][2]);
            acc_o[i][c][3] = fmaf(prob, v_frag.w, acc_o[i][c][3]);
          }
        }
      }
    }
  }

  // Epilogue: O = acc_o / row_sum, LSE = ln(2) * (row_max + log2(row_sum)).
  // A row that saw no key has row_sum 0 and acc_o 0: zeros and LSE = -inf.
  // A NaN (or +inf) score makes row_sum NaN: the tests are `== 0`, not `> 0`,
  // so that NaN reaches O and the LSE instead of reading as "no key".
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float sum = row_sum[i];
#pragma unroll
    for (int offset = 1; offset < kColGroups; offset *= 2) sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
    const int64_t row = m0 + row_base + kRowGroups * i;
    if (row >= p.seqlen_q) continue;
    const float inv_sum = sum == 0.0f ? 0.0f : 1.0f / sum;
    Element* out_row = out + row * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < kDimGroups; ++c) {
      const float vals[4] = {acc_o[i][c][0] * inv_sum, acc_o[i][c][1] * inv_sum, acc_o[i][c][2] * inv_sum,
                             acc_o[i][c][3] * inv_sum};
      simt_detail::store_quad(out_row + 4 * (tx + kColGroups * c), vals, o_vectorized);
    }
    if (p.lse != nullptr && tx == 0) {
      p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + row] =
          sum == 0.0f ? -INFINITY : (row_max[i] + log2f(sum)) * kLn2;
    }
  }
}

/// \brief Refuses params whose grid (batch * heads * ceil(seqlen_q / block_m) blocks, all in
/// x) would pass 2^31 - 1 blocks, stating the limit. Checked by simt_can_implement too, so
/// resolve_backend and "auto" see it before a launch.
inline Status flash_simt_grid_check(const AttentionParams& p, int64_t block_m) {
  constexpr int64_t kMaxGridX = 2147483647;
  const int64_t num_m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  const int64_t bh = p.batch * p.heads;
  // Compared by division: the product itself could pass 2^63 for stride-0 (broadcast) inputs.
  if (num_m_blocks > 0 && bh > kMaxGridX / num_m_blocks) {
    return Status::NotSupported("backend 'simt' launches batch * heads * ceil(seqlen_q / " + std::to_string(block_m) +
                                ") blocks in grid x, at most " + std::to_string(kMaxGridX) + "; got batch * heads " +
                                std::to_string(bh) + " and seqlen_q " + std::to_string(p.seqlen_q));
  }
  return Status::Ok();
}

/// \brief Launches flash_simt_kernel on `stream`; the device must already be current and the
/// problem non-empty (batch, heads, seqlen_q > 0), as attention_forward guarantees.
/// Returns NotSupported when the tile does not fit the device's shared memory
/// or the grid would pass 2^31 - 1 blocks, CudaError on a launch failure.
template <typename Element, int kHeadDim>
Status launch_flash_simt(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashSimtTraits<Element, kHeadDim>;
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  if (Traits::kSmemBytes > smem_optin) {
    return Status::NotSupported("backend 'simt' needs " + std::to_string(Traits::kSmemBytes) +
                                " bytes of shared memory per block at head_dim " + std::to_string(kHeadDim) +
                                "; device " + std::to_string(p.device_id) + " allows " +
                                std::to_string(smem_optin));
  }

  if (Status s = flash_simt_grid_check(p, Traits::kBlockM); !s.ok()) return s;
  const int64_t num_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * p.batch * p.heads;

  const auto kernel = flash_simt_kernel<Element, kHeadDim>;
  // Above 48 KB, dynamic shared memory must be opted into per kernel.
  if (Traits::kSmemBytes > kSharedMemoryWithoutOptIn) {
    WAVEBOOST_CUDA_RETURN(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  }
  kernel<<<static_cast<unsigned int>(num_blocks), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cuda_status(cudaGetLastError(), "flash_simt_kernel launch");
}

}  // namespace waveboost::cuda
