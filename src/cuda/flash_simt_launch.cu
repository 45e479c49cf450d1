// Host side of backend "simt": what it can run, and the exact dispatch over
// dtype x head dim onto the explicit instantiations in flash_simt_hdim*.cu.
#include <string>

#include "cuda/cuda_paths.h"
#include "waveboost/cuda/flash_simt.cuh"

namespace waveboost::cuda {

namespace {

// Shared memory one block of the (dtype, head dim) instantiation needs, or 0
// when there is none.
int simt_smem_bytes(DType dtype, int64_t head_dim) {
  switch (dtype) {
    case DType::kFloat32:
      return head_dim == 64 ? FlashSimtTraits<float, 64>::kSmemBytes
                            : head_dim == 128 ? FlashSimtTraits<float, 128>::kSmemBytes : 0;
    case DType::kFloat16:
      return head_dim == 64 ? FlashSimtTraits<__half, 64>::kSmemBytes
                            : head_dim == 128 ? FlashSimtTraits<__half, 128>::kSmemBytes : 0;
    case DType::kBFloat16:
      return head_dim == 64 ? FlashSimtTraits<__nv_bfloat16, 64>::kSmemBytes
                            : head_dim == 128 ? FlashSimtTraits<__nv_bfloat16, 128>::kSmemBytes : 0;
    default:
      return 0;
  }
}

template <typename Element>
Status dispatch_head_dim(const AttentionParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return launch_flash_simt<Element, 64>(params, stream);
    case 128:
      return launch_flash_simt<Element, 128>(params, stream);
    default:
      return Status::NotSupported("backend 'simt' supports head_dim 64 and 128; got " +
                                  std::to_string(params.head_dim));
  }
}

}  // namespace

Status simt_can_implement(const AttentionParams& params) {
  if (params.dtype != DType::kFloat32 && params.dtype != DType::kFloat16 && params.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("backend 'simt' supports float32, float16 and bfloat16; got ") +
                                dtype_name(params.dtype));
  }
  if (params.head_dim != 64 && params.head_dim != 128) {
    return Status::NotSupported("backend 'simt' supports head_dim 64 and 128; got " +
                                std::to_string(params.head_dim));
  }
  if (params.dtype == DType::kBFloat16) {
    int cc = 0;
    const Status status = compute_capability(params.device_id, &cc);
    if (!status.ok()) return status;
    if (cc < 80) {
      return Status::NotSupported("backend 'simt' supports bfloat16 on compute capability >= 8.0; device " +
                                  std::to_string(params.device_id) + " is " + cc_string(cc));
    }
  }
  // kBlockM is 64 in every instantiation.
  if (Status s = flash_simt_grid_check(params, FlashSimtTraits<float, 64>::kBlockM); !s.ok()) return s;
  static_assert(FlashSimtTraits<float, 64>::kBlockM == FlashSimtTraits<__half, 128>::kBlockM &&
                FlashSimtTraits<float, 128>::kBlockM == FlashSimtTraits<__nv_bfloat16, 64>::kBlockM);
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(params.device_id, &smem_optin); !s.ok()) return s;
  const int smem_bytes = simt_smem_bytes(params.dtype, params.head_dim);
  if (smem_bytes > smem_optin) {
    return Status::NotSupported("backend 'simt' needs " + std::to_string(smem_bytes) +
                                " bytes of shared memory per block at head_dim " + std::to_string(params.head_dim) +
                                "; device " + std::to_string(params.device_id) + " allows " +
                                std::to_string(smem_optin));
  }
  return Status::Ok();
}

Status simt_forward(const AttentionParams& params, void* stream) {
  DeviceGuard guard(params.device_id);
  if (!guard.status().ok()) return guard.status();
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::kFloat32:
      return dispatch_head_dim<float>(params, cuda_stream);
    case DType::kFloat16:
      return dispatch_head_dim<__half>(params, cuda_stream);
    case DType::kBFloat16:
      return dispatch_head_dim<__nv_bfloat16>(params, cuda_stream);
    default:
      return Status::NotSupported(std::string("backend 'simt' supports float32, float16 and bfloat16; got ") +
                                  dtype_name(params.dtype));
  }
}

}  // namespace waveboost::cuda
