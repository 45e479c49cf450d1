// Backward passes of the CUDA paths: can_implement and the dtype x head_dim dispatch.
#include "cuda_paths.h"

namespace waveboost::cuda {

Status naive_can_implement_backward(const AttentionBackwardParams&) {
  return Status::NotSupported("backend 'naive' has no backward pass yet");
}

Status mma_can_implement_backward(const AttentionBackwardParams&) {
  return Status::NotSupported("backend 'mma' has no backward pass yet");
}

Status naive_backward(const AttentionBackwardParams& p, void*) { return naive_can_implement_backward(p); }

Status mma_backward(const AttentionBackwardParams& p, void*) { return mma_can_implement_backward(p); }

}  // namespace waveboost::cuda
