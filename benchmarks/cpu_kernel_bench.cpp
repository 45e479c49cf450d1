// Single-core timing of the CPU kernel's AVX2 configuration, one head at a time, for
// comparing kernel versions on a shared machine.
//
// Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time slices lost to
// other processes do not count, and each timing is divided by the FMA peak measured right
// before and after it (12 independent vfmadd231ps chains), so that clock changes cancel:
// "eff" is the fraction of one core's fp32 FMA peak. Q, K and V are (L, H, D) rows, as in a
// (1, L, H, D) tensor, so K and V rows of one head are H * D elements apart; one head (0)
// is computed, block after block of kBlockM query rows, as one task of the pool would.
// Also prints the largest error of four rows against a float64 reference.
//
//   g++ -O3 -std=c++17 -Iinclude -Isrc/cpu benchmarks/cpu_kernel_bench.cpp -o /tmp/cpu_kernel_bench
//   /tmp/cpu_kernel_bench [L=2048] [D=128] [reps=9] [H=8] [pack=0]
// pack=1 copies head 0's K and V rows into contiguous arrays first (V rows one cache line longer,
// as the kernel's V tile), inside the timing, as the AVX2 path's pack_kv (cpu_attention.cpp)
// does per (batch, kv head) before a dense run for fp64; pack=2 packs K as K^T panels instead and
// runs the rows kernel (flash_rows_avx2.h), as pack_kv and the AVX2 fp32 path do.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "flash_kernel.h"
#include "flash_kernel_avx2.h"
#include "flash_rows_avx2.h"

using namespace waveboost;
using namespace waveboost::cpu;
using Config = Avx2Config<float>;

static double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// fp32 FLOP/s of one core running 12 independent 8-wide FMA chains.
static double fma_peak() {
  const long n = 400000;
  const double t0 = thread_seconds();
  __asm__ volatile(
      "vxorps %%ymm0,%%ymm0,%%ymm0\n vxorps %%ymm1,%%ymm1,%%ymm1\n vxorps %%ymm2,%%ymm2,%%ymm2\n"
      "vxorps %%ymm3,%%ymm3,%%ymm3\n vxorps %%ymm4,%%ymm4,%%ymm4\n vxorps %%ymm5,%%ymm5,%%ymm5\n"
      "vxorps %%ymm6,%%ymm6,%%ymm6\n vxorps %%ymm7,%%ymm7,%%ymm7\n vxorps %%ymm8,%%ymm8,%%ymm8\n"
      "vxorps %%ymm9,%%ymm9,%%ymm9\n vxorps %%ymm10,%%ymm10,%%ymm10\n vxorps %%ymm11,%%ymm11,%%ymm11\n"
      "mov %0, %%rcx\n1:\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm0\n vfmadd231ps %%ymm12,%%ymm13,%%ymm1\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm2\n vfmadd231ps %%ymm12,%%ymm13,%%ymm3\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm4\n vfmadd231ps %%ymm12,%%ymm13,%%ymm5\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm6\n vfmadd231ps %%ymm12,%%ymm13,%%ymm7\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm8\n vfmadd231ps %%ymm12,%%ymm13,%%ymm9\n"
      "vfmadd231ps %%ymm12,%%ymm13,%%ymm10\n vfmadd231ps %%ymm12,%%ymm13,%%ymm11\n"
      "dec %%rcx\n jnz 1b\n" ::"r"(n)
      : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm12", "xmm13");
  return n * 12.0 * 16 / (thread_seconds() - t0);
}

__attribute__((target("avx2,fma"), noinline)) static void run_block(const AttentionParams& p, const QueryBlock& b) {
  thread_local Scratch<float> scratch;
  attention_query_block<Config>(p, b, scratch);
}

__attribute__((target("avx2,fma"), noinline)) static void run_block_rows(const AttentionParams& p,
                                                                        const KeyPanels& keys, const QueryBlock& b) {
  thread_local RowScratch scratch;
  attention_query_block_rows(p, keys, b, scratch);
}

int main(int argc, char** argv) {
  const int L = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int D = argc > 2 ? std::atoi(argv[2]) : 128;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 9;
  const int H = argc > 4 ? std::atoi(argv[4]) : 8;
  const int pack = argc > 5 ? std::atoi(argv[5]) : 0;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("this CPU lacks AVX2/FMA\n");
    return 1;
  }
  std::vector<float> q(static_cast<size_t>(L) * H * D), k(q.size()), v(q.size()), o(q.size());
  const int64_t ldv = round_up(D, Config::kLanes) + TileSteps<Config>::kScratchPad;
  ScratchArray<float> k_storage, v_storage;  // 64-byte aligned, as pack_kv's storage (cpu_attention.cpp)
  float* k_packed = k_storage.get(static_cast<size_t>(round_up(L, kPanelKeys)) * D);
  float* v_packed = v_storage.get(static_cast<size_t>(L) * ldv);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(gen);
  AttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = o.data();
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = static_cast<int64_t>(H) * D;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = D;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = static_cast<int64_t>(L) * H * D;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = L;
  p.heads = p.heads_kv = H;
  p.head_dim = D;
  p.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int causal = 0; causal < 2; ++causal) {
    p.is_causal = causal != 0;
    const double flops = 4.0 * L * L * D * (causal ? 0.5 : 1.0);
    std::vector<double> seconds, eff;
    for (int r = 0; r < reps; ++r) {
      const double peak_before = fma_peak();
      const double t0 = thread_seconds();
      AttentionParams run = p;
      KeyPanels panels;
      if (pack) {
        for (int j = 0; j < L; ++j) {
          if (pack == 1) std::copy(&k[size_t(j) * H * D], &k[size_t(j) * H * D] + D, &k_packed[size_t(j) * D]);
          std::copy(&v[size_t(j) * H * D], &v[size_t(j) * H * D] + D, &v_packed[size_t(j) * ldv]);
        }
        if (pack == 2) pack_key_panels(k.data(), int64_t(H) * D, L, D, k_packed);
        panels.data = k_packed;
        run.k = k_packed;
        run.v = v_packed;
        run.k_row_stride = D;
        run.v_row_stride = ldv;
      }
      for (int64_t row = 0; row < L; row += Config::kBlockM) {
        const QueryBlock block{0, 0, row, std::min<int64_t>(Config::kBlockM, L - row)};
        if (pack == 2)
          run_block_rows(run, panels, block);
        else
          run_block(run, block);
      }
      const double t = thread_seconds() - t0;
      seconds.push_back(t);
      eff.push_back(flops / t / ((peak_before + fma_peak()) / 2));
    }
    std::sort(seconds.begin(), seconds.end());
    std::sort(eff.begin(), eff.end());
    double max_err = 0, max_ref = 0;
    for (int i : {0, 1, L / 2, L - 1}) {
      const int keys = causal ? i + 1 : L;
      std::vector<double> s(keys);
      double m = -INFINITY, l = 0;
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[size_t(i) * H * D + d]) * k[size_t(j) * H * D + d];
        s[j] = dot * p.softmax_scale;
        m = std::max(m, s[j]);
      }
      for (int j = 0; j < keys; ++j) l += (s[j] = std::exp(s[j] - m));
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < keys; ++j) acc += s[j] * v[size_t(j) * H * D + d];
        max_err = std::max(max_err, std::fabs(acc / l - o[size_t(i) * H * D + d]));
        max_ref = std::max(max_ref, std::fabs(acc / l));
      }
    }
    std::printf("L=%d D=%d H=%d causal=%d: best %.2f ms (%.1f GFLOP/s), median %.2f ms; eff median %.3f best %.3f;"
                " rel err %.2e\n",
                L, D, H, causal, seconds[0] * 1e3, flops / seconds[0] / 1e9, seconds[reps / 2] * 1e3, eff[reps / 2],
                eff.back(), max_err / max_ref);
  }
  return 0;
}
