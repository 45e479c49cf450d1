// Host side of backend "simt": what it can run and its launch, through the kernel registry
// (the instantiations are src/cuda/generated/simt.cu and src/cuda/sm80/generated/simt.cu).
#include "cuda/cuda_paths.h"
#include "cuda/kernel_registry.h"
#include "waveboost/cuda/flash_simt.cuh"

namespace waveboost::cuda {

Status simt_can_implement(const AttentionParams& params) {
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(params, Backend::kSimt, &kernel); !s.ok()) return s;
  // kBlockM is 64 in every instantiation.
  static_assert(FlashSimtTraits<float, 64>::kBlockM == FlashSimtTraits<__half, 128>::kBlockM &&
                FlashSimtTraits<float, 128>::kBlockM == FlashSimtTraits<__nv_bfloat16, 64>::kBlockM);
  return flash_simt_grid_check(params, FlashSimtTraits<float, 64>::kBlockM);
}

Status simt_forward(const AttentionParams& params, void* stream) {
  DeviceGuard guard(params.device_id);
  if (!guard.status().ok()) return guard.status();
  ForwardLaunch launch;
  launch.stream = static_cast<cudaStream_t>(stream);
  return run_forward(Backend::kSimt, "", params, launch);
}

}  // namespace waveboost::cuda
