// Explicit instantiation: wgmma flash forward (sm_90a), head_dim 128, bf16, and its plain host
// entry points for src/cuda/flash_wgmma_launch.cu (compiled for every architecture).
#include "waveboost/cuda/flash_wgmma.cuh"

namespace waveboost::cuda {

template Status launch_flash_wgmma<__nv_bfloat16, 128>(const AttentionParams&, const SplitKV&, cudaStream_t);

Status launch_flash_wgmma_hdim128_bf16(const AttentionParams& p, const SplitKV& split, cudaStream_t stream) {
  return launch_flash_wgmma<__nv_bfloat16, 128>(p, split, stream);
}

int flash_wgmma_hdim128_bf16_smem_bytes() { return FlashWgmmaTraits<__nv_bfloat16, 128>::kSmemBytes; }

}  // namespace waveboost::cuda
