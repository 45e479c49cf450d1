// Explicit instantiation: split-KV decode, head_dim 64, fp16.
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {

Status launch_decode_hdim64_fp16(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  return launch_decode<__half, 64>(p, split, stream);
}

}  // namespace waveboost::cuda
