// Explicit instantiation: mma.sync flash forward, head_dim 64, fp16.
#include "waveboost/cuda/flash_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_mma<__half, 64>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
