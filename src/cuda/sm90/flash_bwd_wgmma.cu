// The wgmma backward (flash_bwd_wgmma.cuh): preprocess and convert kernels of the mma backward
// around the wgmma main kernel, for fp16/bf16 x head_dim 64/128; entry points for
// src/cuda/backward_launch.cu (compiled for every architecture).
#include <algorithm>
#include <string>

#include "waveboost/cuda/flash_bwd_wgmma.cuh"

namespace waveboost::cuda {

namespace {

template <typename Element, int kHeadDim, bool kCausal>
Status launch_main(const AttentionBackwardParams& p, const FlashBwdWorkspace& ws, cudaStream_t stream) {
  using Traits = FlashBwdWgmmaTraits<Element, kHeadDim>;
  constexpr int64_t kMaxGridYZ = 65535;
  const int64_t bhk = p.batch * p.heads_kv;
  const int64_t grid_x = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int64_t grid_y = bhk < kMaxGridYZ ? bhk : kMaxGridYZ;
  const int64_t grid_z = (bhk + grid_y - 1) / grid_y;
  if (grid_x > INT32_MAX || grid_z > kMaxGridYZ) {
    return Status::NotSupported("backend 'wgmma' (backward) supports batch * heads_kv up to 4294836225 and "
                                "ceil(seqlen_k / " + std::to_string(Traits::kBlockN) + ") up to 2147483647");
  }
  const auto kernel = flash_bwd_wgmma_kernel<Element, kHeadDim, kCausal>;
  WAVEBOOST_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y), static_cast<unsigned>(grid_z));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, ws);
  return cuda_status(cudaGetLastError(), "flash_bwd_wgmma_kernel launch");
}

template <typename Element, int kHeadDim>
Status launch(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride kernels: enough blocks to fill any GPU
  FlashBwdWorkspace ws;
  flash_bwd_mma_workspace_bytes(p, &ws.m_pad);
  static_assert(FlashBwdWgmmaTraits<Element, kHeadDim>::kBlockM == FlashBwdMmaTraitsFor<kHeadDim>::kBlockM,
                "the workspace's row padding is the mma backward's");
  const int64_t rows = p.batch * p.heads * ws.m_pad;
  ws.dq_accum = static_cast<float*>(workspace);
  ws.lse_log2 = ws.dq_accum + rows * kHeadDim;
  ws.d_rows = ws.lse_log2 + rows;
  if (rows > 0) {
    const auto grid = static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, kMaxGrid));
    flash_bwd::preprocess_kernel<Element><<<grid, 256, 0, stream>>>(p, ws);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  if (p.seqlen_k > 0) {
    const Status s = p.is_causal ? launch_main<Element, kHeadDim, true>(p, ws, stream)
                                 : launch_main<Element, kHeadDim, false>(p, ws, stream);
    if (!s.ok()) return s;
  }
  const int64_t chunks = p.batch * p.heads * p.seqlen_q * (kHeadDim / 8);
  if (chunks > 0) {
    const auto grid = static_cast<unsigned>(std::min<int64_t>((chunks + 255) / 256, kMaxGrid));
    flash_bwd::convert_dq_kernel<Element><<<grid, 256, 0, stream>>>(p, ws.dq_accum, ws.m_pad);
    WAVEBOOST_CUDA_RETURN(cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace

Status launch_flash_bwd_wgmma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  if (p.dtype == DType::kFloat16 && p.head_dim == 64) return launch<__half, 64>(p, workspace, stream);
  if (p.dtype == DType::kFloat16 && p.head_dim == 128) return launch<__half, 128>(p, workspace, stream);
  if (p.dtype == DType::kBFloat16 && p.head_dim == 64) return launch<__nv_bfloat16, 64>(p, workspace, stream);
  if (p.dtype == DType::kBFloat16 && p.head_dim == 128) return launch<__nv_bfloat16, 128>(p, workspace, stream);
  return Status::NotSupported(std::string("backend 'wgmma' (backward) supports float16 and bfloat16 with head_dim 64 "
                                          "and 128; got ") + dtype_name(p.dtype) + " with head_dim " +
                              std::to_string(p.head_dim));
}

int flash_bwd_wgmma_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 64: return FlashBwdWgmmaTraits<__half, 64>::kSmemBytes;
    case 128: return FlashBwdWgmmaTraits<__half, 128>::kSmemBytes;
    default: return 0;
  }
}

}  // namespace waveboost::cuda
