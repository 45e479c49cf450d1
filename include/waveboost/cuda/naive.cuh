// Naive CUDA attention (backend "naive"): the GPU baseline, written to be read.
// Three kernels over a float32 workspace of batch * heads * seqlen_q * seqlen_k:
//   1. scores = softmax_scale * Q K^T  (causally hidden keys: -inf)
//   2. probs  = softmax(scores) per row, in place, and LSE
//   3. O      = probs V
// Products use 16 x 16 shared-memory tiles; every grid strides over a flat
// 64-bit tile index in gridDim.x, so no size meets the 65535 limit of y/z.
#pragma once

#include <algorithm>
#include <cstdint>

#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

namespace naive_detail {

constexpr int kTile = 16;          // tile edge of both products; blocks are kTile x kTile threads
constexpr int kSoftmaxWarps = 8;   // rows (one per warp) per softmax block
constexpr int64_t kMaxGridX = 2147483647;

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// max that propagates NaN from either side. fmaxf drops NaN, so a row of NaN
// scores would look like a row with no visible key (zeros, LSE -inf): a
// plausible wrong answer where the input was NaN.
__device__ __forceinline__ float max_keep_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// Which (batch, head) a flat batch * heads index is, and its kv head (GQA).
struct HeadIndex {
  int64_t batch, head, head_kv;
};
__device__ inline HeadIndex head_index(int64_t bh, const AttentionParams& p) {
  const int64_t head = bh % p.heads;
  return {bh / p.heads, head, head / (p.heads / p.heads_kv)};
}

}  // namespace naive_detail

/// \brief scores[bh][i][j] = softmax_scale * q_i . k_j, or -inf where the causal mask hides key j.
/// One block per 16 x 16 tile of (query i, key j); threadIdx.y = query, threadIdx.x = key.
template <typename Element>
__global__ void naive_scores_kernel(const __grid_constant__ AttentionParams p, float* scores) {
  using namespace naive_detail;
  __shared__ float q_tile[kTile][kTile + 1];  // [query][dim]; +1 column: no bank conflicts on k_tile[tx][d]
  __shared__ float k_tile[kTile][kTile + 1];  // [key][dim]

  const Element* q = static_cast<const Element*>(p.q);
  const Element* k = static_cast<const Element*>(p.k);
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int64_t q_tiles = ceil_div(p.seqlen_q, kTile);
  const int64_t k_tiles = ceil_div(p.seqlen_k, kTile);
  const int64_t num_tiles = p.batch * p.heads * q_tiles * k_tiles;
  const int64_t causal_offset = p.seqlen_k - p.seqlen_q;
  const float scale = static_cast<float>(p.softmax_scale);

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t i0 = (tile / k_tiles % q_tiles) * kTile;
    const int64_t j0 = (tile % k_tiles) * kTile;
    const int64_t bh = tile / k_tiles / q_tiles;
    const naive_detail::HeadIndex idx = head_index(bh, p);
    const int64_t i = i0 + ty;
    const int64_t j = j0 + tx;

    // A tile entirely above the causal diagonal only needs its -inf written.
    const bool tile_hidden = p.is_causal && j0 > i0 + kTile - 1 + causal_offset;
    float dot = 0.0f;
    if (!tile_hidden) {
      for (int64_t d0 = 0; d0 < p.head_dim; d0 += kTile) {
        const int64_t d = d0 + tx;
        const int64_t key_row = j0 + ty;  // k_tile is loaded key-major by the same threads
        q_tile[ty][tx] = (i < p.seqlen_q && d < p.head_dim)
                             ? to_float(q[idx.batch * p.q_batch_stride + i * p.q_row_stride +
                                          idx.head * p.q_head_stride + d])
                             : 0.0f;
        k_tile[ty][tx] = (key_row < p.seqlen_k && d < p.head_dim)
                             ? to_float(k[idx.batch * p.k_batch_stride + key_row * p.k_row_stride +
                                          idx.head_kv * p.k_head_stride + d])
                             : 0.0f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < kTile; ++t) dot = fmaf(q_tile[ty][t], k_tile[tx][t], dot);
        __syncthreads();  // before the next slice overwrites the tiles
      }
    }
    if (i < p.seqlen_q && j < p.seqlen_k) {
      const bool hidden = p.is_causal && j > i + causal_offset;
      scores[(bh * p.seqlen_q + i) * p.seqlen_k + j] = hidden ? -INFINITY : dot * scale;
    }
  }
}

/// \brief Row softmax of the scores in place (they become probs) and the row's
/// natural-log LSE. One warp per row. A row with no visible key (all -inf, or
/// seqlen_k == 0) gets probs 0 and LSE -inf; a row with a NaN score gets NaN
/// probs and LSE NaN (the max propagates NaN).
static __global__ void naive_softmax_kernel(const __grid_constant__ AttentionParams p, float* scores) {
  using namespace naive_detail;
  const int lane = threadIdx.x % 32;
  const int64_t num_rows = p.batch * p.heads * p.seqlen_q;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kSoftmaxWarps + threadIdx.x / 32;

  for (int64_t row = first_row; row < num_rows; row += static_cast<int64_t>(gridDim.x) * kSoftmaxWarps) {
    float* row_scores = scores + row * p.seqlen_k;

    float row_max = -INFINITY;
    for (int64_t j = lane; j < p.seqlen_k; j += 32) row_max = max_keep_nan(row_max, row_scores[j]);
    for (int offset = 16; offset > 0; offset /= 2) {
      row_max = max_keep_nan(row_max, __shfl_xor_sync(kFullWarpMask, row_max, offset));
    }

    // Only a row whose every score is -inf is empty. Otherwise row_sum >= 1
    // (its max term is exp(0)), or NaN when a score is NaN (or +inf): that NaN
    // must reach the probs and the LSE, never be read as "no key".
    const bool empty = row_max == -INFINITY;
    float row_sum = 0.0f;
    if (!empty) {
      for (int64_t j = lane; j < p.seqlen_k; j += 32) row_sum += expf(row_scores[j] - row_max);
      for (int offset = 16; offset > 0; offset /= 2) row_sum += __shfl_xor_sync(kFullWarpMask, row_sum, offset);
    }

    const float inv_sum = empty ? 0.0f : 1.0f / row_sum;
    for (int64_t j = lane; j < p.seqlen_k; j += 32) {
      row_scores[j] = empty ? 0.0f : expf(row_scores[j] - row_max) * inv_sum;
    }

    if (p.lse != nullptr && lane == 0) {
      const int64_t bh = row / p.seqlen_q;
      const int64_t i = row % p.seqlen_q;
      p.lse[bh / p.heads * p.lse_batch_stride + bh % p.heads * p.lse_head_stride + i] =
          empty ? -INFINITY : row_max + logf(row_sum);
    }
  }
}

/// \brief out[b, i, h, d] = sum_j probs[bh][i][j] * v[b, j, h_kv, d].
/// One block per 16 x 16 tile of (query i, head dim d); threadIdx.y = query, threadIdx.x = dim.
template <typename Element>
__global__ void naive_pv_kernel(const __grid_constant__ AttentionParams p, const float* probs) {
  using namespace naive_detail;
  __shared__ float p_tile[kTile][kTile];      // [query][key]
  __shared__ float v_tile[kTile][kTile + 1];  // [key][dim]

  const Element* v = static_cast<const Element*>(p.v);
  Element* out = static_cast<Element*>(p.out);
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int64_t q_tiles = ceil_div(p.seqlen_q, kTile);
  const int64_t d_tiles = ceil_div(p.head_dim, kTile);
  const int64_t num_tiles = p.batch * p.heads * q_tiles * d_tiles;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t i0 = (tile / d_tiles % q_tiles) * kTile;
    const int64_t d0 = (tile % d_tiles) * kTile;
    const int64_t bh = tile / d_tiles / q_tiles;
    const naive_detail::HeadIndex idx = head_index(bh, p);
    const int64_t i = i0 + ty;
    const int64_t d = d0 + tx;

    // Keys past the last one the tile's last query sees have probs 0: skip them.
    int64_t key_end = p.seqlen_k;
    if (p.is_causal) key_end = causal_keys_visible(i0 + kTile - 1, p);

    float acc = 0.0f;
    for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
      const int64_t j = j0 + tx;          // p_tile column this thread loads
      const int64_t key_row = j0 + ty;    // v_tile row this thread loads
      p_tile[ty][tx] = (i < p.seqlen_q && j < p.seqlen_k) ? probs[(bh * p.seqlen_q + i) * p.seqlen_k + j] : 0.0f;
      v_tile[ty][tx] = (key_row < p.seqlen_k && d < p.head_dim)
                           ? to_float(v[idx.batch * p.v_batch_stride + key_row * p.v_row_stride +
                                        idx.head_kv * p.v_head_stride + d])
                           : 0.0f;
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kTile; ++t) acc = fmaf(p_tile[ty][t], v_tile[t][tx], acc);
      __syncthreads();  // before the next keys overwrite the tiles
    }
    if (i < p.seqlen_q && d < p.head_dim) {
      out[idx.batch * p.o_batch_stride + i * p.o_row_stride + idx.head * p.o_head_stride + d] =
          from_float<Element>(acc);
    }
  }
}

/// \brief Launches the three naive kernels on `stream` over `workspace`
/// (batch * heads * seqlen_q * seqlen_k floats; may be null when that is 0).
template <typename Element>
Status run_naive_attention(const AttentionParams& p, float* workspace, cudaStream_t stream) {
  using namespace naive_detail;
  const dim3 tile_threads(kTile, kTile);
  const int64_t bh = p.batch * p.heads;
  const int64_t q_tiles = ceil_div(p.seqlen_q, kTile);

  const int64_t score_tiles = bh * q_tiles * ceil_div(p.seqlen_k, kTile);
  if (score_tiles > 0) {
    naive_scores_kernel<Element>
        <<<static_cast<unsigned int>(std::min(score_tiles, kMaxGridX)), tile_threads, 0, stream>>>(p, workspace);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }

  const int64_t softmax_blocks = ceil_div(bh * p.seqlen_q, kSoftmaxWarps);
  naive_softmax_kernel<<<static_cast<unsigned int>(std::min(softmax_blocks, kMaxGridX)), kSoftmaxWarps * 32, 0,
                         stream>>>(p, workspace);
  WAVEBOOST_CUDA_RETURN(cudaGetLastError());

  const int64_t pv_tiles = bh * q_tiles * ceil_div(p.head_dim, kTile);
  naive_pv_kernel<Element>
      <<<static_cast<unsigned int>(std::min(pv_tiles, kMaxGridX)), tile_threads, 0, stream>>>(p, workspace);
  WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace waveboost::cuda
