// Explicit instantiation: mma.sync flash backward, head_dim 128, bf16.
#include "waveboost/cuda/flash_bwd_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_bwd_mma<__nv_bfloat16, 128>(const AttentionBackwardParams&, void*, cudaStream_t);

}  // namespace waveboost::cuda
