// Explicit instantiation: mma.sync flash forward, head_dim 64, bf16.
#include "waveboost/cuda/flash_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_mma<__nv_bfloat16, 64>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
