// Host side of TMA (tma_primitives.cuh): tensor maps for the Hopper kernels, through the runtime's
// driver entry point (no link against libcuda).
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>

#include "waveboost/cuda/tma_primitives.cuh"

namespace waveboost::cuda::tma {

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

namespace {
// The byte strides of a rows map's dimensions above the first, an extent-1 dimension's replaced by
// the span below it (never used); false where TMA cannot describe the tensor.
bool rows_map_strides(const void* base, DType dtype, int64_t head_dim, const int64_t (&extents)[4],
                      const int64_t (&element_strides)[3], int64_t (&strides)[3]) {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16 && dtype != DType::kFloat8E4M3) return false;
  const int64_t bytes = dtype_size(dtype);
  int64_t span = head_dim * bytes;
  for (int i = 0; i < 3; ++i) {
    strides[i] = element_strides[i] * bytes;
    if (extents[i + 1] == 1) strides[i] = (span + 15) / 16 * 16;
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= (int64_t{1} << 40)) return false;
    span = strides[i] * extents[i + 1];
  }
  for (int64_t e : extents) {
    if (e <= 0 || e >= (int64_t{1} << 31)) return false;
  }
  return reinterpret_cast<uintptr_t>(base) % 16 == 0;
}
}  // namespace

bool rows_map_fits(const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                   int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  int64_t strides[3];
  return rows_map_strides(base, dtype, head_dim, {head_dim, rows, heads, batch}, {row_stride, head_stride, batch_stride},
                          strides);
}

namespace {
// The extent of the key rows and of the batch of a call's K/V maps: a page and the pages when
// paged, the packed keys with cu_seqlens_k, else a sequence and the batch.
int64_t kv_rows(const AttentionParams& p) {
  return p.is_paged() ? p.page_size : (p.is_varlen_k() ? p.total_k : p.seqlen_k);
}
int64_t kv_batch(const AttentionParams& p) { return p.is_paged() ? p.num_pages : (p.is_varlen_k() ? 1 : p.batch); }
}  // namespace

bool kv_maps_fit(const AttentionParams& p) {
  return rows_map_fits(p.k, p.dtype, p.head_dim, kv_rows(p), p.heads_kv, kv_batch(p), p.k_row_stride,
                       p.k_head_stride, p.k_batch_stride) &&
         rows_map_fits(p.v, p.dtype, p.head_dim, kv_rows(p), p.heads_kv, kv_batch(p), p.v_row_stride,
                       p.v_head_stride, p.v_batch_stride);
}

bool encode_kv_maps(const AttentionParams& p, int box_rows, CUtensorMap* k_map, CUtensorMap* v_map,
                    L2Promotion promotion) {
  return encode_rows_map(k_map, p.k, p.dtype, p.head_dim, kv_rows(p), p.heads_kv, kv_batch(p), p.k_row_stride,
                         p.k_head_stride, p.k_batch_stride, box_rows, promotion) &&
         encode_rows_map(v_map, p.v, p.dtype, p.head_dim, kv_rows(p), p.heads_kv, kv_batch(p), p.v_row_stride,
                         p.v_head_stride, p.v_batch_stride, box_rows, promotion);
}

bool encode_rows_map(CUtensorMap* map, const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads,
                     int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                     L2Promotion promotion) {
  int64_t strides[3];
  if (!rows_map_strides(base, dtype, head_dim, {head_dim, rows, heads, batch}, {row_stride, head_stride, batch_stride},
                        strides)) {
    return false;
  }
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t global_strides[3] = {static_cast<cuuint64_t>(strides[0]), static_cast<cuuint64_t>(strides[1]),
                                        static_cast<cuuint64_t>(strides[2])};
  // A box row is 128 B, the width of the swizzle: 64 16-bit or 128 8-bit elements.
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / dtype_size(dtype)), static_cast<cuuint32_t>(box_rows), 1,
                             1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = dtype == DType::kFloat16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  return encode(map, type, 4, const_cast<void*>(base), dims, global_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                promotion == L2Promotion::k128B ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace waveboost::cuda::tma
