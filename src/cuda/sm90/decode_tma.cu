// Host side of the decode kernel's TMA variant (decode.cuh, kTma): whether it takes a call. The
// kernels themselves are instantiated in src/cuda/sm90/generated/decode_tma.cu.
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {

bool decode_tma_applies(const AttentionParams& p) {
  return decode_tma_takes(p) &&
         tma::rows_map_fits(p.k, p.dtype, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                            p.k_head_stride, p.k_batch_stride) &&
         tma::rows_map_fits(p.v, p.dtype, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                            p.v_head_stride, p.v_batch_stride);
}

}  // namespace waveboost::cuda
