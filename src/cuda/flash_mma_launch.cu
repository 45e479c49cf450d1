// Backend "mma": can_implement and launch of the mma.sync flash forward (16-bit: flash_mma.cuh;
// float32 on tf32 tensor cores, 3xTF32: flash_mma_tf32.cuh), through the kernel registry.
#include <cstdint>

#include "cuda_paths.h"
#include "kernel_registry.h"
#include "waveboost/cuda/flash_mma.cuh"
#include "waveboost/cuda/flash_mma_tf32.cuh"

namespace waveboost::cuda {

Status mma_can_implement(const AttentionParams& p) {
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kMma, &kernel); !s.ok()) return s;
  // A page is read one copy pass (16 keys at most) at a time: page sizes that are multiples of it.
  static_assert(FlashMmaTraits<__half, 64>::kRowsPerCopyPass <= 16 && FlashMmaTraits<__half, 128>::kRowsPerCopyPass <= 16);
  if (Status s = flash_sequence_layout_check(p, "mma", 16); !s.ok()) return s;
  const bool fp32 = p.dtype == DType::kFloat32;
  const int64_t block_m = fp32 ? FlashMmaTf32Traits<64>::kBlockM : FlashMmaTraits<__half, 64>::kBlockM;
  static_assert(FlashMmaTf32Traits<64>::kBlockM == FlashMmaTf32Traits<128>::kBlockM &&
                FlashMmaTraits<__half, 64>::kBlockM == FlashMmaTraits<__nv_bfloat16, 128>::kBlockM);
  return folded_grid_check(p, block_m, "mma");
}

Status mma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  ForwardLaunch launch;
  launch.stream = static_cast<cudaStream_t>(stream);
  return run_forward(Backend::kMma, "", p, launch);
}

}  // namespace waveboost::cuda
