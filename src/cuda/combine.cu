// The LSE combine (include/waveboost/cuda/core/combine.cuh): its dispatch over part and output
// dtypes, and merge_attention_states on CUDA.
#include <cstdint>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/combine.cuh"

namespace waveboost::cuda {
namespace core {
namespace {

bool aligned_to(const void* ptr, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(ptr) & (bytes - 1)) == 0; }

template <typename PartT, typename OutT>
Status launch_typed(const CombineParams& p, cudaStream_t stream) {
  using namespace combine_detail;
  const int64_t rows = p.batch * p.seqlen * p.heads;
  if (rows == 0) return Status::Ok();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > INT32_MAX)
    return Status::NotSupported("combine: batch * seqlen * heads up to " + std::to_string(int64_t{INT32_MAX} * kRowsPerBlock) +
                                " rows; got " + std::to_string(rows));
  // 4-element vector accesses: every stride that is applied a multiple of 4, the bases aligned.
  const bool vector = p.head_dim % 4 == 0 && aligned_to(p.parts, 4 * sizeof(PartT)) &&
                      aligned_to(p.out, 4 * sizeof(OutT)) &&
                      ((p.part_stride | p.part_batch_stride | p.part_row_stride | p.part_head_stride |
                        p.o_batch_stride | p.o_row_stride | p.o_head_stride) & 3) == 0;
  if (vector && p.num_parts <= kFewParts && p.head_dim <= kManyMaxDim) {
    // One round trip per row, with as few registers as the part count allows.
    const auto few = p.num_parts <= 2   ? combine_few_kernel<2, PartT, OutT>
                     : p.num_parts <= 4 ? combine_few_kernel<4, PartT, OutT>
                                        : combine_few_kernel<kFewParts, PartT, OutT>;
    few<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
    return cuda_status(cudaGetLastError(), "combine_few_kernel launch");
  }
  if (vector && p.num_parts > kManyParts && p.head_dim <= kManyMaxDim) {
    // 2-8 warps per row, each with at most kManyParts parts where 8 warps allow.
    int warps_per_row = 2;
    while (warps_per_row < 8 && int64_t{warps_per_row} * kManyParts < p.num_parts) warps_per_row *= 2;
    const int64_t rows_per_block = kThreads / kGroup / warps_per_row;
    const int64_t many_blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (many_blocks <= INT32_MAX) {
      combine_many_kernel<PartT, OutT><<<static_cast<unsigned>(many_blocks), kThreads, 0, stream>>>(p, warps_per_row);
      return cuda_status(cudaGetLastError(), "combine_many_kernel launch");
    }
  }
  const auto kernel = vector ? combine_kernel<PartT, OutT, true> : combine_kernel<PartT, OutT, false>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "combine_kernel launch");
}

template <typename PartT>
Status launch_for_part(const CombineParams& p, DType out_dtype, cudaStream_t stream) {
  switch (out_dtype) {
    case DType::kFloat16: return launch_typed<PartT, __half>(p, stream);
    case DType::kBFloat16: return launch_typed<PartT, __nv_bfloat16>(p, stream);
    case DType::kFloat32: return launch_typed<PartT, float>(p, stream);
    default: break;
  }
  return Status::NotSupported(std::string("combine on CUDA writes float16, bfloat16 or float32; got ") +
                              dtype_name(out_dtype));
}

}  // namespace

Status launch_combine(const CombineParams& p, DType part_dtype, DType out_dtype, cudaStream_t stream) {
  switch (part_dtype) {
    case DType::kFloat16: return launch_for_part<__half>(p, out_dtype, stream);
    case DType::kBFloat16: return launch_for_part<__nv_bfloat16>(p, out_dtype, stream);
    case DType::kFloat32: return launch_for_part<float>(p, out_dtype, stream);
    default: break;
  }
  return Status::NotSupported(std::string("combine on CUDA reads float16, bfloat16 or float32 parts; got ") +
                              dtype_name(part_dtype));
}

}  // namespace core

Status merge_attention_states(const MergeStatesParams& m, void* stream) {
  for (auto [value, name] : {std::pair{m.num_parts, "num_parts"}, {m.batch, "batch"}, {m.seqlen, "seqlen"},
                             {m.heads, "heads"}, {m.head_dim, "head_dim"}}) {
    if (value < 0) return Status::InvalidArgument(std::string(name) + " must be >= 0; got " + std::to_string(value));
  }
  for (auto [dtype, name] : {std::pair{m.outs_dtype, "outs"}, {m.dtype, "out"}}) {
    if (dtype != DType::kFloat16 && dtype != DType::kBFloat16 && dtype != DType::kFloat32)
      return Status::NotSupported(std::string("merge_attention_states on CUDA: ") + name +
                                  " must be float16, bfloat16 or float32; got " + dtype_name(dtype));
  }
  const int64_t rows = m.batch * m.seqlen * m.heads;
  if (rows == 0 || m.head_dim == 0) return Status::Ok();
  if (m.out == nullptr) return Status::InvalidArgument("merge_attention_states: out is a null pointer");
  if (m.num_parts > 0 && (m.outs == nullptr || m.lses == nullptr))
    return Status::InvalidArgument("merge_attention_states: outs or lses is a null pointer");
  core::CombineParams c;
  c.parts = m.outs;
  c.part_stride = m.outs_part_stride;
  c.part_batch_stride = m.outs_batch_stride;
  c.part_row_stride = m.outs_row_stride;
  c.part_head_stride = m.outs_head_stride;
  c.part_lse = m.lses;
  c.lse_part_stride = m.lses_part_stride;
  c.lse_batch_stride = m.lses_batch_stride;
  c.lse_head_stride = m.lses_head_stride;
  c.lse_row_stride = m.lses_row_stride;
  c.out = m.out;
  c.o_batch_stride = m.o_batch_stride;
  c.o_row_stride = m.o_row_stride;
  c.o_head_stride = m.o_head_stride;
  c.lse = m.lse;
  c.lse_out_batch_stride = m.lse_batch_stride;
  c.lse_out_head_stride = m.lse_head_stride;
  c.num_parts = m.num_parts;
  c.batch = m.batch;
  c.seqlen = m.seqlen;
  c.heads = m.heads;
  c.head_dim = m.head_dim;
  DeviceGuard guard(m.device_id);
  if (!guard.status().ok()) return guard.status();
  return core::launch_combine(c, m.outs_dtype, m.dtype, static_cast<cudaStream_t>(stream));
}

}  // namespace waveboost::cuda
