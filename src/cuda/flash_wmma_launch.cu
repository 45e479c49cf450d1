// Backend "wmma": can_implement and launch of the tensor-core flash forward (flash_wmma.cuh),
// through the kernel registry.
#include "cuda_paths.h"
#include "kernel_registry.h"
#include "waveboost/cuda/flash_wmma.cuh"

namespace waveboost::cuda {

Status wmma_can_implement(const AttentionParams& p) {
  // The registry checks the smallest key tile's shared memory; the launcher picks the largest
  // tile the device's opt-in allows.
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kWmma, &kernel); !s.ok()) return s;
  return folded_grid_check(p, kFlashWmmaBlockM, "wmma");
}

Status wmma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  ForwardLaunch launch;
  launch.stream = static_cast<cudaStream_t>(stream);
  return run_forward(Backend::kWmma, "", p, launch);
}

}  // namespace waveboost::cuda
