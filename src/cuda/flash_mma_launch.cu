// Backend "mma": can_implement and the dtype x head_dim dispatch of the mma.sync flash forward
// (16-bit: flash_mma.cuh; float32 on tf32 tensor cores, 3xTF32: flash_mma_tf32.cuh).
#include <cstdint>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/flash_mma.cuh"
#include "waveboost/cuda/flash_mma_tf32.cuh"

namespace waveboost::cuda {

Status mma_can_implement(const AttentionParams& p) {
  const bool fp32 = p.dtype == DType::kFloat32;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16 && !fp32) {
    return Status::NotSupported(std::string("backend 'mma' supports float16, bfloat16 and float32; got ") +
                                dtype_name(p.dtype));
  }
  if (p.head_dim != 64 && p.head_dim != 128) {
    return Status::NotSupported("backend 'mma' supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
  }
  if (!vector_friendly(p, fp32 ? 4 : 8)) {
    return Status::NotSupported(std::string("backend 'mma' needs 16-byte aligned q/k/v/out with strides that are "
                                            "multiples of ") +
                                (fp32 ? "4 elements for float32" : "8 elements for float16 and bfloat16"));
  }
  // A page is read one copy pass (16 keys at most) at a time: page sizes that are multiples of it.
  static_assert(FlashMmaTraits<__half, 64>::kRowsPerCopyPass <= 16 && FlashMmaTraits<__half, 128>::kRowsPerCopyPass <= 16);
  if (Status s = flash_sequence_layout_check(p, "mma", 16); !s.ok()) return s;
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  // cp.async, bf16 and tf32 mma.sync: sm_80 and later.
  if (cc < 80) {
    return Status::NotSupported("backend 'mma' needs compute capability >= 8.0; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  }
  const int64_t block_m = fp32 ? FlashMmaTf32Traits<64>::kBlockM : FlashMmaTraits<__half, 64>::kBlockM;
  static_assert(FlashMmaTf32Traits<64>::kBlockM == FlashMmaTf32Traits<128>::kBlockM &&
                FlashMmaTraits<__half, 64>::kBlockM == FlashMmaTraits<__nv_bfloat16, 128>::kBlockM);
  if (Status s = folded_grid_check(p, block_m, "mma"); !s.ok()) return s;
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  const int smem_bytes = fp32 ? flash_mma_tf32_smem_bytes(p.head_dim) : flash_mma_smem_bytes(p.head_dim);
  if (smem_bytes > smem_optin) {
    return Status::NotSupported("backend 'mma' needs " + std::to_string(smem_bytes) +
                                " bytes of shared memory per block for " + dtype_name(p.dtype) + " with head_dim " +
                                std::to_string(p.head_dim) + "; device " + std::to_string(p.device_id) + " allows " +
                                std::to_string(smem_optin));
  }
  return Status::Ok();
}

Status mma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  const auto unsupported = [&] {
    return Status::NotSupported(std::string("backend 'mma' supports float16, bfloat16 and float32 with head_dim 64 and "
                                            "128; got ") +
                                dtype_name(p.dtype) + " with head_dim " + std::to_string(p.head_dim));
  };
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_mma<__half, 64>(p, s);
        case 128: return launch_flash_mma<__half, 128>(p, s);
        default: return unsupported();
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_mma<__nv_bfloat16, 64>(p, s);
        case 128: return launch_flash_mma<__nv_bfloat16, 128>(p, s);
        default: return unsupported();
      }
    case DType::kFloat32:
      switch (p.head_dim) {
        case 64: return launch_flash_mma_tf32<64>(p, s);
        case 128: return launch_flash_mma_tf32<128>(p, s);
        default: return unsupported();
      }
    default:
      return unsupported();
  }
}

}  // namespace waveboost::cuda
