// Backend "wmma": can_implement and the dtype x head_dim dispatch of the tensor-core flash forward.
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/flash_wmma.cuh"

namespace waveboost::cuda {

Status wmma_can_implement(const AttentionParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("backend 'wmma' supports float16 and bfloat16; got ") +
                                dtype_name(p.dtype));
  }
  if (p.head_dim != 64 && p.head_dim != 128) {
    return Status::NotSupported("backend 'wmma' supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
  }
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  // fp16 wmma arrived with sm_70, bf16 wmma with sm_80.
  const int needed = p.dtype == DType::kBFloat16 ? 80 : 70;
  if (cc < needed) {
    return Status::NotSupported("backend 'wmma' needs compute capability >= " + cc_string(needed) + " for " +
                                dtype_name(p.dtype) + "; device " + std::to_string(p.device_id) + " has " +
                                cc_string(cc));
  }
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  if (flash_wmma_block_n(p.head_dim, smem_optin) == 0) {
    return Status::NotSupported("backend 'wmma' needs " + std::to_string(flash_wmma_min_smem_bytes(p.head_dim)) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  }
  if (Status s = folded_grid_check(p, kFlashWmmaBlockM, "wmma"); !s.ok()) return s;
  return Status::Ok();
}

Status wmma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  const auto unsupported = [&] {
    return Status::NotSupported(std::string("backend 'wmma' supports float16 and bfloat16 with head_dim 64 and 128; got ") +
                                dtype_name(p.dtype) + " with head_dim " + std::to_string(p.head_dim));
  };
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wmma<__half, 64>(p, s);
        case 128: return launch_flash_wmma<__half, 128>(p, s);
        default: return unsupported();
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wmma<__nv_bfloat16, 64>(p, s);
        case 128: return launch_flash_wmma<__nv_bfloat16, 128>(p, s);
        default: return unsupported();
      }
    default:
      return unsupported();
  }
}

}  // namespace waveboost::cuda
