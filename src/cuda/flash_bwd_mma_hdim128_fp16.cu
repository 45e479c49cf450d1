// Explicit instantiation: mma.sync flash backward, head_dim 128, fp16.
#include "waveboost/cuda/flash_bwd_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_bwd_mma<__half, 128>(const AttentionBackwardParams&, void*, cudaStream_t);

}  // namespace waveboost::cuda
