// Host side of the wgmma backward (flash_bwd_wgmma.cuh): the choice of main kernel and the dQ
// accumulator's tensor map. The launches are instantiated in src/cuda/sm90/generated/bwd_wgmma.cu.
//
// The main kernel is the warp-specialized one (TMA producer, dQ summed over the block and added
// by a writer warp's tensor bulk reductions); WAVEBOOST_WGMMA_BACKWARD=cp.async names the kernel
// whose threads all copy behind a block barrier per step and add dQ per warpgroup. Where TMA
// cannot describe q, dout, k, v or the dQ accumulator, the cp.async kernel runs, except with
// deterministic=True: only the warp-specialized kernel adds dQ in a fixed order.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "waveboost/cuda/flash_bwd_wgmma.cuh"

namespace waveboost::cuda {

bool flash_bwd_wgmma_use_tma() {
  const char* v = std::getenv("WAVEBOOST_WGMMA_BACKWARD");
  return v == nullptr || std::strcmp(v, "cp.async") != 0;
}

bool encode_dq_accumulator_map(CUtensorMap* map, float* base, int64_t head_dim, int64_t rows, int box_rows) {
  const tma::EncodeTiled encode = tma::encode_tiled();
  if (encode == nullptr || rows <= 0 || rows >= (int64_t{1} << 31)) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t global_strides[1] = {static_cast<cuuint64_t>(head_dim * sizeof(float))};
  const cuuint32_t box[2] = {32, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, global_strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

Status flash_bwd_wgmma_deterministic_applies(const AttentionBackwardParams& p) {
  if (!flash_bwd_wgmma_use_tma()) {
    return Status::NotSupported("backend 'wgmma' (backward) with WAVEBOOST_WGMMA_BACKWARD=cp.async adds dQ with "
                                "atomics: deterministic=True runs on 'mma'");
  }
  // The maps depend on the element type only through p.dtype (both types share the traits); checked,
  // not encoded.
  const Status s = p.head_dim == 64 ? flash_bwd_wgmma_launch::encode_input_maps<__half, 64>(p, nullptr)
                                    : flash_bwd_wgmma_launch::encode_input_maps<__half, 128>(p, nullptr);
  if (s.ok()) return s;
  return Status::NotSupported("backend 'wgmma' (backward, deterministic=True) runs on its TMA kernel only: " +
                              s.message() + "; deterministic=True runs on 'mma' there");
}

int64_t flash_bwd_wgmma_block_n() {
  static_assert(FlashBwdWgmmaTraits<__half, 64>::kBlockN == FlashBwdWgmmaTraits<__nv_bfloat16, 128>::kBlockN);
  return FlashBwdWgmmaTraits<__half, 64>::kBlockN;
}

}  // namespace waveboost::cuda
