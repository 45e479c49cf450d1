// Host side of the warp-specialized wgmma forward (flash_wgmma_ws.cuh): the tensor maps of K and
// V. The kernels themselves are instantiated in src/cuda/sm90/generated/wgmma_tma_*.cu.
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>

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

}  // namespace

bool encode_kv_tensor_map(CUtensorMap* map, const void* base, const AttentionParams& p, int64_t row_stride,
                          int64_t head_stride, int64_t batch_stride, int box_rows) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  const int64_t bytes = dtype_size(p.dtype);
  const int64_t strides[3] = {row_stride * bytes, head_stride * bytes, batch_stride * bytes};
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
  const CUtensorMapDataType type =
      p.dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 4, const_cast<void*>(base), dims, global_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool wgmma_tma_applies(const AttentionParams& p) {
  if (!wgmma_ws_takes_layout(p) || (p.head_dim != 64 && p.head_dim != 128)) return false;
  const int box_rows = p.head_dim == 64 ? FlashWgmmaWsDefaultTraits<__half, 64>::kBlockN
                                        : FlashWgmmaWsDefaultTraits<__half, 128>::kBlockN;
  CUtensorMap k_map, v_map;
  return encode_kv_tensor_map(&k_map, p.k, p, p.k_row_stride, p.k_head_stride, p.k_batch_stride, box_rows) &&
         encode_kv_tensor_map(&v_map, p.v, p, p.v_row_stride, p.v_head_stride, p.v_batch_stride, box_rows);
}

}  // namespace waveboost::cuda
