// Explicit instantiation of the SIMT flash forward for head_dim 64, fp16.
#include "waveboost/cuda/flash_simt.cuh"

namespace waveboost::cuda {
template Status launch_flash_simt<__half, 64>(const AttentionParams&, cudaStream_t);
}  // namespace waveboost::cuda
