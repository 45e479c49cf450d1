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
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "flash_kernel.h"
#include "flash_kernel_avx2.h"
#include "flash_rows_avx2.h"
#include "thread_pool.h"

namespace waveboost::cpu {
namespace {

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
// The fp32 rows kernel on K^T panels (flash_rows_avx2.h), after pack_kv.
__attribute__((target("avx2,fma"))) void query_block_avx2_rows(const AttentionParams& params, const KeyPanels& keys,
                                                             const QueryBlock& block) {
  thread_local RowScratch scratch;
  attention_query_block_rows(params, keys, block, scratch);
}
template <class C>
__attribute__((target("avx512f,avx2,fma"))) void query_block_avx512(const AttentionParams& params,
                                                                    const QueryBlock& block) {
  attention_query_block<C>(params, block, thread_scratch<typename C::Element>());
}
#endif

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

// Where one sequence of a batch with a sequence layout lives, read from the host index arrays.
struct SequenceExtent {
  int64_t q_begin = 0;  // first packed query row (varlen q), else 0
  int64_t seqlen_q = 0;
  int64_t k_begin = 0;  // first packed key row (varlen k), else 0
  int64_t seqlen_k = 0;
};

// Reads cu_seqlens, seqused_k and block_table and checks every index the kernel will follow, so
// that a bad one is an error rather than an out-of-bounds read.
Status sequence_extents(const AttentionParams& p, std::vector<SequenceExtent>* extents) {
  extents->resize(p.batch);
  auto str = [](int64_t x) { return std::to_string(x); };
  for (int64_t b = 0; b < p.batch; ++b) {
    SequenceExtent& e = (*extents)[b];
    e.seqlen_q = p.seqlen_q;
    if (p.is_varlen_q()) {
      e.q_begin = p.cu_seqlens_q[b];
      e.seqlen_q = static_cast<int64_t>(p.cu_seqlens_q[b + 1]) - e.q_begin;
      if (b == 0 && e.q_begin < 0)
        return Status::InvalidArgument("cu_seqlens_q[0] must be >= 0; got " + str(e.q_begin));
      if (e.seqlen_q < 0 || e.seqlen_q > p.seqlen_q)
        return Status::InvalidArgument("cu_seqlens_q gives sequence " + str(b) + " " + str(e.seqlen_q) +
                                       " queries; expected a count in [0, max_seqlen_q = " + str(p.seqlen_q) +
                                       "] (cu_seqlens_q must be non-decreasing)");
    }
    int64_t capacity = p.seqlen_k;
    if (p.is_varlen_k()) {
      e.k_begin = p.cu_seqlens_k[b];
      capacity = static_cast<int64_t>(p.cu_seqlens_k[b + 1]) - e.k_begin;
      if (b == 0 && e.k_begin < 0)
        return Status::InvalidArgument("cu_seqlens_k[0] must be >= 0; got " + str(e.k_begin));
      if (capacity < 0)
        return Status::InvalidArgument("cu_seqlens_k gives sequence " + str(b) + " " + str(capacity) +
                                       " keys; cu_seqlens_k must be non-decreasing");
    }
    e.seqlen_k = capacity;
    if (p.seqused_k != nullptr) {
      e.seqlen_k = p.seqused_k[b];
      if (e.seqlen_k < 0 || e.seqlen_k > capacity)
        return Status::InvalidArgument("seqused_k[" + str(b) + "] = " + str(e.seqlen_k) +
                                       " is outside [0, " + str(capacity) + "], the keys sequence " + str(b) +
                                       " can hold");
    }
    if (e.seqlen_k > p.seqlen_k)
      return Status::InvalidArgument("sequence " + str(b) + " uses " + str(e.seqlen_k) +
                                     " keys, more than max_seqlen_k = " + str(p.seqlen_k));
    if (p.is_paged()) {
      const int32_t* pages = p.block_table + b * p.block_table_batch_stride;
      for (int64_t i = 0; i < (e.seqlen_k + p.page_size - 1) / p.page_size; ++i)
        if (pages[i] < 0 || pages[i] >= p.num_pages)
          return Status::InvalidArgument("block_table[" + str(b) + ", " + str(i) + "] = " + str(pages[i]) +
                                         " is not a page id in [0, " + str(p.num_pages) + ")");
    }
  }
  return Status::Ok();
}

// The dense, one-sequence params of sequence `b`: pointers moved to its rows, its own lengths
// (so the causal mask aligns bottom-right per sequence), a paged cache's table row.
AttentionParams sequence_params(const AttentionParams& p, int64_t b, const SequenceExtent& e) {
  const int64_t elem = p.dtype == DType::kFloat64 ? 8 : 4;
  auto advance = [elem](const void* ptr, int64_t elements) {
    return static_cast<const void*>(static_cast<const char*>(ptr) + elements * elem);
  };
  AttentionParams s = p;
  s.batch = 1;
  s.seqlen_q = e.seqlen_q;
  s.seqlen_k = e.seqlen_k;
  s.cu_seqlens_q = s.cu_seqlens_k = s.seqused_k = nullptr;
  const int64_t q_offset = p.is_varlen_q() ? e.q_begin * p.q_row_stride : b * p.q_batch_stride;
  const int64_t o_offset = p.is_varlen_q() ? e.q_begin * p.o_row_stride : b * p.o_batch_stride;
  s.q = advance(p.q, q_offset);
  s.out = const_cast<void*>(advance(p.out, o_offset));
  if (p.lse != nullptr) s.lse = p.lse + (p.is_varlen_q() ? e.q_begin : b * p.lse_batch_stride);
  if (p.is_paged()) {
    s.block_table = p.block_table + b * p.block_table_batch_stride;
  } else {
    const int64_t k_offset = p.is_varlen_k() ? e.k_begin * p.k_row_stride : b * p.k_batch_stride;
    const int64_t v_offset = p.is_varlen_k() ? e.k_begin * p.v_row_stride : b * p.v_batch_stride;
    s.k = advance(p.k, k_offset);
    s.v = advance(p.v, v_offset);
  }
  return s;
}

// A batch with a sequence layout: one task per (sequence, head, block of kBlockM query rows),
// each running the dense kernel on its sequence's view.
Status sequence_forward(const AttentionParams& params, QueryBlockKernel kernel) {
  std::vector<SequenceExtent> extents;
  if (Status s = sequence_extents(params, &extents); !s.ok()) return s;
  int64_t max_rows = 0;
  for (const SequenceExtent& e : extents) max_rows = std::max(max_rows, e.seqlen_q);
  const int64_t blocks_per_head = (max_rows + kBlockM - 1) / kBlockM;
  const int64_t num_tasks = params.batch * params.heads * blocks_per_head;

  std::atomic<bool> failed{false};
  global_thread_pool().parallel_for(num_tasks, [&](int64_t task) {
    const int64_t block_index = blocks_per_head - 1 - task % blocks_per_head;
    const int64_t batch_head = task / blocks_per_head;
    const int64_t b = batch_head / params.heads;
    const SequenceExtent& e = extents[b];
    QueryBlock block;
    block.batch = 0;
    block.head = batch_head % params.heads;
    block.row_begin = block_index * kBlockM;
    if (block.row_begin >= e.seqlen_q) return;
    block.num_rows = std::min(kBlockM, e.seqlen_q - block.row_begin);
    try {
      kernel(sequence_params(params, b, e), block);
    } catch (const std::exception&) {
      failed.store(true);
    }
  });
  if (failed.load()) return Status::Internal("backend 'cpu': out of memory for per-thread scratch");
  return Status::Ok();
}

// AVX2 path: K and V of every (batch, kv head) copied into contiguous rows before a dense run.
// In a (batch, seqlen, heads, head_dim) tensor the rows of one head are heads x head_dim apart
// (4 KiB for 8 x 128 fp32), so all of them fall into the same eighth of the L2 sets; on a Zen 3
// core the same kernel ran 8% faster on contiguous rows (benchmarks/NOTES.md). The copy is one
// read and write of K and V; each row is read ceil(seqlen_q / kBlockM) times per query head.
// V rows are laid out as the kernel's V tile (row stride head_dim + one cache line), which it then
// reads in place instead of copying per tile (Avx2TileSteps::v_tile). fp32 with head_dim % 8 == 0
// packs K transposed, in panels of kPanelKeys keys, for the rows kernel (flash_rows_avx2.h); fp64
// and other head dims pack K rows for attention_query_block, whose results are then bitwise the
// same as on the unpacked tensors.
#ifdef WAVEBOOST_CPU_X86
template <typename T>
int64_t avx2_v_tile_stride(int64_t head_dim) {
  using C = Avx2Config<T>;
  return round_up(head_dim, C::kLanes) + TileSteps<C>::kScratchPad;
}

constexpr int64_t kPackMinSeqlenQ = 4 * kBlockM;
constexpr int64_t kPackMaxBytes = int64_t(256) << 20;  // K and V together; larger runs read them in place

struct PackedKv {
  std::unique_ptr<char[]> storage;
  AttentionParams params;
  KeyPanels panels;  // data set: K is packed as K^T panels, for the rows kernel
};

bool pack_kv(const AttentionParams& p, PackedKv* packed) {
  const int64_t elem = p.dtype == DType::kFloat64 ? 8 : 4;
  const int64_t row_bytes = p.head_dim * elem;
  const bool key_panels = p.dtype == DType::kFloat32 && p.head_dim % 8 == 0;
  if (p.seqlen_q < kPackMinSeqlenQ || p.seqlen_k == 0) return false;
  if (!key_panels && p.k_row_stride == p.head_dim && p.v_row_stride == p.head_dim)
    return false;  // rows already contiguous
  const int64_t v_row_elems =
      p.dtype == DType::kFloat64 ? avx2_v_tile_stride<double>(p.head_dim) : avx2_v_tile_stride<float>(p.head_dim);
  const int64_t heads = p.batch * p.heads_kv;
  const int64_t k_head_bytes = (key_panels ? round_up(p.seqlen_k, kPanelKeys) : p.seqlen_k) * row_bytes;
  const int64_t v_head_bytes = p.seqlen_k * v_row_elems * elem;
  if (k_head_bytes + v_head_bytes > kPackMaxBytes / heads) return false;
  // The packed rows start on a cache line: at new char[]'s address (16 bytes into a page, from
  // glibc, for a buffer this large) every V row and K^T panel row, 64 bytes per micro-tile step,
  // straddled two lines, and the fp32 kernel ran 4-10% slower on a Zen 3 core (benchmarks/NOTES.md).
  // Aligned by hand: from aligned operator new, glibc mapped and zeroed fresh pages on every call.
  constexpr int64_t kLine = 64;
  const int64_t bytes = heads * (k_head_bytes + v_head_bytes);
  packed->storage.reset(new (std::nothrow) char[bytes + kLine]);
  if (packed->storage == nullptr) return false;
  void* line = packed->storage.get();
  size_t space = bytes + kLine;
  char* k_out = static_cast<char*>(std::align(kLine, bytes, line, space));
  char* v_out = k_out + heads * k_head_bytes;
  global_thread_pool().parallel_for(2 * heads, [&](int64_t task) {
    const bool is_v = task >= heads;
    const int64_t bh = is_v ? task - heads : task;
    const int64_t b = bh / p.heads_kv, h = bh % p.heads_kv;
    const int64_t src_offset = is_v ? b * p.v_batch_stride + h * p.v_head_stride
                                    : b * p.k_batch_stride + h * p.k_head_stride;
    const char* src = static_cast<const char*>(is_v ? p.v : p.k) + src_offset * elem;
    if (!is_v && key_panels) {
      pack_key_panels(reinterpret_cast<const float*>(src), p.k_row_stride, p.seqlen_k, p.head_dim,
                      reinterpret_cast<float*>(k_out + bh * k_head_bytes));
      return;
    }
    const int64_t src_stride = (is_v ? p.v_row_stride : p.k_row_stride) * elem;
    const int64_t dst_stride = is_v ? v_row_elems * elem : row_bytes;
    char* dst = is_v ? v_out + bh * v_head_bytes : k_out + bh * k_head_bytes;
    for (int64_t j = 0; j < p.seqlen_k; ++j) std::memcpy(dst + j * dst_stride, src + j * src_stride, row_bytes);
  });
  AttentionParams& q = packed->params;
  q = p;
  q.v = v_out;
  q.v_row_stride = v_row_elems;
  q.v_head_stride = p.seqlen_k * v_row_elems;
  q.v_batch_stride = p.heads_kv * p.seqlen_k * v_row_elems;
  if (key_panels) {
    packed->panels.data = reinterpret_cast<const float*>(k_out);
    packed->panels.head_stride = k_head_bytes / elem;
    packed->panels.batch_stride = p.heads_kv * packed->panels.head_stride;
  } else {
    q.k = k_out;
    q.k_row_stride = p.head_dim;
    q.k_head_stride = p.seqlen_k * p.head_dim;
    q.k_batch_stride = p.heads_kv * p.seqlen_k * p.head_dim;
  }
  return true;
}
#endif  // WAVEBOOST_CPU_X86

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
  if (!params.is_dense()) return sequence_forward(params, kernel);
  const int64_t blocks_per_head = (params.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t num_tasks = params.batch * params.heads * blocks_per_head;
  PackedKv packed;
#ifdef WAVEBOOST_CPU_X86
  static const Isa isa = detect_isa();
  const AttentionParams& run = isa == Isa::kAvx2 && pack_kv(params, &packed) ? packed.params : params;
  const bool by_rows = packed.panels.data != nullptr;
#else
  const AttentionParams& run = params;
#endif

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
#ifdef WAVEBOOST_CPU_X86
      if (by_rows) {
        query_block_avx2_rows(run, packed.panels, block);
        return;
      }
#endif
      kernel(run, block);
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
