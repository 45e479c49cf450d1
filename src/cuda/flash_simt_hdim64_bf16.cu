// Explicit instantiation of the SIMT flash forward for head_dim 64, bf16.
#include "waveboost/cuda/flash_simt.cuh"

namespace waveboost::cuda {
template Status launch_flash_simt<__nv_bfloat16, 64>(const AttentionParams&, cudaStream_t);
}  // namespace waveboost::cuda
