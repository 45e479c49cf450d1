// Explicit instantiation: mma.sync flash backward, head_dim 64, fp16.
#include "waveboost/cuda/flash_bwd_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_bwd_mma<__half, 64>(const AttentionBackwardParams&, void*, cudaStream_t);

}  // namespace waveboost::cuda
