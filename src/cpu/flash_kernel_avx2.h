// The AVX2 + FMA configuration of the CPU kernel (x86 without AVX-512).
//
// Sixteen ymm registers hold a 6 x 2 micro-tile: 12 accumulators, the two
// streamed vectors and one broadcast. The tile steps are compiled as functions
// of their own (TileSteps below): inlined into attention_query_block, GCC kept
// one accumulator of the P V micro-tile on the stack, a store-to-load chain
// through every iteration (slower than the spill-free loop). Measured on
// a 2-core Zen 3 (benchmarks/NOTES.md): packing K per tile into 6-key groups,
// copying Q^T columns contiguous, kBlockM 128/256 and kBlockN 64/96/256 gained
// nothing above the run-to-run noise, so none of them is here.
#pragma once

#include "flash_kernel.h"

namespace waveboost::cpu {

template <typename T>
using Avx2Config = KernelConfig<T, 32 / sizeof(T), 6, 2>;

#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_AVX2 __attribute__((target("avx2,fma"), noinline))

// Requests for the next tile's K and V rows, handed out a few at a time
// between micro-tiles. Issued all at once at the start of the tile (2048 lines
// for 128 keys x 512 B of K and of V, far more than the L1's miss buffers),
// they gained nothing measurable; spread out, they did (benchmarks/NOTES.md).
struct PrefetchQueue {
  const char* k = nullptr;  // the current row of K and of V
  const char* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;  // bytes
  int64_t row_bytes = 0;
  int64_t rows_left = 0;
  int64_t offset = 0;  // next line of the current rows, in bytes

  WAVEBOOST_CPU_INLINE void issue(int lines) {
    for (int c = 0; c < lines && rows_left > 0; c += 2) {
      __builtin_prefetch(k + offset, 0, 2);
      __builtin_prefetch(v + offset, 0, 2);
      offset += 64;
      if (offset >= row_bytes) {
        offset = 0;
        k += k_stride;
        v += v_stride;
        --rows_left;
      }
    }
  }
};

template <class C>
struct Avx2TileSteps {
  using T = typename C::Element;
  static constexpr int kPrefetchPerMicroTile = 16;

  static PrefetchQueue& queue() {
    thread_local PrefetchQueue q;
    return q;
  }

  // K and V rows of a head sit one row stride apart (4 KiB for 8 heads x 128 x fp32), each in
  // its own page, where the hardware prefetchers do not follow them: the next tile's rows are
  // requested while this tile computes.
  static WAVEBOOST_CPU_AVX2 void prefetch_next(const T* k_next, int64_t k_stride, const T* v_next, int64_t v_stride,
                                               int64_t rows, int64_t head_dim) {
    PrefetchQueue& q = queue();
    q.k = reinterpret_cast<const char*>(k_next);
    q.v = reinterpret_cast<const char*>(v_next);
    q.k_stride = k_stride * static_cast<int64_t>(sizeof(T));
    q.v_stride = v_stride * static_cast<int64_t>(sizeof(T));
    q.row_bytes = head_dim * static_cast<int64_t>(sizeof(T));
    q.rows_left = rows;
    q.offset = 0;
  }

  // S^T = K Q^T (scores_tile's micro-tiles), query columns outer (measured level
  // with keys outer), with prefetches between micro-tiles.
  static WAVEBOOST_CPU_AVX2 void scores(const T* k, int64_t k_row_stride, int64_t cols, const T* q_t,
                                        int64_t rows_padded, int64_t head_dim, T* s) {
    PrefetchQueue& q = queue();
    constexpr int64_t kWide = C::kTileVecs * C::kLanes;
    for (int64_t i = 0; i < rows_padded;) {
      const bool wide = i + kWide <= rows_padded;
      for (int64_t j = 0; j < cols;) {
        const int64_t keys = std::min<int64_t>(C::kTileRows, cols - j);
        const T* k_j = k + j * k_row_stride;
        T* s_ji = s + j * rows_padded + i;
        if (keys == C::kTileRows && wide)
          scores_microtile<C, C::kTileRows, C::kTileVecs>(k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji,
                                                          rows_padded);
        else if (keys == C::kTileRows)
          scores_microtile<C, C::kTileRows, 1>(k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji, rows_padded);
        else if (wide)
          scores_leftover<C, C::kTileVecs>(keys, k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji,
                                           rows_padded);
        else
          scores_leftover<C, 1>(keys, k_j, k_row_stride, q_t + i, rows_padded, head_dim, s_ji, rows_padded);
        q.issue(kPrefetchPerMicroTile);
        j += keys;
      }
      i += wide ? kWide : C::kLanes;
    }
  }

  static WAVEBOOST_CPU_AVX2 void softmax(int64_t cols, int64_t rows_padded, const T* key_limit, bool apply_mask, T* s,
                                         T* m, T* l, T* alpha) {
    online_softmax_tile<C>(cols, rows_padded, key_limit, apply_mask, s, m, l, alpha);
  }

  // O = diag(alpha) O + P V (accumulate_pv).
  static WAVEBOOST_CPU_AVX2 void pv(const T* p_t, const T* v, int64_t cols, const T* alpha, int64_t rows_padded,
                                    int64_t dim_padded, T* o) {
    PrefetchQueue& q = queue();
    constexpr int64_t kWide = C::kTileVecs * C::kLanes;
    for (int64_t d = 0; d < dim_padded;) {
      const bool wide = d + kWide <= dim_padded;
      for (int64_t i = 0; i < rows_padded;) {
        const int64_t rows = std::min<int64_t>(C::kTileRows, rows_padded - i);
        const T* p_i = p_t + i;
        T* o_id = o + i * dim_padded + d;
        if (rows == C::kTileRows && wide)
          pv_microtile<C, C::kTileRows, C::kTileVecs>(p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id,
                                                      dim_padded);
        else if (rows == C::kTileRows)
          pv_microtile<C, C::kTileRows, 1>(p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id, dim_padded);
        else if (wide)
          pv_leftover<C, C::kTileVecs>(rows, p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id,
                                       dim_padded);
        else
          pv_leftover<C, 1>(rows, p_i, rows_padded, v + d, dim_padded, cols, alpha + i, o_id, dim_padded);
        q.issue(kPrefetchPerMicroTile);
        i += rows;
      }
      d += wide ? kWide : C::kLanes;
    }
  }
};

template <>
struct TileSteps<Avx2Config<float>> : Avx2TileSteps<Avx2Config<float>> {};
template <>
struct TileSteps<Avx2Config<double>> : Avx2TileSteps<Avx2Config<double>> {};

#undef WAVEBOOST_CPU_AVX2
#endif

}  // namespace waveboost::cpu
