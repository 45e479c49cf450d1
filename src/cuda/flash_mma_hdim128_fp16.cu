// Explicit instantiation: mma.sync flash forward, head_dim 128, fp16.
#include "waveboost/cuda/flash_mma.cuh"

namespace waveboost::cuda {

template Status launch_flash_mma<__half, 128>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
