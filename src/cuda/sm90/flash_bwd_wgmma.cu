// The wgmma backward (flash_bwd_wgmma.cuh): preprocess and convert kernels of the mma backward
// around the wgmma main kernel, for fp16/bf16 x head_dim 64/128; entry points for
// src/cuda/backward_launch.cu (compiled for every architecture).
#include <string>

#include "waveboost/cuda/flash_bwd_wgmma.cuh"

namespace waveboost::cuda {

namespace {

template <typename Element, int kHeadDim, bool kCausal>
Status launch_main(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  dim3 grid;
  if (Status s = backward_grid(p, Traits::kBlockN, "wgmma", &grid); !s.ok()) return s;
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

int flash_bwd_wgmma_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 64: return FlashBwdWgmmaTraits<__half, 64>::kSmemBytes;
    case 128: return FlashBwdWgmmaTraits<__half, 128>::kSmemBytes;
    default: return 0;
  }
}

}  // namespace waveboost::cuda
