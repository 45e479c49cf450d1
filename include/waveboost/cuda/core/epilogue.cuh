// The epilogue of the tensor-core flash paths: O / l written as the output element type
// through shared memory (16 B row-contiguous global stores), the LSE, or, for one piece of a
// split-KV row, fp32 O / l and the piece's LSE for the merge. Layout-generic over
// core/fragments.cuh; the caller supplies its own shared-memory addressing.
#pragma once

#include <cstdint>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/sequence.cuh"

namespace waveboost::cuda {

/// \brief LSE of this thread's rows (query rows row0 + 8 r) from a finalized OnlineSoftmax,
/// written by the first thread of each quad, for rows of the sequence, when p.lse is wanted.
template <typename Softmax>
__device__ __forceinline__ void write_lse(const AttentionParams& p, const FlashBlock& blk, int64_t row0,
                                          const Softmax& softmax, int t) {
#pragma unroll
  for (int r = 0; r < Softmax::kRows; ++r) {
    const int64_t row = row0 + 8 * r;
    if (p.lse != nullptr && t == 0 && row < blk.seqlen_q) *blk.lse_at(p, row) = softmax.lse(r);
  }
}

/// \brief Writes O * inv_sum, packed to Element, into the warp's staging rows in shared
/// memory: word_at(row, dt) is the first 4 B word of the 16 B chunk holding columns
/// 8 dt .. 8 dt + 7 of staging row `row` (this thread's rows are 8 r + g); the quad fills
/// the chunk's four words.
template <typename OFragments, typename Element, typename WordAt>
__device__ __forceinline__ void stage_output(const typename OFragments::Array& o, const float (&inv_sum)[OFragments::kRows],
                                             int g, int t, WordAt word_at) {
#pragma unroll
  for (int r = 0; r < OFragments::kRows; ++r) {
#pragma unroll
    for (int dt = 0; dt < OFragments::kNTiles; ++dt) {
      word_at(8 * r + g, dt)[t] = pack_pair<Element>(OFragments::at(o, r, dt, 0) * inv_sum[r],
                                                      OFragments::at(o, r, dt, 1) * inv_sum[r]);
    }
  }
}

/// \brief Copies kRows staged rows of kChunksPerRow 16 B chunks to global memory, one warp,
/// rows `row_stride` elements apart from `out`; rows >= valid_rows are not written.
/// chunk_at(row, chunk) is the staged chunk's address in shared memory.
template <int kRows, int kChunksPerRow, typename Element, typename ChunkAt>
__device__ __forceinline__ void store_staged_rows(Element* out, int64_t row_stride, int64_t valid_rows, int lane,
                                                  ChunkAt chunk_at) {
  constexpr int kChunk = 16 / int(sizeof(Element));
  static_assert(kRows * kChunksPerRow % 32 == 0, "whole warps of chunks");
#pragma unroll
  for (int i = 0; i < kRows * kChunksPerRow / 32; ++i) {
    const int row = (i * 32 + lane) / kChunksPerRow;
    const int chunk = (i * 32 + lane) % kChunksPerRow;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(out + row * row_stride + chunk * kChunk) =
          *reinterpret_cast<const uint4*>(chunk_at(row, chunk));
    }
  }
}

/// \brief One piece of a split-KV row (SplitKV): O / l in fp32 and the piece's LSE, for rows
/// row0 + 8 r of the sequence, into the split's workspace at piece `split_index`.
template <typename OFragments, int kHeadDim, typename Softmax>
__device__ __forceinline__ void write_split_piece(const AttentionParams& p, const FlashBlock& blk, const SplitKV& split,
                                                  int split_index, int64_t row0,
                                                  const typename OFragments::Array& o,
                                                  const float (&inv_sum)[OFragments::kRows], const Softmax& softmax,
                                                  int t) {
  const int64_t piece = ((static_cast<int64_t>(split_index) * p.batch + blk.b) * p.heads + blk.h) * p.seqlen_q;
#pragma unroll
  for (int r = 0; r < OFragments::kRows; ++r) {
    const int64_t row = row0 + 8 * r;
    if (row >= blk.seqlen_q) continue;
    if (t == 0) split.lse_accum[piece + row] = softmax.lse(r);
    float* o_row = split.o_accum + (piece + row) * kHeadDim;
#pragma unroll
    for (int dt = 0; dt < OFragments::kNTiles; ++dt) {
      *reinterpret_cast<float2*>(o_row + 8 * dt + 2 * t) =
          make_float2(OFragments::at(o, r, dt, 0) * inv_sum[r], OFragments::at(o, r, dt, 1) * inv_sum[r]);
    }
  }
}

}  // namespace waveboost::cuda
