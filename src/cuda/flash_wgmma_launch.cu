// Dispatch for backend "wgmma" (Hopper warpgroup MMA). The kernels live in src/cuda/sm90/.
#include "cuda/cuda_paths.h"

namespace waveboost::cuda {

Status wgmma_can_implement(const AttentionParams&) {
  return Status::NotSupported("backend 'wgmma' is not built into this version of waveboost");
}

Status wgmma_forward(const AttentionParams& params, void*) { return wgmma_can_implement(params); }

}  // namespace waveboost::cuda
