// Paired single-core timing of the AVX2 fp32 forward kernel of two source trees (A and B), for
// comparing kernel versions on a machine whose clock moves by +-10% over tens of milliseconds (a
// KVM guest under host turbo): A and B run one head each, alternately, A first on even rounds and
// B first on odd ones, and the median of the per-pair time ratios is reported with its quartiles.
//
// Built three times by benchmarks/cpu_kernel_ab.sh: once per tree with -DWAVEBOOST_AB_VARIANT=A
// (or B), -Dcpu=cpu_A (the kernel namespace renamed so that both trees link into one program) and
// that tree's src/cpu on the include path, and once as the driver. Each variant packs head 0 of a
// (1, L, H, D) problem inside the timing as its tree's AVX2 path does before a dense run (K^T
// panels and the rows kernel where the tree has flash_rows_avx2.h, else K rows and
// attention_query_block), then computes it block by block, one thread.
//
//   benchmarks/cpu_kernel_ab.sh REV_A REV_B L D H causal rounds
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

#define WAVEBOOST_AB_CAT2(a, b) a##b
#define WAVEBOOST_AB_CAT(a, b) WAVEBOOST_AB_CAT2(a, b)

#ifdef WAVEBOOST_AB_VARIANT
#include "flash_kernel.h"
#include "flash_kernel_avx2.h"
#if __has_include("flash_rows_avx2.h")
#include "flash_rows_avx2.h"
#define WAVEBOOST_AB_ROWS 1
#endif

using namespace waveboost;
using namespace waveboost::cpu;

extern "C" __attribute__((target("avx2,fma"), noinline)) void WAVEBOOST_AB_CAT(run_, WAVEBOOST_AB_VARIANT)(
    const float* q, const float* k, const float* v, float* o, int L, int D, int H, int causal) {
  using Config = Avx2Config<float>;
  const int64_t ldv = round_up(D, Config::kLanes) + TileSteps<Config>::kScratchPad;
  // 64-byte aligned, as pack_kv's storage (cpu_attention.cpp).
  thread_local ScratchArray<float> k_storage, v_storage;
  float* k_packed = k_storage.get(size_t(round_up(L, 16)) * D);
  float* v_packed = v_storage.get(size_t(L) * ldv);
  AttentionParams p;
  p.q = q;
  p.k = k_packed;
  p.v = v_packed;
  p.out = o;
  p.q_row_stride = p.o_row_stride = int64_t(H) * D;
  p.k_row_stride = D;
  p.v_row_stride = ldv;
  p.q_head_stride = p.o_head_stride = D;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = L;
  p.heads = p.heads_kv = H;
  p.head_dim = D;
  p.softmax_scale = 1.0 / std::sqrt(double(D));
  p.is_causal = causal != 0;
  for (int j = 0; j < L; ++j)
    std::copy(v + size_t(j) * H * D, v + size_t(j) * H * D + D, v_packed + size_t(j) * ldv);
#ifdef WAVEBOOST_AB_ROWS
  thread_local RowScratch scratch;
  pack_key_panels(k, int64_t(H) * D, L, D, k_packed);
  KeyPanels panels;
  panels.data = k_packed;
  for (int64_t row = 0; row < L; row += Config::kBlockM)
    attention_query_block_rows(p, panels, QueryBlock{0, 0, row, std::min<int64_t>(Config::kBlockM, L - row)}, scratch);
#else
  thread_local Scratch<float> scratch;
  for (int j = 0; j < L; ++j)
    std::copy(k + size_t(j) * H * D, k + size_t(j) * H * D + D, k_packed + size_t(j) * D);
  for (int64_t row = 0; row < L; row += Config::kBlockM)
    attention_query_block<Config>(p, QueryBlock{0, 0, row, std::min<int64_t>(Config::kBlockM, L - row)}, scratch);
#endif
}

#else  // the driver

extern "C" void run_A(const float*, const float*, const float*, float*, int, int, int, int);
extern "C" void run_B(const float*, const float*, const float*, float*, int, int, int, int);

static double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::printf("usage: %s L D H causal rounds\n", argv[0]);
    return 1;
  }
  const int L = std::atoi(argv[1]), D = std::atoi(argv[2]), H = std::atoi(argv[3]), causal = std::atoi(argv[4]);
  const int rounds = std::atoi(argv[5]);
  std::vector<float> q(size_t(L) * H * D), k(q.size()), v(q.size()), out_a(q.size()), out_b(q.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(gen);
  run_A(q.data(), k.data(), v.data(), out_a.data(), L, D, H, causal);  // warm-up, and the outputs compared
  run_B(q.data(), k.data(), v.data(), out_b.data(), L, D, H, causal);
  double max_diff = 0;
  for (int i = 0; i < L; ++i)
    for (int d = 0; d < D; ++d)
      max_diff = std::max(max_diff, double(std::fabs(out_a[size_t(i) * H * D + d] - out_b[size_t(i) * H * D + d])));
  std::vector<double> time_a, time_b, ratio;
  for (int r = 0; r < rounds; ++r) {
    double t[2];
    for (int turn = 0; turn < 2; ++turn) {
      const bool a = (turn == 0) == (r % 2 == 0);
      const double t0 = thread_seconds();
      if (a)
        run_A(q.data(), k.data(), v.data(), out_a.data(), L, D, H, causal);
      else
        run_B(q.data(), k.data(), v.data(), out_b.data(), L, D, H, causal);
      t[a ? 0 : 1] = thread_seconds() - t0;
    }
    time_a.push_back(t[0]);
    time_b.push_back(t[1]);
    ratio.push_back(t[0] / t[1]);
  }
  for (auto* x : {&time_a, &time_b, &ratio}) std::sort(x->begin(), x->end());
  const size_t n = ratio.size();
  std::printf("L=%d D=%d H=%d causal=%d: A %.2f ms, B %.2f ms (medians); A/B %.4f [quartiles %.4f, %.4f]; "
              "max |out_A - out_B| %.2e\n",
              L, D, H, causal, time_a[n / 2] * 1e3, time_b[n / 2] * 1e3, ratio[n / 2], ratio[n / 4],
              ratio[3 * n / 4], max_diff);
  return 0;
}

#endif
