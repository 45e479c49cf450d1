// The fp32 FMA ceiling of one core with AVX2: 12 independent chains of 8-wide fused multiply-adds
// (enough to cover the FMA latency on two pipes), so that the CPU path's GFLOP/s can be read as a
// share of what the core can issue.
//
//   gcc -O2 -mavx2 -mfma benchmarks/cpu_fma_ceiling.c -o /tmp/fma && /tmp/fma
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

int main(void) {
  enum { kChains = 12 };
  __m256 acc[kChains];
  const __m256 mul = _mm256_set1_ps(1.0000001f), add = _mm256_set1_ps(0.999999f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps((float)i);
  const long steps = 400000000L / kChains;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long k = 0; k < steps; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], mul, add);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  float sum = 0.f;  // the chains' values are used, so the loop stays
  for (int i = 0; i < kChains; ++i) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[i]);
    sum += lanes[0];
  }
  printf("%.1f GFLOP/s fp32 FMA on one core (checksum %g)\n", (double)steps * kChains * 16 / s / 1e9, sum);
  return 0;
}
