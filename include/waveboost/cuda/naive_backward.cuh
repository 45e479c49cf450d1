// Naive CUDA attention backward (backend "naive"): the GPU reference for the gradients,
// written to be read. With s = softmax_scale * q.k, P = softmax(s) = exp(s - lse) and
// D_i = rowsum(dO_i * O_i) - dlse_i:
//   1. D                                         one warp per query row
//   2. P[i][j] = exp(s_ij - lse_i), dS[i][j] = P (dO_i . v_j - D_i)   (hidden keys: 0)
//   3. dQ = scale * dS K
//   4. dK = scale * dS^T Q,  dV = P^T dO         summed over the query heads of a kv head
// P and dS are materialized in a float32 workspace of 2 * batch * heads * seqlen_q * seqlen_k
// floats (plus batch * heads * seqlen_q for D). Every output element is written by exactly one
// thread, which sums in a fixed order: the result is the same bit for bit on every run.
// Products use 16 x 16 shared-memory tiles, and every grid strides over a flat 64-bit tile
// index in gridDim.x, as the naive forward does (naive.cuh).
#pragma once

#include <algorithm>
#include <cstdint>

#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

namespace naive_bwd {

constexpr int kTile = 16;  // tile edge of the products; blocks are kTile x kTile threads
constexpr int64_t kMaxGridX = 2147483647;
constexpr int kRowWarps = 8;  // query rows (one per warp) per block of the D kernel

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Floats of the workspace: P, dS (batch * heads * seqlen_q * seqlen_k each), then D.
inline int64_t workspace_floats(const AttentionBackwardParams& p) {
  return 2 * p.batch * p.heads * p.seqlen_q * p.seqlen_k + p.batch * p.heads * p.seqlen_q;
}

/// \brief d[bh * seqlen_q + i] = sum_d dout[b, i, h, d] * out[b, i, h, d] - dlse[b, h, i].
template <typename Element>
__global__ void row_dot_kernel(const __grid_constant__ AttentionBackwardParams p, float* d_rows) {
  const int lane = threadIdx.x % 32;
  const Element* o = static_cast<const Element*>(p.out);
  const Element* dout = static_cast<const Element*>(p.dout);
  const int64_t num_rows = p.batch * p.heads * p.seqlen_q;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; row < num_rows;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const int64_t i = row % p.seqlen_q;
    const int64_t bh = row / p.seqlen_q;
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const Element* o_row = o + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    const Element* do_row = dout + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
    float acc = 0.f;
    for (int64_t d = lane; d < p.head_dim; d += 32) acc = fmaf(to_float(do_row[d]), to_float(o_row[d]), acc);
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) {
      const float dlse = p.dlse != nullptr ? p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + i] : 0.f;
      d_rows[row] = acc - dlse;
    }
  }
}

/// \brief probs[bh][i][j] = P and dscores[bh][i][j] = dS (the gradient of the scaled score).
/// One block per 16 x 16 tile of (query i, key j); threadIdx.y = query, threadIdx.x = key.
/// A hidden key, or a row whose lse is -inf (it saw no key), has P = dS = 0.
template <typename Element>
__global__ void probs_kernel(const __grid_constant__ AttentionBackwardParams p, const float* d_rows, float* probs,
                             float* dscores) {
  __shared__ float q_tile[kTile][kTile + 1];   // [query][dim]
  __shared__ float k_tile[kTile][kTile + 1];   // [key][dim]
  __shared__ float do_tile[kTile][kTile + 1];  // [query][dim]
  __shared__ float v_tile[kTile][kTile + 1];   // [key][dim]

  const Element* q = static_cast<const Element*>(p.q);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
  const Element* dout = static_cast<const Element*>(p.dout);
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
    const int64_t b = bh / p.heads, h = bh % p.heads, h_kv = h / (p.heads / p.heads_kv);
    const int64_t i = i0 + ty;
    const int64_t j = j0 + tx;
    const int64_t key_row = j0 + ty;  // k and v tiles are loaded key-major by the same threads

    const bool tile_hidden = p.is_causal && j0 > i0 + kTile - 1 + causal_offset;
    float s = 0.f, dp = 0.f;
    if (!tile_hidden) {
      for (int64_t d0 = 0; d0 < p.head_dim; d0 += kTile) {
        const int64_t d = d0 + tx;
        const bool q_ok = i < p.seqlen_q && d < p.head_dim;
        const bool k_ok = key_row < p.seqlen_k && d < p.head_dim;
        q_tile[ty][tx] = q_ok ? to_float(q[b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride + d]) : 0.f;
        do_tile[ty][tx] =
            q_ok ? to_float(dout[b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride + d]) : 0.f;
        k_tile[ty][tx] =
            k_ok ? to_float(k[b * p.k_batch_stride + key_row * p.k_row_stride + h_kv * p.k_head_stride + d]) : 0.f;
        v_tile[ty][tx] =
            k_ok ? to_float(v[b * p.v_batch_stride + key_row * p.v_row_stride + h_kv * p.v_head_stride + d]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < kTile; ++t) {
          s = fmaf(q_tile[ty][t], k_tile[tx][t], s);
          dp = fmaf(do_tile[ty][t], v_tile[tx][t], dp);
        }
        __syncthreads();  // before the next slice overwrites the tiles
      }
    }
    if (i < p.seqlen_q && j < p.seqlen_k) {
      const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i];
      const bool hidden = (p.is_causal && j > i + causal_offset) || lse == -INFINITY;
      const float prob = hidden ? 0.f : expf(s * scale - lse);
      const int64_t at = (bh * p.seqlen_q + i) * p.seqlen_k + j;
      probs[at] = prob;
      dscores[at] = hidden ? 0.f : prob * (dp - d_rows[bh * p.seqlen_q + i]);
    }
  }
}

/// \brief dq[b, i, h, d] = scale * sum_j dscores[bh][i][j] * k[b, j, h_kv, d].
/// One block per 16 x 16 tile of (query i, dim d).
template <typename Element>
__global__ void dq_kernel(const __grid_constant__ AttentionBackwardParams p, const float* dscores) {
  __shared__ float ds_tile[kTile][kTile];     // [query][key]
  __shared__ float k_tile[kTile][kTile + 1];  // [key][dim]

  const Element* k = static_cast<const Element*>(p.k);
  Element* dq = static_cast<Element*>(p.dq);
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int64_t q_tiles = ceil_div(p.seqlen_q, kTile);
  const int64_t d_tiles = ceil_div(p.head_dim, kTile);
  const int64_t num_tiles = p.batch * p.heads * q_tiles * d_tiles;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t i0 = (tile / d_tiles % q_tiles) * kTile;
    const int64_t d0 = (tile % d_tiles) * kTile;
    const int64_t bh = tile / d_tiles / q_tiles;
    const int64_t b = bh / p.heads, h = bh % p.heads, h_kv = h / (p.heads / p.heads_kv);
    const int64_t i = i0 + ty;
    const int64_t d = d0 + tx;

    float acc = 0.f;
    for (int64_t j0 = 0; j0 < p.seqlen_k; j0 += kTile) {
      const int64_t j = j0 + tx;
      const int64_t key_row = j0 + ty;
      ds_tile[ty][tx] = (i < p.seqlen_q && j < p.seqlen_k) ? dscores[(bh * p.seqlen_q + i) * p.seqlen_k + j] : 0.f;
      k_tile[ty][tx] = (key_row < p.seqlen_k && d < p.head_dim)
                           ? to_float(k[b * p.k_batch_stride + key_row * p.k_row_stride + h_kv * p.k_head_stride + d])
                           : 0.f;
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kTile; ++t) acc = fmaf(ds_tile[ty][t], k_tile[t][tx], acc);
      __syncthreads();
    }
    if (i < p.seqlen_q && d < p.head_dim) {
      dq[b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride + d] =
          from_float<Element>(acc * static_cast<float>(p.softmax_scale));
    }
  }
}

/// \brief dk[b, j, hk, d] = scale * sum_{h of hk} sum_i dscores[b,h][i][j] * q[b, i, h, d] and
/// dv[b, j, hk, d] = sum_{h of hk} sum_i probs[b,h][i][j] * dout[b, i, h, d].
/// One block per 16 x 16 tile of (key j, dim d) of one (batch, kv head).
template <typename Element>
__global__ void dkv_kernel(const __grid_constant__ AttentionBackwardParams p, const float* probs,
                           const float* dscores) {
  __shared__ float p_tile[kTile][kTile + 1];   // [query][key]
  __shared__ float ds_tile[kTile][kTile + 1];  // [query][key]
  __shared__ float q_tile[kTile][kTile + 1];   // [query][dim]
  __shared__ float do_tile[kTile][kTile + 1];  // [query][dim]

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);
  Element* dk = static_cast<Element*>(p.dk);
  Element* dv = static_cast<Element*>(p.dv);
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int64_t group = p.heads / p.heads_kv;
  const int64_t k_tiles = ceil_div(p.seqlen_k, kTile);
  const int64_t d_tiles = ceil_div(p.head_dim, kTile);
  const int64_t num_tiles = p.batch * p.heads_kv * k_tiles * d_tiles;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t j0 = (tile / d_tiles % k_tiles) * kTile;
    const int64_t d0 = (tile % d_tiles) * kTile;
    const int64_t bhk = tile / d_tiles / k_tiles;
    const int64_t b = bhk / p.heads_kv, h_kv = bhk % p.heads_kv;
    const int64_t j = j0 + ty;  // this thread's output: key j, dim d
    const int64_t d = d0 + tx;

    float acc_k = 0.f, acc_v = 0.f;
    for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += kTile) {
        const int64_t i = i0 + ty;  // loads: query row i, key column j0 + tx, dim column d
        const int64_t jl = j0 + tx;
        const bool s_ok = i < p.seqlen_q && jl < p.seqlen_k;
        const int64_t at = (bh * p.seqlen_q + i) * p.seqlen_k + jl;
        p_tile[ty][tx] = s_ok ? probs[at] : 0.f;
        ds_tile[ty][tx] = s_ok ? dscores[at] : 0.f;
        const bool x_ok = i < p.seqlen_q && d < p.head_dim;
        q_tile[ty][tx] = x_ok ? to_float(q[b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride + d]) : 0.f;
        do_tile[ty][tx] =
            x_ok ? to_float(dout[b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride + d]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < kTile; ++t) {
          acc_k = fmaf(ds_tile[t][ty], q_tile[t][tx], acc_k);
          acc_v = fmaf(p_tile[t][ty], do_tile[t][tx], acc_v);
        }
        __syncthreads();
      }
    }
    if (j < p.seqlen_k && d < p.head_dim) {
      dk[b * p.dk_batch_stride + j * p.dk_row_stride + h_kv * p.dk_head_stride + d] =
          from_float<Element>(acc_k * static_cast<float>(p.softmax_scale));
      dv[b * p.dv_batch_stride + j * p.dv_row_stride + h_kv * p.dv_head_stride + d] = from_float<Element>(acc_v);
    }
  }
}

}  // namespace naive_bwd

/// \brief Launches the naive backward on `stream` over `workspace` (workspace_floats(p) floats;
/// may be null when that is 0). params.device_id must be current.
template <typename Element>
Status run_naive_attention_backward(const AttentionBackwardParams& p, float* workspace, cudaStream_t stream) {
  using namespace naive_bwd;
  const dim3 tile_threads(kTile, kTile);
  const int64_t bh = p.batch * p.heads;
  const int64_t scores = bh * p.seqlen_q * p.seqlen_k;
  float* probs = workspace;
  float* dscores = workspace + scores;
  float* d_rows = workspace + 2 * scores;
  const auto grid = [](int64_t tiles) { return static_cast<unsigned int>(std::min(tiles, kMaxGridX)); };

  const int64_t row_blocks = ceil_div(bh * p.seqlen_q, kRowWarps);
  if (row_blocks > 0) {
    row_dot_kernel<Element><<<grid(row_blocks), kRowWarps * 32, 0, stream>>>(p, d_rows);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  const int64_t q_tiles = ceil_div(p.seqlen_q, kTile);
  const int64_t k_tiles = ceil_div(p.seqlen_k, kTile);
  const int64_t d_tiles = ceil_div(p.head_dim, kTile);
  if (bh * q_tiles * k_tiles > 0) {
    probs_kernel<Element><<<grid(bh * q_tiles * k_tiles), tile_threads, 0, stream>>>(p, d_rows, probs, dscores);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  if (bh * q_tiles * d_tiles > 0) {
    dq_kernel<Element><<<grid(bh * q_tiles * d_tiles), tile_threads, 0, stream>>>(p, dscores);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  const int64_t kv_tiles = p.batch * p.heads_kv * k_tiles * d_tiles;
  if (kv_tiles > 0) {
    dkv_kernel<Element><<<grid(kv_tiles), tile_threads, 0, stream>>>(p, probs, dscores);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace waveboost::cuda
