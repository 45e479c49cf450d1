// The warp-specialized wgmma forward (flash_wgmma_ws.cuh): tensor maps, launch, and the
// instantiations reached by src/cuda/flash_wgmma_launch.cu (fp16/bf16 x head_dim 64/128).
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "waveboost/cuda/flash_wgmma_ws.cuh"

namespace waveboost::cuda {

namespace {

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

// The 4-D map (head_dim, keys, kv heads, batch) of K or V, boxes of 64 columns x box_rows
// rows in the 128 B swizzle. false where TMA cannot describe the tensor (strides not 16 B
// multiples or not positive, a base not 16 B aligned).
template <typename Element>
bool encode_kv_map(CUtensorMap* map, const void* base, const AttentionParams& p, int64_t row_stride,
                   int64_t head_stride, int64_t batch_stride, int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  constexpr int64_t kBytes = sizeof(Element);
  const int64_t strides[3] = {row_stride * kBytes, head_stride * kBytes, batch_stride * kBytes};
  for (int64_t s : strides) {
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
  }
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.seqlen_k),
                              static_cast<cuuint64_t>(p.heads_kv), static_cast<cuuint64_t>(p.batch)};
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

}  // namespace

template <typename Element, int kHeadDim>
Status launch_flash_wgmma_ws(const AttentionParams& p, cudaStream_t stream) {
  using Traits = FlashWgmmaWsDefaultTraits<Element, kHeadDim>;
  if (p.seqlen_k <= 0 || p.seqlen_k >= (int64_t{1} << 31) || p.is_varlen_q() || p.is_varlen_k() || p.is_paged() ||
      p.seqused_k != nullptr) {
    return Status::NotSupported("the warp-specialized wgmma kernel runs dense batches with keys");
  }
  CUtensorMap k_map, v_map;
  if (!encode_kv_map<Element>(&k_map, p.k, p, p.k_row_stride, p.k_head_stride, p.k_batch_stride, Traits::kBlockN) ||
      !encode_kv_map<Element>(&v_map, p.v, p, p.v_row_stride, p.v_head_stride, p.v_batch_stride, Traits::kBlockN)) {
    return Status::NotSupported("TMA cannot describe k or v (strides must be positive multiples of 16 bytes)");
  }
  if (Status s = folded_grid_check(p, Traits::kBlockM, "wgmma"); !s.ok()) return s;
  const FoldedGrid g = folded_grid(p, Traits::kBlockM);
  const auto kernel = p.is_causal ? flash_wgmma_ws_kernel<Element, kHeadDim, true>
                                  : flash_wgmma_ws_kernel<Element, kHeadDim, false>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
  kernel<<<grid, Traits::kBlockThreads, Traits::kSmemBytes, stream>>>(p, k_map, v_map);
  return cuda_status(cudaGetLastError(), "flash_wgmma_ws_kernel launch");
}

Status launch_flash_wgmma_ws_dispatch(const AttentionParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat16:
      if (p.head_dim == 64) return launch_flash_wgmma_ws<__half, 64>(p, stream);
      if (p.head_dim == 128) return launch_flash_wgmma_ws<__half, 128>(p, stream);
      break;
    case DType::kBFloat16:
      if (p.head_dim == 64) return launch_flash_wgmma_ws<__nv_bfloat16, 64>(p, stream);
      if (p.head_dim == 128) return launch_flash_wgmma_ws<__nv_bfloat16, 128>(p, stream);
      break;
    default:
      break;
  }
  return Status::NotSupported("the warp-specialized wgmma kernel runs float16/bfloat16 at head_dim 64 and 128");
}

}  // namespace waveboost::cuda
