// Explicit instantiation: mma.sync flash forward (3xTF32), head_dim 64, fp32.
#include "waveboost/cuda/flash_mma_tf32.cuh"

namespace waveboost::cuda {

template Status launch_flash_mma_tf32<64>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
