// Backend "wgmma": can_implement and the dtype x head_dim dispatch of the Hopper flash forward.
//
// Compiled for every architecture of the build, so it holds no kernel template: the kernels
// and their launchers live in src/cuda/sm90/ (compiled for sm_90a only, and only when 90 is
// among CMAKE_CUDA_ARCHITECTURES, which then defines WAVEBOOST_WITH_SM90A here).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

#ifdef WAVEBOOST_WITH_SM90A
// Defined in src/cuda/sm90/flash_wgmma_hdim{64,128}_{fp16,bf16}.cu.
Status launch_flash_wgmma_hdim64_fp16(const AttentionParams& p, const SplitKV& split, cudaStream_t stream);
Status launch_flash_wgmma_hdim128_fp16(const AttentionParams& p, const SplitKV& split, cudaStream_t stream);
Status launch_flash_wgmma_hdim64_bf16(const AttentionParams& p, const SplitKV& split, cudaStream_t stream);
Status launch_flash_wgmma_hdim128_bf16(const AttentionParams& p, const SplitKV& split, cudaStream_t stream);
int flash_wgmma_hdim64_fp16_smem_bytes();
int flash_wgmma_hdim128_fp16_smem_bytes();
int flash_wgmma_hdim64_bf16_smem_bytes();
int flash_wgmma_hdim128_bf16_smem_bytes();
// Defined in src/cuda/sm90/flash_wgmma_ws.cu: the warp-specialized kernel (TMA producer);
// NotSupported, with nothing launched, where it does not apply.
Status launch_flash_wgmma_ws_dispatch(const AttentionParams& p, cudaStream_t stream);

namespace {

Status unsupported_dtype(const AttentionParams& p) {
  return Status::NotSupported(std::string("backend 'wgmma' supports float16 and bfloat16; got ") +
                              dtype_name(p.dtype));
}

Status unsupported_head_dim(const AttentionParams& p) {
  return Status::NotSupported("backend 'wgmma' supports head_dim 64 and 128; got " + std::to_string(p.head_dim));
}

// Shared memory per block of the kernel for p's dtype and head dim; 0 with `why` set if none.
int smem_bytes(const AttentionParams& p, Status* why) {
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return flash_wgmma_hdim64_fp16_smem_bytes();
        case 128: return flash_wgmma_hdim128_fp16_smem_bytes();
        default: *why = unsupported_head_dim(p); return 0;
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return flash_wgmma_hdim64_bf16_smem_bytes();
        case 128: return flash_wgmma_hdim128_bf16_smem_bytes();
        default: *why = unsupported_head_dim(p); return 0;
      }
    default:
      *why = unsupported_dtype(p);
      return 0;
  }
}

}  // namespace

Status wgmma_can_implement(const AttentionParams& p) {
  Status why;
  const int smem_needed = smem_bytes(p, &why);
  if (smem_needed == 0) return why;
  if (!vector_friendly(p, 8)) {
    return Status::NotSupported(
        "backend 'wgmma' needs 16-byte aligned q/k/v/out with strides that are multiples of 8 elements");
  }
  if (Status s = flash_sequence_layout_check(p, "wgmma", 1); !s.ok()) return s;
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  // wgmma exists on sm_90a alone: code built for it runs on compute capability 9.0 only.
  if (cc != 90) {
    return Status::NotSupported("backend 'wgmma' runs on compute capability 9.0 (Hopper) only; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  }
  // kWgmmaBlockM = FlashWgmmaTraits::kBlockM of every instantiation (that header compiles for
  // sm_90a only); the launcher repeats this check with the traits' own value.
  if (Status s = folded_grid_check(p, kWgmmaBlockM, "wgmma"); !s.ok()) return s;
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  if (smem_needed > smem_optin) {
    return Status::NotSupported("backend 'wgmma' needs " + std::to_string(smem_needed) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  }
  return Status::Ok();
}

namespace {
// How unsplit blocks load K and V: by default a producer warpgroup issues TMA into an
// mbarrier ring (flash_wgmma_ws.cuh, 1.22x the cp.async kernel on an H100, benchmarks/NOTES.md);
// WAVEBOOST_WGMMA_PIPELINE=cp.async selects the kernel where every thread copies and the block
// meets one barrier per tile (flash_wgmma.cuh), which also runs split-KV and whatever TMA
// cannot describe. Read once per process.
bool use_tma_pipeline() {
  static const bool tma = [] {
    const char* v = std::getenv("WAVEBOOST_WGMMA_PIPELINE");
    return v == nullptr || std::strcmp(v, "cp.async") != 0;
  }();
  return tma;
}

Status launch(const AttentionParams& p, const SplitKV& split, cudaStream_t s) {
  if (split.num_splits == 1 && use_tma_pipeline()) {
    const Status ws = launch_flash_wgmma_ws_dispatch(p, s);
    if (ws.code() != StatusCode::kNotSupported) return ws;
  }
  switch (p.dtype) {
    case DType::kFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wgmma_hdim64_fp16(p, split, s);
        case 128: return launch_flash_wgmma_hdim128_fp16(p, split, s);
        default: return unsupported_head_dim(p);
      }
    case DType::kBFloat16:
      switch (p.head_dim) {
        case 64: return launch_flash_wgmma_hdim64_bf16(p, split, s);
        case 128: return launch_flash_wgmma_hdim128_bf16(p, split, s);
        default: return unsupported_head_dim(p);
      }
    default:
      return unsupported_dtype(p);
  }
}
}  // namespace

Status wgmma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);

  int multiprocessors = 0;
  if (Status st = multiprocessor_count(p.device_id, &multiprocessors); !st.ok()) return st;
  SplitKV split = split_kv_pieces(p.batch * p.heads * ((p.seqlen_q + kWgmmaBlockM - 1) / kWgmmaBlockM),
                                  (p.seqlen_k + kWgmmaBlockN - 1) / kWgmmaBlockN, multiprocessors);
  // Sequence layouts (varlen, seqused_k, paged) run unsplit: the pieces and their merge are laid
  // out for dense batches.
  if (!p.is_dense()) split = SplitKV{};
  if (split.num_splits == 1) return launch(p, split, s);

  // The pieces: num_splits x blocks <= SMs, so at most kWgmmaBlockM x SMs rows of head_dim + 1 floats
  // (8.7 MB on an H100 at head dim 128), which the workspace pool keeps between calls.
  const size_t floats = static_cast<size_t>(split.num_splits * p.batch * p.heads * p.seqlen_q);
  const size_t bytes = floats * (p.head_dim + 1) * sizeof(float);
  cudaMemPool_t pool = nullptr;
  if (Status st = workspace_pool(p.device_id, &pool); !st.ok()) return st;
  void* workspace = nullptr;
  if (const cudaError_t err = cudaMallocFromPoolAsync(&workspace, bytes, pool, s); err != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory here must not be reported again by the next unrelated check
    return cuda_status(err, ("cudaMallocFromPoolAsync of the wgmma split-KV workspace (" + std::to_string(bytes) +
                             " bytes)").c_str());
  }
  split.o_accum = static_cast<float*>(workspace);
  split.lse_accum = split.o_accum + floats * p.head_dim;
  const Status status = launch(p, split, s);
  const Status freed = cuda_status(cudaFreeAsync(workspace, s), "cudaFreeAsync of the wgmma split-KV workspace");
  return status.ok() ? freed : status;
}

#else  // no sm_90a objects in this build

namespace {
Status not_built() {
  return Status::NotSupported(
      "backend 'wgmma' needs a build that targets sm_90 (CMAKE_CUDA_ARCHITECTURES including 90)");
}
}  // namespace

Status wgmma_can_implement(const AttentionParams&) { return not_built(); }

Status wgmma_forward(const AttentionParams&, void*) { return not_built(); }

#endif  // WAVEBOOST_WITH_SM90A

}  // namespace waveboost::cuda
