// waveboost: exact attention, framework-free C++ API.
//
// Layout is BSHD: q is (batch, seqlen_q, heads, head_dim); k and v are
// (batch, seqlen_k, heads_kv, head_dim). Every tensor is described by a raw
// pointer plus int64 element strides per batch, row (sequence position) and
// head; the last dimension must have unit stride. Output has q's shape and
// dtype; lse (optional) is float32 (batch, heads, seqlen_q).
//
// The parameters are layered: AttentionParams describes one forward call (dense,
// or with the sequence-layout fields set: varlen, seqused, paged);
// AttentionBackwardParams extends it with the tensors of the backward pass.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "waveboost/status.h"

namespace waveboost {

// kFloat8E4M3: OCP float8 e4m3 ("e4m3fn": no infinities, max 448), inputs only (q, k, v of the
// wgmma forward); the output is then AttentionParams::out_dtype.
enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3, kFloat8E4M3 = 4 };

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

// Kernel paths. kAuto resolves to the fastest correct path for the device,
// dtype and head dim (see select_backend).
enum class Backend : int32_t {
  kAuto = 0,
  kCPU = 1,    // tiled online-softmax on the host, fp32/fp64, any head dim
  kNaive = 2,  // CUDA: materialized scores, softmax, then PV (the GPU baseline)
  kSimt = 3,   // CUDA cores flash forward, head dims 64/128
  kWmma = 4,   // tensor-core (nvcuda::wmma) flash forward, fp16/bf16, head dims 64/128
  kMma = 5,    // tensor-core flash forward on raw mma.sync + ldmatrix, fp16/bf16, head dims 64/128
  kWgmma = 6,  // Hopper (sm_90a) flash forward on warpgroup wgmma, fp16/bf16, head dims 64/128
  kDecode = 7, // CUDA split-KV decode (few queries per sequence, GQA heads packed per tile), fp16/bf16
};

// Every backend, kAuto first, in the enum's order: the one list of names (backend_name gives each
// one's) that parse_backend, the bindings and waveboost.BACKENDS read.
inline constexpr Backend kAllBackends[] = {Backend::kAuto, Backend::kCPU,  Backend::kNaive, Backend::kSimt,
                                           Backend::kWmma, Backend::kMma,  Backend::kWgmma, Backend::kDecode};

// Everything a forward call needs, passed by value to kernels. POD on purpose:
// no framework, DLPack or std types, so it can be a __grid_constant__ parameter.
struct AttentionParams {
  const void* q = nullptr;  // (batch, seqlen_q, heads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, heads_kv, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, heads_kv, head_dim)
  void* out = nullptr;      // (batch, seqlen_q, heads, head_dim), dtype of q
  float* lse = nullptr;     // optional (batch, heads, seqlen_q) natural-log logsumexp; nullptr = not wanted

  // Element strides (not bytes). The head_dim stride is 1 for every tensor. A stride of a dimension
  // of extent > 1 is 0 (a broadcast; inputs only) or at least head_dim in magnitude (negative is
  // fine); out's rows, heads and batches must not overlap. Otherwise kInvalidArgument.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads = 0;     // query heads
  int64_t heads_kv = 0;  // key/value heads; heads % heads_kv == 0 (GQA/MQA)
  int64_t head_dim = 0;

  // Multiplies q.k before the softmax. The default, kDefaultSoftmaxScale (NaN), stands for
  // 1 / sqrt(head_dim); any finite value (0 and negatives included) is used as given.
  double softmax_scale = std::numeric_limits<double>::quiet_NaN();
  // Bottom-right aligned causal mask: query i sees key j iff j <= i + seqlen_k - seqlen_q.
  bool is_causal = false;

  DType dtype = DType::kFloat32;  // of q, k, v and out (out: out_dtype when dtype is kFloat8E4M3)
  DeviceType device_type = DeviceType::kCPU;
  int device_id = 0;  // CUDA ordinal when device_type == kCUDA

  // ---- Sequence layout (all null / 0: dense BSHD, every sequence seqlen_q x seqlen_k) ----
  // Device (or, on the CPU, host) int32 arrays; nothing here is read on the host by CUDA paths,
  // so a call can be captured in a CUDA graph.
  //
  // Variable-length batches: with cu_seqlens_q, q/out are packed (total_q, heads, head_dim) and
  // sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]); q_batch_stride and
  // o_batch_stride are unused, seqlen_q is an upper bound on every sequence's length (it sizes
  // the grid), and lse is (heads, total_q) (lse_batch_stride unused). cu_seqlens_k likewise for
  // k/v (total_k, heads_kv, head_dim) with seqlen_k an upper bound.
  const int32_t* cu_seqlens_q = nullptr;  // (batch + 1), non-decreasing, [0] == 0
  const int32_t* cu_seqlens_k = nullptr;  // (batch + 1)
  // With cu_seqlens_k: the packed rows of k/v (their first extent), which the Hopper TMA kernel
  // needs to describe them; 0 (unknown) makes that path decline, never a wrong read.
  int64_t total_k = 0;
  // Keys sequence b actually uses (a KV cache's fill), at most its capacity; nullptr: all of them.
  const int32_t* seqused_k = nullptr;  // (batch)
  // Paged K/V: k and v are (num_pages, page_size, heads_kv, head_dim), k_batch_stride and
  // v_batch_stride step one page, and key j of sequence b lives in page
  // block_table[b * block_table_batch_stride + j / page_size] at row j % page_size. seqlen_k is
  // the capacity of one sequence (max_pages * page_size); seqused_k gives the fill.
  const int32_t* block_table = nullptr;  // (batch, max_pages)
  int64_t block_table_batch_stride = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;

  // ---- FP8 inputs (dtype kFloat8E4M3) ----
  // q, k and v hold e4m3 values x / descale: each dequantizes by its descale factor, a device
  // float32 (batch, heads_kv) array (element strides; 0 repeats one value), nullptr for 1 (the
  // factors of q and k multiply softmax_scale, v's the output). out has out_dtype (kBFloat16 or
  // kFloat16). Unused for the other dtypes, whose out has dtype.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  DType out_dtype = DType::kBFloat16;

  bool is_fp8() const { return dtype == DType::kFloat8E4M3; }
  // The element type of out.
  DType output_dtype() const { return is_fp8() ? out_dtype : dtype; }

  bool is_varlen_q() const { return cu_seqlens_q != nullptr; }
  bool is_varlen_k() const { return cu_seqlens_k != nullptr; }
  bool is_paged() const { return block_table != nullptr; }
  bool is_dense() const { return !is_varlen_q() && !is_varlen_k() && !is_paged() && seqused_k == nullptr; }
};

// The softmax_scale that stands for 1 / sqrt(head_dim).
inline constexpr double kDefaultSoftmaxScale = std::numeric_limits<double>::quiet_NaN();

// The gradient of one attention call: the forward's inputs, its output (`out`, read here) and
// its logsumexp (`lse`, float32, read here, required), plus dout; writes dq, dk, dv. dk and dv
// have k's shape: with GQA each kv head's gradient sums over the query heads that read it (no
// repeat of K/V and no per-query-head buffer in the caller's memory).
struct AttentionBackwardParams : AttentionParams {
  const void* dout = nullptr;  // (batch, seqlen_q, heads, head_dim), dtype of q
  void* dq = nullptr;          // (batch, seqlen_q, heads, head_dim)
  void* dk = nullptr;          // (batch, seqlen_k, heads_kv, head_dim)
  void* dv = nullptr;          // (batch, seqlen_k, heads_kv, head_dim)
  // Optional gradient flowing into lse (float32, lse's layout): dS += dlse * P.
  const float* dlse = nullptr;

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  int64_t dlse_batch_stride = 0, dlse_head_stride = 0;  // dlse row stride is 1

  // Bitwise-reproducible gradients: reductions across blocks (dq over key blocks) in a fixed
  // order instead of atomics.
  bool deterministic = false;
};

// Runs the forward pass. `stream` is a cudaStream_t for CUDA data (nullptr =
// legacy default stream) and ignored on the CPU. CUDA work is asynchronous
// with respect to the host; no device-wide synchronization is done.
Status attention_forward(const AttentionParams& params, Backend backend, void* stream);

// Whether `backend` can run `params` on this build and machine; the status
// message says precisely why not. kAuto checks the backend it resolves to.
Status can_implement(const AttentionParams& params, Backend backend);

// The backend kAuto resolves to for these params.
Backend select_backend(const AttentionParams& params);

// What attention_forward would run for these params on `backend` (kAuto resolved): the backend,
// the kernel (a name of kernel_table(), or the backend's name for paths outside it: cpu, naive)
// and how many pieces the keys are cut into (split-KV: the pieces run as separate blocks and are
// merged after; 1: unsplit) and how the pieces merge. Nothing runs. The launchers take the same
// decisions from the same functions, so a test can assert which path a call takes whatever the
// device's SM count.
struct ForwardPlan {
  Backend backend = Backend::kAuto;
  std::string kernel;
  int num_splits = 1;
  // With num_splits > 1: "in-kernel" (the last piece to finish merges them) or "combine-kernel"
  // (a second kernel merges them); empty when unsplit.
  std::string merge;
  // A persistent grid (wgmma's TMA kernel): one wave of blocks taking the query blocks in turn
  // instead of a block per query block.
  bool persistent = false;
};
Status plan_forward(const AttentionParams& params, Backend backend, ForwardPlan* plan);

// Generic checks on shapes, strides, scale and pointers shared by every path.
Status validate(const AttentionParams& params);

// The backward pass: writes dq, dk, dv for the forward call `params` describes. Same stream
// semantics as attention_forward. Backends with a backward: cpu, naive, mma (see
// backend_has_backward); simt and wmma are forward-only.
Status attention_backward(const AttentionBackwardParams& params, Backend backend, void* stream);
Status can_implement(const AttentionBackwardParams& params, Backend backend);
Backend select_backend(const AttentionBackwardParams& params);
Status validate(const AttentionBackwardParams& params);
bool backend_has_backward(Backend backend);

// ---------------------------------------------------------------------------
// Serving pieces: merging partial results, appending to a KV cache.
// ---------------------------------------------------------------------------

// Attention over disjoint key sets, merged exactly through the LSE:
//   lse = log(sum_i exp(lse_i)),  out = sum_i exp(lse_i - lse) * out_i.
// Parts whose lse_i is -inf (saw no key) contribute nothing; if every part is -inf the row is
// zeros with lse -inf. Parts are (num_parts, batch, seqlen, heads, head_dim) in outs_dtype (fp32
// partials keep full precision between steps); lses float32 (num_parts, batch, heads, seqlen).
struct MergeStatesParams {
  const void* outs = nullptr;
  DType outs_dtype = DType::kFloat32;
  int64_t outs_part_stride = 0, outs_batch_stride = 0, outs_row_stride = 0, outs_head_stride = 0;
  const float* lses = nullptr;
  int64_t lses_part_stride = 0, lses_batch_stride = 0, lses_head_stride = 0, lses_row_stride = 0;

  void* out = nullptr;  // (batch, seqlen, heads, head_dim) in dtype
  DType dtype = DType::kFloat32;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float* lse = nullptr;  // optional (batch, heads, seqlen)
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // row stride 1

  int64_t num_parts = 0, batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  DeviceType device_type = DeviceType::kCPU;
  int device_id = 0;
};
Status merge_attention_states(const MergeStatesParams& params, void* stream);

// Writes k_new/v_new (batch, seqlen_new, heads_kv, head_dim) into a KV cache at each sequence's
// end: row i of sequence b lands at position cache_seqlens[b] + i. The cache is contiguous
// (batch, capacity, heads_kv, head_dim) or, with block_table, paged (num_pages, page_size,
// heads_kv, head_dim) with the batch strides stepping one page. When seqused_out is given it
// receives cache_seqlens[b] + seqlen_new (the keys an attention call over the cache then uses),
// so no length is read on the host. Positions past the capacity are an error the caller must
// avoid (checked only by the Python layer's validate=True).
struct KVCacheAppendParams {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t kc_batch_stride = 0, kc_row_stride = 0, kc_head_stride = 0;
  int64_t vc_batch_stride = 0, vc_row_stride = 0, vc_head_stride = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;
  const int32_t* cache_seqlens = nullptr;  // (batch)
  int32_t* seqused_out = nullptr;          // optional (batch)
  const int32_t* block_table = nullptr;    // optional (batch, max_pages)
  int64_t block_table_batch_stride = 0;
  int64_t page_size = 0, num_pages = 0;
  int64_t batch = 0, seqlen_new = 0, heads_kv = 0, head_dim = 0;
  int64_t capacity = 0;  // keys one sequence can hold (max_len, or max_pages * page_size)
  DType dtype = DType::kFloat32;
  DeviceType device_type = DeviceType::kCPU;
  int device_id = 0;
};
Status kv_cache_append(const KVCacheAppendParams& params, void* stream);

// `params` with softmax_scale resolved (kDefaultSoftmaxScale -> 1 / sqrt(head_dim)).
AttentionParams with_resolved_scale(const AttentionParams& params);
AttentionBackwardParams with_resolved_scale(const AttentionBackwardParams& params);

const char* backend_name(Backend backend);
const char* dtype_name(DType dtype);
// Bytes per element of `dtype` (0 for a value outside the enum).
inline constexpr int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat8E4M3: return 1;
  }
  return 0;
}
// Parses "auto", "cpu", "naive", "simt", "wmma", "mma", "wgmma", "decode"; false for anything else.
bool parse_backend(const std::string& name, Backend* backend);

// Whether `backend` can run on CUDA device `device_id` with this build (compiled
// in, compute capability high enough) for at least one dtype and head dim.
bool backend_available(Backend backend, int device_id);

// What one backend compiled into this build can run, found by asking its can_implement about
// synthetic calls (no kernel runs, no memory is touched): a dense forward per dtype and head dim,
// then causal, GQA, varlen, seqused and paged variants and the backward of the first dtype and
// head dim that runs. CUDA backends are asked about device `device_id`; without that device they
// are listed as not available, with nothing probed.
struct BackendCapabilities {
  Backend backend = Backend::kCPU;
  DeviceType device_type = DeviceType::kCPU;  // where its tensors live
  bool available = false;                     // a probe passes on this machine
  std::string reason;                         // when !available: why (can_implement's message)
  std::vector<DType> forward_dtypes;          // a dense forward passes at some probed head dim
  std::vector<DType> backward_dtypes;         // likewise the backward
  std::vector<int64_t> head_dims;             // probed head dims a forward passes at (some dtype)
  std::vector<int64_t> backward_head_dims;    // likewise the backward
  bool any_head_dim = false;                  // every probed head dim passes (a generic path)
  bool causal = false, gqa = false, varlen = false, seqused = false, paged = false;
  bool deterministic_backward = false;
};
// The head dims capabilities() probes: the specialized ones, others a generic path takes, and
// 512, past the naive path's limit, so that any_head_dim means no limit was found.
inline constexpr int64_t kProbedHeadDims[] = {8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 512};
// One record per backend compiled in (kAuto excluded), in the enum's order.
std::vector<BackendCapabilities> capabilities(int device_id = 0);

// One compiled CUDA kernel: a row of the registry the CUDA backends dispatch through (generated
// with the kernels from the table in src/cuda/kernels.py). What a row says is necessary for the
// kernel to run; the backend's can_implement adds what depends on the call (grid limits, page
// sizes, ...), and capabilities() gives the answer for a device.
struct KernelInfo {
  std::string name;      // e.g. "mma_hdim64_bf16"
  Backend backend = Backend::kAuto;
  bool backward = false;  // the pass: forward or backward
  std::string variant;   // "" the backend's general kernel; e.g. "tma", a faster one tried first
  DType dtype = DType::kFloat32;
  int64_t head_dim = 0;
  int min_compute_capability = 0;  // major * 10 + minor
  int max_compute_capability = 0;  // 0: no upper bound
  int vector_elements = 0;         // 16 B pieces of this many elements (base and strides aligned); 0: none
  int smem_bytes = -1;             // dynamic shared memory per block; -1: depends on the call
};
// The rows compiled into this build (empty without CUDA).
std::vector<KernelInfo> kernel_table();

// Blocks the host until `stream` on CUDA device `device_id` is idle (only for
// callers whose framework cannot order work after ours, e.g. eager JAX through DLPack).
Status stream_synchronize(int device_id, void* stream);

// Build facts.
const char* version();
bool cuda_compiled();
// Comma-separated CMAKE_CUDA_ARCHITECTURES the library was built for, e.g. "80,90" ("" without CUDA).
const char* cuda_architectures();
// The instruction set the CPU path runs with on this machine: "avx512", "avx2" (with FMA) or
// "baseline"; the environment variable WAVEBOOST_CPU_ISA=avx2|baseline caps it.
const char* cpu_isa();
// Threads the CPU path uses: WAVEBOOST_NUM_THREADS when set to a positive integer, else the hardware's count.
int cpu_num_threads();
// CUDA devices visible to this process: 0 without CUDA support, a driver or a GPU (never an error).
int cuda_device_count();
// e.g. "NVIDIA H100 80GB HBM3, compute capability 9.0"; empty when `device` does not exist.
std::string cuda_device_description(int device);

}  // namespace waveboost
