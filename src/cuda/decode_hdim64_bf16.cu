// Explicit instantiation: split-KV decode, head_dim 64, bf16.
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {

Status launch_decode_hdim64_bf16(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  return launch_decode<__nv_bfloat16, 64>(p, split, stream);
}

}  // namespace waveboost::cuda
