// Explicit instantiation: split-KV decode, head_dim 128, fp16.
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {

Status launch_decode_hdim128_fp16(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  return launch_decode<__half, 128>(p, split, stream);
}

}  // namespace waveboost::cuda
