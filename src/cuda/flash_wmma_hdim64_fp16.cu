// Explicit instantiation: WMMA flash forward, head_dim 64, fp16.
#include "waveboost/cuda/flash_wmma.cuh"

namespace waveboost::cuda {

template Status launch_flash_wmma<__half, 64>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
