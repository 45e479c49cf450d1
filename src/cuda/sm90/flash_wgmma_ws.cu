// Host side of the warp-specialized wgmma forward (flash_wgmma_ws.cuh): whether it takes a call, and
// whether TMA can describe its K and V (checked without the driver, for can_implement).
// The kernels themselves are instantiated in src/cuda/sm90/generated/wgmma_tma.cu.
#include "waveboost/cuda/flash_wgmma_ws.cuh"

namespace waveboost::cuda {

bool wgmma_tma_applies(const AttentionParams& p) {
  if (!wgmma_ws_takes(p) || (p.head_dim != 64 && p.head_dim != 128)) return false;
  const int box_rows = p.head_dim == 64 ? FlashWgmmaWsDefaultTraits<__half, 64>::kBlockN
                                        : FlashWgmmaWsDefaultTraits<__half, 128>::kBlockN;
  CUtensorMap k_map, v_map;
  return tma::encode_kv_maps(p, box_rows, &k_map, &v_map);
}

bool wgmma_tma_fits(const AttentionParams& p) { return wgmma_ws_takes(p) && tma::kv_maps_fit(p); }

bool wgmma_tma_persistent(const AttentionParams& p) {
  if (!wgmma_ws_persistent_shape(p)) return false;
  CUtensorMap q_map;  // as the launcher's Q map (its rows box does not decide whether TMA can describe Q)
  return tma::encode_rows_map(&q_map, p.q, p.dtype, p.head_dim, p.seqlen_q, p.heads, p.batch, p.q_row_stride,
                              p.q_head_stride, p.q_batch_stride, kWgmmaWsBlockMShort);
}

}  // namespace waveboost::cuda
