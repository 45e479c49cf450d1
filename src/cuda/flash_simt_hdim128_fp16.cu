// Explicit instantiation of the SIMT flash forward for head_dim 128, fp16.
#include "waveboost/cuda/flash_simt.cuh"

namespace waveboost::cuda {
template Status launch_flash_simt<__half, 128>(const AttentionParams&, cudaStream_t);
}  // namespace waveboost::cuda
