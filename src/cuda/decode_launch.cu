// Backend "decode": can_implement, the number of split-KV pieces, the workspace, and the
// dtype x head_dim dispatch of the decode kernel (include/waveboost/cuda/decode.cuh), which
// merges the split pieces of 16-row tiles itself; those of 64-row tiles go to the combine of
// include/waveboost/cuda/core/combine.cuh.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/combine.cuh"
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {
namespace {

// Blocks of the decode kernel one SM holds at once: its shared memory (100-112 KB) allows two
// on sm_90 (228 KB per SM).
constexpr int kDecodeBlocksPerSM = 2;

// How split-KV runs, by tile (benchmarks/NOTES.md, "Decode"; H100, bf16, head dim 128, GPU time of
// a CUDA-graph step). 16-row tiles (seqlen_q x group <= 16) stream the cache at 91% of peak with one
// block per SM (B = 16, 8k keys: 175.9 us whole, 188.8 us cut in two pieces for two blocks per SM),
// so their keys are cut to fill one block per SM, and the pieces are merged inside the decode
// kernel (B = 1, 2k keys: 14.0 us, 15.1 us with the combine kernel). 64-row tiles merge 32-64 rows
// per block, where the combine kernel is 10 us faster (B = 32, 8k keys, 32/1 heads: 62.8 vs 73.3 us),
// and stream better at two blocks per SM (62.8 vs 70.5 us).
//
// To measure these choices (read once per process): WAVEBOOST_DECODE_COMBINE=kernel or in-kernel
// picks the merge for every tile; WAVEBOOST_DECODE_BLOCKS_PER_SM=1 or 2 the wave that the split
// count fills; WAVEBOOST_DECODE_MAX_SPLITS=N (1..kDecodeMaxSplits) caps the pieces per (sequence,
// kv head).
int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n >= lo && n <= hi ? n : fallback;
}
bool merge_in_kernel(const AttentionParams& p) {
  static const int forced = [] {  // -1: by tile, 0: the combine kernel, 1: in the kernel
    const char* v = std::getenv("WAVEBOOST_DECODE_COMBINE");
    if (v != nullptr && std::strcmp(v, "kernel") == 0) return 0;
    if (v != nullptr && std::strcmp(v, "in-kernel") == 0) return 1;
    return -1;
  }();
  return forced >= 0 ? forced == 1 : decode_block_m(p) == 16;
}
int split_blocks_per_sm(const AttentionParams& p) {
  static const int forced = env_int("WAVEBOOST_DECODE_BLOCKS_PER_SM", 1, kDecodeBlocksPerSM, 0);
  return forced > 0 ? forced : (decode_block_m(p) == 16 ? 1 : kDecodeBlocksPerSM);
}
int max_splits() {
  static const int cap = env_int("WAVEBOOST_DECODE_MAX_SPLITS", 1, kDecodeMaxSplits, kDecodeMaxSplits);
  return cap;
}

// 16 B accesses: base pointers aligned, every applied stride a multiple of 8 elements. Packed
// (varlen) q/out and k/v apply no batch stride; a paged cache applies its page stride always.
bool decode_vector_friendly(const AttentionParams& p) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const auto used = [](int64_t stride, bool applied) { return applied ? stride : int64_t{0}; };
  const bool q_batched = !p.is_varlen_q() && p.batch > 1;
  const bool k_batched = p.is_paged() || (!p.is_varlen_k() && p.batch > 1);
  const int64_t strides = used(p.q_batch_stride, q_batched) | used(p.o_batch_stride, q_batched) |
                          p.q_row_stride | p.q_head_stride | p.o_row_stride | p.o_head_stride |
                          used(p.k_batch_stride, k_batched) | used(p.v_batch_stride, k_batched) | p.k_row_stride |
                          p.k_head_stride | p.v_row_stride | p.v_head_stride;
  return aligned(p.q) && aligned(p.k) && aligned(p.v) && aligned(p.out) && (strides & 7) == 0;
}

int64_t decode_row_tiles(const AttentionParams& p) {
  const int64_t block_m = decode_block_m(p);
  return (p.seqlen_q * (p.heads / p.heads_kv) + block_m - 1) / block_m;
}

// Pieces to cut each block's keys into. The grid without splits has batch x kv heads x row
// tiles blocks; when that is under split_blocks_per_sm per SM, the keys are cut so that the pieces
// fill one wave of split_blocks_per_sm per SM, each piece at least one key tile of the longest
// sequence. A grid of a full wave or more is left whole: merging pieces would only add work.
int decode_splits(const AttentionParams& p, int multiprocessors) {
  const int64_t blocks = p.batch * p.heads_kv * decode_row_tiles(p);
  const int64_t slots = int64_t{split_blocks_per_sm(p)} * multiprocessors;
  if (blocks <= 0 || blocks >= slots) return 1;
  const int64_t key_tiles = (p.seqlen_k + decode_block_n(p.head_dim) - 1) / decode_block_n(p.head_dim);
  int64_t splits = slots / blocks;
  splits = splits < key_tiles ? splits : key_tiles;
  splits = splits < max_splits() ? splits : max_splits();
  return splits > 1 ? static_cast<int>(splits) : 1;
}

Status launch(const AttentionParams& p, const DecodeSplit& split, cudaStream_t s) {
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return launch_decode_hdim64_fp16(p, split, s);
        case 128: return launch_decode_hdim128_fp16(p, split, s);
        default: break;
      }
      break;
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return launch_decode_hdim64_bf16(p, split, s);
        case 128: return launch_decode_hdim128_bf16(p, split, s);
        default: break;
      }
      break;
    default: break;
  }
  return Status::NotSupported(std::string("backend 'decode' supports float16 and bfloat16 with head_dim 64 and 128; "
                                          "got ") + dtype_name(p.dtype) + " with head_dim " + std::to_string(p.head_dim));
}

// core::combine over the pieces of `split` into p.out and p.lse.
Status combine_pieces(const AttentionParams& p, const DecodeSplit& split, cudaStream_t s) {
  core::CombineParams c;
  c.parts = split.o_accum;
  c.part_head_stride = p.head_dim;
  c.part_row_stride = p.heads * p.head_dim;
  c.part_batch_stride = p.seqlen_q * c.part_row_stride;
  c.part_stride = p.batch * c.part_batch_stride;
  c.part_lse = split.lse_accum;
  c.lse_row_stride = 1;
  c.lse_head_stride = p.seqlen_q;
  c.lse_batch_stride = p.heads * p.seqlen_q;
  c.lse_part_stride = p.batch * c.lse_batch_stride;
  c.out = p.out;
  c.o_batch_stride = p.o_batch_stride;
  c.o_row_stride = p.o_row_stride;
  c.o_head_stride = p.o_head_stride;
  c.lse = p.lse;
  c.lse_out_batch_stride = p.lse_batch_stride;
  c.lse_out_head_stride = p.lse_head_stride;
  c.cu_seqlens = p.cu_seqlens_q;
  c.num_parts = split.num_splits;
  c.batch = p.batch;
  c.seqlen = p.seqlen_q;
  c.heads = p.heads;
  c.head_dim = p.head_dim;
  return core::launch_combine(c, DType::kFloat32, p.dtype, s);
}

}  // namespace

Status decode_can_implement(const AttentionParams& p) {
  if (p.device_type != DeviceType::kCUDA)
    return Status::NotSupported("backend 'decode' runs on CUDA devices; got tensors on the CPU");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return Status::NotSupported(std::string("backend 'decode' supports float16 and bfloat16; got ") +
                                dtype_name(p.dtype));
  if (p.head_dim != 64 && p.head_dim != 128)
    return Status::NotSupported("backend 'decode' supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
  if (!decode_vector_friendly(p))
    return Status::NotSupported(
        "backend 'decode' needs 16-byte aligned q/k/v/out with strides that are multiples of 8 elements");
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  if (cc < 80)  // cp.async and bf16 mma.sync
    return Status::NotSupported("backend 'decode' needs compute capability >= 8.0; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  if (p.heads_kv > 0) {
    const int64_t blocks = p.batch * p.heads_kv * decode_row_tiles(p);
    if (blocks > INT32_MAX)
      return Status::NotSupported("backend 'decode' runs up to 2147483647 blocks (query row tiles x batch x heads_kv); "
                                  "got " + std::to_string(blocks));
  }
  int smem_optin = 0;
  WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device_id));
  const int smem_needed = p.heads_kv > 0 ? decode_smem_bytes(p) : 0;
  if (smem_needed > smem_optin)
    return Status::NotSupported("backend 'decode' needs " + std::to_string(smem_needed) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  return Status::Ok();
}

Status decode_forward(const AttentionParams& p, void* stream) {
  if (p.batch == 0 || p.heads == 0 || p.seqlen_q == 0) return Status::Ok();
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  int multiprocessors = 0;
  if (Status st = multiprocessor_count(p.device_id, &multiprocessors); !st.ok()) return st;
  DecodeSplit split;
  split.num_splits = decode_splits(p, multiprocessors);
  if (split.num_splits == 1) return launch(p, split, s);

  // Pieces: O (fp32) [split][b][i][h][d] and LSE [split][b][h][i]. splits x blocks <= 2 x SMs,
  // so at most 2 x SMs x 64 rows (8.7 MB at head dim 128 on an H100), kept by the pool. Then,
  // for the merge in the kernel, an arrival counter per row tile of each (sequence, kv head).
  const bool in_kernel = merge_in_kernel(p);
  const size_t floats = static_cast<size_t>(split.num_splits) * p.batch * p.seqlen_q * p.heads;
  const size_t counters = in_kernel ? static_cast<size_t>(p.batch * p.heads_kv * decode_row_tiles(p)) : 0;
  const size_t bytes = floats * (p.head_dim + 1) * sizeof(float) + counters * sizeof(int);
  cudaMemPool_t pool = nullptr;
  if (Status st = workspace_pool(p.device_id, &pool); !st.ok()) return st;
  void* workspace = nullptr;
  if (const cudaError_t err = cudaMallocFromPoolAsync(&workspace, bytes, pool, s); err != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory here must not be reported again by the next unrelated check
    return cuda_status(err, ("cudaMallocFromPoolAsync of the decode split-KV workspace (" + std::to_string(bytes) +
                             " bytes)").c_str());
  }
  split.o_accum = static_cast<float*>(workspace);
  split.lse_accum = split.o_accum + floats * p.head_dim;
  Status status = Status::Ok();
  if (in_kernel) {
    // The counters start at 0: cleared in this stream, right before the kernel. They live in this
    // call's workspace, which no other launch touches between its stream-ordered allocation and
    // free (a concurrent call on another stream, or another graph, gets other memory), so calls on
    // any streams and replays of captured graphs never share counters.
    split.arrivals = reinterpret_cast<int*>(split.lse_accum + floats);
    status = cuda_status(cudaMemsetAsync(split.arrivals, 0, counters * sizeof(int), s),
                         "cudaMemsetAsync of the decode arrival counters");
  }
  if (status.ok()) status = launch(p, split, s);
  if (status.ok() && !in_kernel) status = combine_pieces(p, split, s);
  const Status freed = cuda_status(cudaFreeAsync(workspace, s), "cudaFreeAsync of the decode split-KV workspace");
  return status.ok() ? freed : status;
}

}  // namespace waveboost::cuda
