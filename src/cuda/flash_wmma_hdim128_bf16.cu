// Explicit instantiation: WMMA flash forward, head_dim 128, bf16.
#include "waveboost/cuda/flash_wmma.cuh"

namespace waveboost::cuda {

template Status launch_flash_wmma<__nv_bfloat16, 128>(const AttentionParams&, cudaStream_t);

}  // namespace waveboost::cuda
