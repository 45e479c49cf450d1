// Backward passes of the CUDA paths: can_implement, workspaces and the launches of
// include/waveboost/cuda/naive_backward.cuh, and of flash_bwd_mma.cuh and (sm_90a objects)
// flash_bwd_wgmma.cuh through the kernel registry.
#include <string>

#include "cuda_paths.h"
#include "kernel_registry.h"
#include "workspace.h"
#include "waveboost/cuda/flash_bwd_mma.cuh"
#include "waveboost/cuda/naive_backward.cuh"

namespace waveboost::cuda {

// ---------------------------------------------------------------------------
// naive
// ---------------------------------------------------------------------------

Status naive_can_implement_backward(const AttentionBackwardParams& p) {
  if (p.device_type != DeviceType::kCUDA) {
    return Status::NotSupported("backend 'naive' runs on CUDA tensors; got host tensors");
  }
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("backend 'naive' (backward) supports float32, float16 and bfloat16; got ") +
                                dtype_name(p.dtype));
  }
  if (p.head_dim < 1 || p.head_dim > 256) {
    return Status::NotSupported("backend 'naive' (backward) supports head_dim 1..256; got " +
                                std::to_string(p.head_dim));
  }
  // The workspace holds 2 * batch * heads * seqlen_q * seqlen_k floats (P and dS); checked by
  // division so that a product past 2^63 cannot wrap to a small allocation.
  {
    constexpr int64_t kMaxWorkspaceFloats = (int64_t{1} << 61) / int64_t{sizeof(float)};
    int64_t floats = 1;
    bool too_big = false;
    for (int64_t factor : {p.batch, p.heads, p.seqlen_q, p.seqlen_k}) {
      if (factor == 0) { too_big = false; break; }
      if (floats > kMaxWorkspaceFloats / factor) too_big = true;
      else floats *= factor;
    }
    if (too_big) {
      return Status::NotSupported("backend 'naive' (backward) materializes 2 * batch * heads * seqlen_q * seqlen_k "
                                  "float32 values; got batch * heads * seqlen_q * seqlen_k = " +
                                  std::to_string(p.batch) + " * " + std::to_string(p.heads) + " * " +
                                  std::to_string(p.seqlen_q) + " * " + std::to_string(p.seqlen_k) +
                                  ", more than 2^62 bytes");
    }
  }
  if (p.dtype == DType::kBFloat16) {
    int cc = 0;
    if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
    if (cc < 80) {
      return Status::NotSupported("backend 'naive' supports bfloat16 on compute capability >= 8.0; device " +
                                  std::to_string(p.device_id) + " is " + cc_string(cc));
    }
  }
  return Status::Ok();
}

Status naive_backward(const AttentionBackwardParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t bytes = static_cast<size_t>(naive_bwd::workspace_floats(p)) * sizeof(float);
  PoolWorkspace workspace(p.device_id, bytes, s, "naive backward workspace");
  if (!workspace.status().ok()) return workspace.status();
  float* ws = static_cast<float*>(workspace.get());
  Status status;
  switch (p.dtype) {
    case DType::kFloat32: status = run_naive_attention_backward<float>(p, ws, s); break;
    case DType::kFloat16: status = run_naive_attention_backward<__half>(p, ws, s); break;
    case DType::kBFloat16: status = run_naive_attention_backward<__nv_bfloat16>(p, ws, s); break;
    default:
      status = Status::NotSupported(std::string("backend 'naive' (backward) supports float32, float16 and bfloat16; "
                                                "got ") + dtype_name(p.dtype));
  }
  const Status freed = workspace.release();
  return status.ok() ? freed : status;
}

// ---------------------------------------------------------------------------
// mma
// ---------------------------------------------------------------------------

Status mma_can_implement_backward(const AttentionBackwardParams& p) {
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kMma, &kernel); !s.ok()) return s;
  const int64_t block_n = flash_bwd_mma_block_n(p.head_dim);
  dim3 grid;
  if (Status s = backward_grid(p, block_n, "mma", &grid); !s.ok()) return s;
  if (p.deterministic && (p.seqlen_k + block_n - 1) / block_n > INT32_MAX / 2) {
    // the semaphores count key blocks in int
    return Status::NotSupported("backend 'mma' (backward, deterministic) supports ceil(seqlen_k / " +
                                std::to_string(block_n) + ") up to 1073741823; got seqlen_k " +
                                std::to_string(p.seqlen_k));
  }
  return Status::Ok();
}

// Runs launch(p, workspace, stream) of a flash backward over a pool workspace of the mma
// backward's layout (flash_bwd_mma_workspace_bytes), freed on the stream afterwards.
template <typename Launch>
Status run_flash_backward(const AttentionBackwardParams& p, void* stream, const char* what, Launch launch) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  int64_t m_pad = 0;
  PoolWorkspace workspace(p.device_id, flash_bwd_mma_workspace_bytes(p, &m_pad), s, what);
  if (!workspace.status().ok()) return workspace.status();
  const Status status = launch(p, workspace.get(), s);
  const Status freed = workspace.release();
  return status.ok() ? freed : status;
}

Status mma_backward(const AttentionBackwardParams& p, void* stream) {
  return run_flash_backward(p, stream, "mma backward workspace",
                            [](const AttentionBackwardParams& q, void* ws, cudaStream_t s) {
                              return run_backward(Backend::kMma, q, ws, s);
                            });
}

// ---------------------------------------------------------------------------
// wgmma (Hopper)
// ---------------------------------------------------------------------------

#ifdef WAVEBOOST_WITH_SM90A
// Defined in src/cuda/sm90/flash_bwd_wgmma.cu.
int64_t flash_bwd_wgmma_block_n();
Status flash_bwd_wgmma_deterministic_applies(const AttentionBackwardParams& p);

Status wgmma_can_implement_backward(const AttentionBackwardParams& p) {
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kWgmma, &kernel); !s.ok()) return s;
  if (p.deterministic) {
    if (Status s = flash_bwd_wgmma_deterministic_applies(p); !s.ok()) return s;
  }
  dim3 grid;
  return backward_grid(p, flash_bwd_wgmma_block_n(), "wgmma", &grid);
}

Status wgmma_backward(const AttentionBackwardParams& p, void* stream) {
  return run_flash_backward(p, stream, "wgmma backward workspace",
                            [](const AttentionBackwardParams& q, void* ws, cudaStream_t s) {
                              return run_backward(Backend::kWgmma, q, ws, s);
                            });
}

#else  // no sm_90a objects in this build

Status wgmma_can_implement_backward(const AttentionBackwardParams&) {
  return Status::NotSupported(
      "backend 'wgmma' needs a build that targets sm_90 (CMAKE_CUDA_ARCHITECTURES including 90)");
}

Status wgmma_backward(const AttentionBackwardParams& p, void*) { return wgmma_can_implement_backward(p); }

#endif  // WAVEBOOST_WITH_SM90A

}  // namespace waveboost::cuda
