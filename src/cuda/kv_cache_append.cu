// kv_cache_append on CUDA: checks, the choice of copy width, and the launches.
#include <cstdint>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/kv_cache_append.cuh"

namespace waveboost::cuda {
namespace {

template <int kElementBytes>
Status launch_append(const KVCacheAppendParams& p, int64_t blocks, cudaStream_t stream) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  constexpr int64_t kPerWord = 16 / kElementBytes;
  const int64_t strides = p.kc_batch_stride | p.kc_row_stride | p.kc_head_stride | p.vc_batch_stride |
                          p.vc_row_stride | p.vc_head_stride | p.kn_batch_stride | p.kn_row_stride |
                          p.kn_head_stride | p.vn_batch_stride | p.vn_row_stride | p.vn_head_stride | p.head_dim;
  const bool vector = aligned(p.k_cache) && aligned(p.v_cache) && aligned(p.k_new) && aligned(p.v_new) &&
                      strides % kPerWord == 0;
  using Element = std::conditional_t<kElementBytes == 2, uint16_t,
                                     std::conditional_t<kElementBytes == 4, uint32_t, uint64_t>>;
  const auto kernel = vector ? kv_cache_append_kernel<uint4, kElementBytes>
                             : kv_cache_append_kernel<Element, kElementBytes>;
  kernel<<<static_cast<unsigned>(blocks), kv_append_detail::kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "kv_cache_append_kernel launch");
}

}  // namespace

Status kv_cache_append(const KVCacheAppendParams& p, void* stream) {
  for (auto [value, name] : {std::pair{p.batch, "batch"}, {p.seqlen_new, "seqlen_new"}, {p.heads_kv, "heads_kv"},
                             {p.head_dim, "head_dim"}, {p.capacity, "capacity"}}) {
    if (value < 0) return Status::InvalidArgument(std::string(name) + " must be >= 0; got " + std::to_string(value));
  }
  const int bytes = dtype_size(p.dtype);
  if (bytes == 0) return Status::InvalidArgument("kv_cache_append: dtype is not one of float16, bfloat16, float32, float64");
  if (p.block_table != nullptr && (p.page_size < 1 || p.num_pages < 1))
    return Status::InvalidArgument("kv_cache_append: page_size and num_pages must be >= 1 with a block_table; got " +
                                   std::to_string(p.page_size) + " and " + std::to_string(p.num_pages));
  const int64_t rows = p.batch * p.seqlen_new * p.heads_kv;
  const bool copies = rows > 0 && p.head_dim > 0;
  if (p.batch > 0 && p.cache_seqlens == nullptr && (copies || p.seqused_out != nullptr))
    return Status::InvalidArgument("kv_cache_append: cache_seqlens is a null pointer");
  if (copies && (p.k_cache == nullptr || p.v_cache == nullptr || p.k_new == nullptr || p.v_new == nullptr))
    return Status::InvalidArgument("kv_cache_append: k_cache, v_cache, k_new or v_new is a null pointer");
  const int64_t blocks = (rows + kv_append_detail::kRowsPerBlock - 1) / kv_append_detail::kRowsPerBlock;
  if (blocks > INT32_MAX || p.batch > INT32_MAX)
    return Status::NotSupported("kv_cache_append: batch * seqlen_new * heads_kv up to " +
                                std::to_string(int64_t{INT32_MAX} * kv_append_detail::kRowsPerBlock) + "; got " +
                                std::to_string(rows));
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  if (copies) {
    Status st;
    switch (bytes) {
      case 2: st = launch_append<2>(p, blocks, s); break;
      case 4: st = launch_append<4>(p, blocks, s); break;
      default: st = launch_append<8>(p, blocks, s); break;
    }
    if (!st.ok()) return st;
  }
  // The append kernel wrote the lengths itself unless they alias cache_seqlens or it did not run.
  if (p.seqused_out != nullptr && p.batch > 0 && (!copies || p.seqused_out == p.cache_seqlens)) {
    kv_cache_lengths_kernel<int32_t><<<static_cast<unsigned>((p.batch + 255) / 256), 256, 0, s>>>(
        p.cache_seqlens, p.seqused_out, p.batch, p.seqlen_new);
    return cuda_status(cudaGetLastError(), "kv_cache_lengths_kernel launch");
  }
  return Status::Ok();
}

}  // namespace waveboost::cuda
