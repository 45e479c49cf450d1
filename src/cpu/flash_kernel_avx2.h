// The AVX2 + FMA configuration of the CPU kernel (x86 without AVX-512).
//
// Sixteen ymm registers hold a 6 x 2 micro-tile: 12 accumulators, the two
// streamed vectors and one broadcast. The tile steps are compiled as functions
// of their own (TileSteps below): inlined into attention_query_block, GCC kept
// one accumulator of the P V micro-tile on the stack, a store-to-load chain
// through every iteration (0.65x the speed of the spill-free loop).
#pragma once

#include "flash_kernel.h"

namespace waveboost::cpu {

template <typename T>
using Avx2Config = KernelConfig<T, 32 / sizeof(T), 6, 2>;

#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_AVX2 __attribute__((target("avx2,fma"), noinline))

template <class C>
struct Avx2TileSteps {
  using T = typename C::Element;
  // K and V rows of a head sit one row stride apart (4 KiB for 8 heads x 128 x fp32), each in
  // its own page, where the hardware prefetchers do not follow them; the next tile's rows are
  // requested into L2 while this tile computes.
  static WAVEBOOST_CPU_AVX2 void prefetch_next(const T* k_next, int64_t k_stride, const T* v_next, int64_t v_stride,
                                               int64_t rows, int64_t head_dim) {
    const int64_t bytes = head_dim * static_cast<int64_t>(sizeof(T));
    for (int64_t j = 0; j < rows; ++j) {
      const char* k_row = reinterpret_cast<const char*>(k_next + j * k_stride);
      const char* v_row = reinterpret_cast<const char*>(v_next + j * v_stride);
      for (int64_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(k_row + b, 0, 2);
        __builtin_prefetch(v_row + b, 0, 2);
      }
    }
  }
  static WAVEBOOST_CPU_AVX2 void scores(const T* k, int64_t k_row_stride, int64_t cols, const T* q_t,
                                        int64_t rows_padded, int64_t head_dim, T* s) {
    scores_tile<C>(k, k_row_stride, cols, q_t, rows_padded, head_dim, s);
  }
  static WAVEBOOST_CPU_AVX2 void softmax(int64_t cols, int64_t rows_padded, const T* key_limit, bool apply_mask, T* s,
                                         T* m, T* l, T* alpha) {
    online_softmax_tile<C>(cols, rows_padded, key_limit, apply_mask, s, m, l, alpha);
  }
  static WAVEBOOST_CPU_AVX2 void pv(const T* p_t, const T* v, int64_t cols, const T* alpha, int64_t rows_padded,
                                    int64_t dim_padded, T* o) {
    accumulate_pv<C>(p_t, v, cols, alpha, rows_padded, dim_padded, o);
  }
};

template <>
struct TileSteps<Avx2Config<float>> : Avx2TileSteps<Avx2Config<float>> {};
template <>
struct TileSteps<Avx2Config<double>> : Avx2TileSteps<Avx2Config<double>> {};

#undef WAVEBOOST_CPU_AVX2
#endif

}  // namespace waveboost::cpu
