// The wgmma backward (flash_bwd_wgmma.cuh): preprocess and convert kernels of the mma backward
// around the wgmma main kernel, for fp16/bf16 x head_dim 64/128; entry points for
// src/cuda/backward_launch.cu (compiled for every architecture).
//
// The main kernel is the warp-specialized one (TMA producer, dQ summed over the block) with dQ
// added by a writer warp's tensor bulk reductions ("tma", the default) or by the consumers' own
// 16 B reductions ("tma-red"); WAVEBOOST_WGMMA_BACKWARD names one of them or "cp.async", the
// kernel whose threads all copy behind a block barrier per step and add dQ per warpgroup. Where
// TMA cannot describe q, dout, k, v or the dQ accumulator, the cp.async kernel runs.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "waveboost/cuda/flash_bwd_wgmma.cuh"

namespace waveboost::cuda {

namespace {

enum class BwdPipeline { kCpAsync, kTmaReduce, kTmaBulk };

// Read at every call (a getenv beside three kernel launches), so that one process can time
// the kernels against each other. The default, "tma", is the fastest of the three at both head
// dims on an H100 (benchmarks/NOTES.md, "v2").
BwdPipeline backward_pipeline() {
  const char* v = std::getenv("WAVEBOOST_WGMMA_BACKWARD");
  if (v != nullptr && std::strcmp(v, "cp.async") == 0) return BwdPipeline::kCpAsync;
  if (v != nullptr && std::strcmp(v, "tma-red") == 0) return BwdPipeline::kTmaReduce;
  return BwdPipeline::kTmaBulk;
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
EncodeTiled encode_tiled() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<EncodeTiled>(ptr);
    } else {
      cudaGetLastError();
    }
  });
  return fn;
}

// The 4-D map (head_dim, rows, heads, batch) of a BSHD-strided tensor, boxes of 64 columns x
// box_rows rows in the 128 B swizzle. The stride of an extent-1 dimension is never used: it is
// replaced by the span of the dimensions below it. false where TMA cannot describe the tensor.
template <typename Element>
bool encode_rows_map(CUtensorMap* map, const void* base, int64_t head_dim, int64_t rows, int64_t heads,
                     int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  constexpr int64_t kBytes = sizeof(Element);
  const int64_t extents[4] = {head_dim, rows, heads, batch};
  int64_t strides[3] = {row_stride * kBytes, head_stride * kBytes, batch_stride * kBytes};
  int64_t span = head_dim * kBytes;
  for (int i = 0; i < 3; ++i) {
    if (extents[i + 1] == 1) strides[i] = (span + 15) / 16 * 16;
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= (int64_t{1} << 40)) return false;
    span = strides[i] * extents[i + 1];
  }
  for (int64_t e : extents) {
    if (e <= 0 || e >= (int64_t{1} << 31)) return false;
  }
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t global_strides[3] = {static_cast<cuuint64_t>(strides[0]), static_cast<cuuint64_t>(strides[1]),
                                        static_cast<cuuint64_t>(strides[2])};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<Element, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                   : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dims, global_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The 2-D map (head_dim, rows) of the fp32 dQ accumulator, boxes of 32 columns x box_rows rows
// in the 128 B swizzle (the dQ tile of flash_bwd_wgmma_ws).
bool encode_accumulator_map(CUtensorMap* map, float* base, int64_t head_dim, int64_t rows, int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr || rows <= 0 || rows >= (int64_t{1} << 31)) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t global_strides[1] = {static_cast<cuuint64_t>(head_dim * sizeof(float))};
  const cuuint32_t box[2] = {32, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, global_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The warp-specialized kernel; NotSupported (nothing launched) where TMA cannot describe an input.
template <typename Element, int kHeadDim, bool kCausal>
Status launch_main_ws(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, const dim3& grid, bool bulk,
                      cudaStream_t stream) {
  using Traits = FlashBwdWgmmaWsTraits<Element, kHeadDim>;
  // The dQ writer counts steps (group x query blocks) in 32 bits.
  const int64_t m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (p.heads_kv <= 0 || (p.heads / p.heads_kv) * m_blocks >= (int64_t{1} << 31)) {
    return Status::NotSupported("more than 2^31 steps per key block");
  }
  flash_bwd_wgmma_ws::BackwardMaps maps;
  if (!encode_rows_map<Element>(&maps.q, p.q, p.head_dim, p.seqlen_q, p.heads, p.batch, p.q_row_stride,
                                p.q_head_stride, p.q_batch_stride, Traits::kBlockM) ||
      !encode_rows_map<Element>(&maps.dout, p.dout, p.head_dim, p.seqlen_q, p.heads, p.batch, p.do_row_stride,
                                p.do_head_stride, p.do_batch_stride, Traits::kBlockM) ||
      !encode_rows_map<Element>(&maps.k, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                                p.k_head_stride, p.k_batch_stride, Traits::kBlockN) ||
      !encode_rows_map<Element>(&maps.v, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                                p.v_head_stride, p.v_batch_stride, Traits::kBlockN) ||
      !encode_accumulator_map(&maps.dq_accum, ws.dq_accum, kHeadDim, p.batch * p.heads * ws.m_pad, Traits::kBlockM)) {
    return Status::NotSupported("TMA cannot describe q, dout, k, v or the dQ accumulator");
  }
  const auto kernel = bulk ? flash_bwd_wgmma_ws_kernel<Element, kHeadDim, kCausal, true>
                           : flash_bwd_wgmma_ws_kernel<Element, kHeadDim, kCausal, false>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<grid, Traits::kBlockThreads, Traits::kSmemBytes, stream>>>(p, ws, maps);
  return cuda_status(cudaGetLastError(), "flash_bwd_wgmma_ws_kernel launch");
}

template <typename Element, int kHeadDim, bool kCausal>
Status launch_main(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  dim3 grid;
  if (Status s = backward_grid(p, Traits::kBlockN, "wgmma", &grid); !s.ok()) return s;
  static_assert(FlashBwdWgmmaWsTraits<Element, kHeadDim>::kBlockN == Traits::kBlockN, "one grid for both kernels");
  const BwdPipeline pipeline = backward_pipeline();
  if (pipeline != BwdPipeline::kCpAsync) {
    const Status ws_status =
        launch_main_ws<Element, kHeadDim, kCausal>(p, ws, grid, pipeline == BwdPipeline::kTmaBulk, stream);
    if (ws_status.code() != StatusCode::kNotSupported) return ws_status;
  }
  const auto kernel = flash_bwd_wgmma_kernel<Element, kHeadDim, kCausal>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, ws);
  return cuda_status(cudaGetLastError(), "flash_bwd_wgmma_kernel launch");
}

template <typename Element, int kHeadDim>
Status launch(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  return launch_flash_backward<Element, kHeadDim, Traits::kBlockM>(p, workspace, stream, [&](const FlashBwdWorkspace& ws) {
    return p.is_causal ? launch_main<Element, kHeadDim, true>(p, ws, stream)
                       : launch_main<Element, kHeadDim, false>(p, ws, stream);
  });
}

}  // namespace

Status launch_flash_bwd_wgmma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  if (p.dtype == DType::kFloat16 && p.head_dim == 64) return launch<__half, 64>(p, workspace, stream);
  if (p.dtype == DType::kFloat16 && p.head_dim == 128) return launch<__half, 128>(p, workspace, stream);
  if (p.dtype == DType::kBFloat16 && p.head_dim == 64) return launch<__nv_bfloat16, 64>(p, workspace, stream);
  if (p.dtype == DType::kBFloat16 && p.head_dim == 128) return launch<__nv_bfloat16, 128>(p, workspace, stream);
  return Status::NotSupported(std::string("backend 'wgmma' (backward) supports float16 and bfloat16 with head_dim 64 "
                                          "and 128; got ") + dtype_name(p.dtype) + " with head_dim " +
                              std::to_string(p.head_dim));
}

int64_t flash_bwd_wgmma_block_n() {
  static_assert(FlashBwdWgmmaTraits<__half, 64>::kBlockN == FlashBwdWgmmaTraits<__nv_bfloat16, 128>::kBlockN);
  return FlashBwdWgmmaTraits<__half, 64>::kBlockN;
}

// The larger of the two kernels' (a device that fits it runs either).
int flash_bwd_wgmma_smem_bytes(int64_t head_dim) {
  const auto larger = [](int a, int b) { return a > b ? a : b; };
  switch (head_dim) {
    case 64: return larger(FlashBwdWgmmaTraits<__half, 64>::kSmemBytes, FlashBwdWgmmaWsTraits<__half, 64>::kSmemBytes);
    case 128:
      return larger(FlashBwdWgmmaTraits<__half, 128>::kSmemBytes, FlashBwdWgmmaWsTraits<__half, 128>::kSmemBytes);
    default: return 0;
  }
}

}  // namespace waveboost::cuda
