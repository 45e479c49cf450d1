// Backend "wgmma": can_implement and the dtype x head_dim dispatch of the Hopper flash forward.
//
// Compiled for every architecture of the build, so it holds no kernel template: the kernels
// and their launchers live in src/cuda/sm90/ (compiled for sm_90a only, and only when 90 is
// among CMAKE_CUDA_ARCHITECTURES, which then defines WAVEBOOST_WITH_SM90A here).
#include <cstdint>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

#ifdef WAVEBOOST_WITH_SM90A
// Defined in src/cuda/sm90/flash_wgmma_hdim{64,128}_{fp16,bf16}.cu.
Status launch_flash_wgmma_hdim64_fp16(const AttentionParams& p, cudaStream_t stream);
Status launch_flash_wgmma_hdim128_fp16(const AttentionParams& p, cudaStream_t stream);
Status launch_flash_wgmma_hdim64_bf16(const AttentionParams& p, cudaStream_t stream);
Status launch_flash_wgmma_hdim128_bf16(const AttentionParams& p, cudaStream_t stream);
int flash_wgmma_hdim64_fp16_smem_bytes();
int flash_wgmma_hdim128_fp16_smem_bytes();
int flash_wgmma_hdim64_bf16_smem_bytes();
int flash_wgmma_hdim128_bf16_smem_bytes();

namespace {

std::string cc_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// The kernel moves every tile in 16 B pieces (cp.async in, vector stores out): each base
// pointer must be 16 B aligned and every stride a multiple of 8 elements. A stride of a
// dimension of extent 1 is never applied and does not count.
bool vector_friendly(const AttentionParams& p) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const auto used = [](int64_t stride, int64_t extent) { return extent > 1 ? stride : int64_t{0}; };
  const int64_t strides = used(p.q_batch_stride, p.batch) | used(p.q_row_stride, p.seqlen_q) |
                          used(p.q_head_stride, p.heads) | used(p.o_batch_stride, p.batch) |
                          used(p.o_row_stride, p.seqlen_q) | used(p.o_head_stride, p.heads) |
                          used(p.k_batch_stride, p.batch) | used(p.k_row_stride, p.seqlen_k) |
                          used(p.k_head_stride, p.heads_kv) | used(p.v_batch_stride, p.batch) |
                          used(p.v_row_stride, p.seqlen_k) | used(p.v_head_stride, p.heads_kv);
  return aligned(p.q) && aligned(p.k) && aligned(p.v) && aligned(p.out) && (strides & 7) == 0;
}

Status unsupported_dtype(const AttentionParams& p) {
  return Status::NotSupported(std::string("backend 'wgmma' supports float16 and bfloat16; got ") +
                              dtype_name(p.dtype));
}

Status unsupported_head_dim(const AttentionParams& p) {
  return Status::NotSupported("backend 'wgmma' supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
}

// Shared memory per block of the kernel for p's dtype and head dim; 0 with `why` set if none.
int smem_bytes(const AttentionParams& p, Status* why) {
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return flash_wgmma_hdim64_fp16_smem_bytes();
        case 128: return flash_wgmma_hdim128_fp16_smem_bytes();
        default: *why = unsupported_head_dim(p); return 0;
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return flash_wgmma_hdim64_bf16_smem_bytes();
        case 128: return flash_wgmma_hdim128_bf16_smem_bytes();
        default: *why = unsupported_head_dim(p); return 0;
      }
    default:
      *why = unsupported_dtype(p);
      return 0;
  }
}

}  // namespace

Status wgmma_can_implement(const AttentionParams& p) {
  if (p.device_type != DeviceType::kCUDA) {
    return Status::NotSupported("backend 'wgmma' runs on CUDA devices; got tensors on the CPU");
  }
  Status why;
  const int smem_needed = smem_bytes(p, &why);
  if (smem_needed == 0) return why;
  if (!vector_friendly(p)) {
    return Status::NotSupported(
        "backend 'wgmma' needs 16-byte aligned q/k/v/out with strides that are multiples of 8 elements");
  }
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  // wgmma exists on sm_90a alone: code built for it runs on compute capability 9.0 only.
  if (cc != 90) {
    return Status::NotSupported("backend 'wgmma' runs on compute capability 9.0 (Hopper) only; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  }
  // 128 = FlashWgmmaTraits::kBlockM of every instantiation (that header compiles for sm_90a
  // only); the launcher repeats this check with the traits' own value.
  if (Status s = folded_grid_check(p, 128, "wgmma"); !s.ok()) return s;
  int smem_optin = 0;
  WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device_id));
  if (smem_needed > smem_optin) {
    return Status::NotSupported("backend 'wgmma' needs " + std::to_string(smem_needed) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  }
  return Status::Ok();
}

Status wgmma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wgmma_hdim64_fp16(p, s);
        case 128: return launch_flash_wgmma_hdim128_fp16(p, s);
        default: return unsupported_head_dim(p);
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wgmma_hdim64_bf16(p, s);
        case 128: return launch_flash_wgmma_hdim128_bf16(p, s);
        default: return unsupported_head_dim(p);
      }
    default:
      return unsupported_dtype(p);
  }
}

#else  // no sm_90a objects in this build

namespace {
Status not_built() {
  return Status::NotSupported(
      "backend 'wgmma' needs a build that targets sm_90 (CMAKE_CUDA_ARCHITECTURES including 90)");
}
}  // namespace

Status wgmma_can_implement(const AttentionParams&) { return not_built(); }

Status wgmma_forward(const AttentionParams&, void*) { return not_built(); }

#endif  // WAVEBOOST_WITH_SM90A

}  // namespace waveboost::cuda
