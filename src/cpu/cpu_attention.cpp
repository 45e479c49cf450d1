// The CPU path: picks the widest instruction set the host supports at run
// time, then runs one task per (batch, head, block of kBlockM query rows) on
// the thread pool. Each output row is computed by exactly one task, and a
// task's arithmetic depends only on its index, so results are bitwise the same
// from run to run whatever the thread count or scheduling.
#include "cpu_attention.h"

// GCC warns that the kernel's helpers returning 32/64-byte vectors would pass
// them differently without AVX enabled. They are always inlined into the
// target("...") functions below, so no such call exists. (Placed before the
// includes: the warning points at the kernel header's lines.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "flash_kernel.h"
#include "thread_pool.h"

namespace waveboost::cpu {
namespace {

// Micro-tiles sized to the register file: the accumulators plus kTileVecs
// streamed vectors and a broadcast must fit (32 zmm with AVX-512, 16 ymm/xmm
// otherwise). With AVX-512 on Zen 5, fp32, 8x2 measured 3% ahead of 4x4 and
// 6x4 and 13% ahead of 12x2.
template <typename T>
using Avx512Config = KernelConfig<T, 64 / sizeof(T), 8, 2>;
template <typename T>
using Avx2Config = KernelConfig<T, 32 / sizeof(T), 6, 2>;
template <typename T>
using BaselineConfig = KernelConfig<T, 16 / sizeof(T), 4, 2>;

using QueryBlockKernel = void (*)(const AttentionParams&, const QueryBlock&);

template <typename T>
Scratch<T>& thread_scratch() {
  thread_local Scratch<T> scratch;
  return scratch;
}

template <class C>
void query_block_baseline(const AttentionParams& params, const QueryBlock& block) {
  attention_query_block<C>(params, block, thread_scratch<typename C::Element>());
}

#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_X86 1
template <class C>
__attribute__((target("avx2,fma"))) void query_block_avx2(const AttentionParams& params, const QueryBlock& block) {
  attention_query_block<C>(params, block, thread_scratch<typename C::Element>());
}
template <class C>
__attribute__((target("avx512f,avx2,fma"))) void query_block_avx512(const AttentionParams& params,
                                                                    const QueryBlock& block) {
  attention_query_block<C>(params, block, thread_scratch<typename C::Element>());
}
#endif

enum class Isa { kBaseline, kAvx2, kAvx512 };

Isa detect_isa() {
  Isa best = Isa::kBaseline;
#ifdef WAVEBOOST_CPU_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f")) best = Isa::kAvx512;
#endif
  // WAVEBOOST_CPU_ISA=avx2|baseline caps the choice (to test the other paths
  // on a machine that has AVX-512); it never enables what the CPU lacks.
  if (const char* cap = std::getenv("WAVEBOOST_CPU_ISA")) {
    if (std::strcmp(cap, "baseline") == 0) best = Isa::kBaseline;
    if (std::strcmp(cap, "avx2") == 0 && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

template <typename T>
QueryBlockKernel select_kernel() {
  static const Isa isa = detect_isa();
  switch (isa) {
#ifdef WAVEBOOST_CPU_X86
    case Isa::kAvx512:
      return query_block_avx512<Avx512Config<T>>;
    case Isa::kAvx2:
      return query_block_avx2<Avx2Config<T>>;
#endif
    default:
      return query_block_baseline<BaselineConfig<T>>;
  }
}

// Head h's rows are split into ceil(seqlen_q / kBlockM) blocks. kBlockM is
// the same for every configuration, so the split (and thus each task's work)
// does not depend on the instruction set either.
constexpr int64_t kBlockM = BaselineConfig<float>::kBlockM;
static_assert(Avx512Config<float>::kBlockM == kBlockM && Avx2Config<double>::kBlockM == kBlockM,
              "every configuration must split query rows the same way");

}  // namespace

Status can_implement(const AttentionParams& params) {
  if (params.device_type != DeviceType::kCPU)
    return Status::NotSupported("backend 'cpu' runs on host memory; got tensors on a CUDA device");
  if (params.dtype != DType::kFloat32 && params.dtype != DType::kFloat64)
    return Status::NotSupported(std::string("backend 'cpu' supports float32 and float64 on the CPU; got ") +
                                dtype_name(params.dtype));
  return Status::Ok();
}

Status attention_forward(const AttentionParams& params) {
  Status status = can_implement(params);
  if (!status.ok()) return status;
  if (params.batch == 0 || params.heads == 0 || params.seqlen_q == 0) return Status::Ok();

  const QueryBlockKernel kernel =
      params.dtype == DType::kFloat32 ? select_kernel<float>() : select_kernel<double>();
  const int64_t blocks_per_head = (params.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t num_tasks = params.batch * params.heads * blocks_per_head;

  std::atomic<bool> failed{false};
  global_thread_pool().parallel_for(num_tasks, [&](int64_t task) {
    // Causal blocks near the end of the sequence see the most keys: hand
    // them out first so the cheap ones fill in the gaps at the end.
    const int64_t block_index = blocks_per_head - 1 - task % blocks_per_head;
    const int64_t batch_head = task / blocks_per_head;
    QueryBlock block;
    block.batch = batch_head / params.heads;
    block.head = batch_head % params.heads;
    block.row_begin = block_index * kBlockM;
    block.num_rows = std::min(kBlockM, params.seqlen_q - block.row_begin);
    try {
      kernel(params, block);
    } catch (const std::exception&) {  // scratch allocation (std::bad_alloc)
      failed.store(true);
    }
  });
  if (failed.load()) return Status::Internal("backend 'cpu': out of memory for per-thread scratch");
  return Status::Ok();
}

}  // namespace waveboost::cpu

namespace waveboost {

const char* cpu_isa() {
  static const cpu::Isa isa = cpu::detect_isa();
  switch (isa) {
    case cpu::Isa::kAvx512: return "avx512";
    case cpu::Isa::kAvx2: return "avx2";
    default: return "baseline";
  }
}

int cpu_num_threads() { return cpu::configured_num_threads(); }

}  // namespace waveboost
