// Host side of the decode kernel's TMA variant (decode.cuh, kTma): whether it takes a call. The
// kernels themselves are instantiated in src/cuda/sm90/generated/decode_tma.cu.
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {

bool decode_tma_applies(const AttentionParams& p) {
  return decode_tma_takes(p) && tma::kv_maps_fit(p);
}

}  // namespace waveboost::cuda
