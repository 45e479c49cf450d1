// Backward passes of the CUDA paths: can_implement, workspaces and the dtype x head_dim dispatch
// onto include/waveboost/cuda/naive_backward.cuh, flash_bwd_mma.cuh and (sm_90a objects in
// src/cuda/sm90/) flash_bwd_wgmma.cuh.
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/flash_bwd_mma.cuh"
#include "waveboost/cuda/naive_backward.cuh"

namespace waveboost::cuda {

namespace {

// A stream-ordered workspace from the device's pool, freed on the same stream when it goes.
class PoolWorkspace {
 public:
  PoolWorkspace(int device_id, size_t bytes, cudaStream_t stream, const char* what) : stream_(stream), what_(what) {
    if (bytes == 0) return;
    cudaMemPool_t pool = nullptr;
    status_ = workspace_pool(device_id, &pool);
    if (!status_.ok()) return;
    const cudaError_t err = cudaMallocFromPoolAsync(&ptr_, bytes, pool, stream);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory here must not be reported again by the next unrelated check
      ptr_ = nullptr;
      status_ = cuda_status(err, ("cudaMallocFromPoolAsync of the " + std::string(what) + " (" +
                                  std::to_string(bytes) + " bytes)").c_str());
    }
  }
  ~PoolWorkspace() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  PoolWorkspace(const PoolWorkspace&) = delete;
  PoolWorkspace& operator=(const PoolWorkspace&) = delete;

  // Frees now and reports the result (instead of the destructor, which cannot).
  Status release() {
    if (ptr_ == nullptr) return Status::Ok();
    const cudaError_t err = cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
    return cuda_status(err, ("cudaFreeAsync of the " + std::string(what_)).c_str());
  }
  const Status& status() const { return status_; }
  void* get() const { return ptr_; }

 private:
  cudaStream_t stream_;
  const char* what_;
  void* ptr_ = nullptr;
  Status status_;
};

// The caller's dout/dq/dk/dv move in 16 B pieces on the mma path, like q/k/v/out
// (vector_friendly): 16 B aligned, strides of used dimensions multiples of 8 elements.
bool backward_vector_friendly(const AttentionBackwardParams& p) {
  if (!vector_friendly(p, 8)) return false;
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const auto used = [](int64_t stride, int64_t extent) { return extent > 1 ? stride : int64_t{0}; };
  const int64_t strides = used(p.do_batch_stride, p.batch) | used(p.do_row_stride, p.seqlen_q) |
                          used(p.do_head_stride, p.heads) | used(p.dq_batch_stride, p.batch) |
                          used(p.dq_row_stride, p.seqlen_q) | used(p.dq_head_stride, p.heads) |
                          used(p.dk_batch_stride, p.batch) | used(p.dk_row_stride, p.seqlen_k) |
                          used(p.dk_head_stride, p.heads_kv) | used(p.dv_batch_stride, p.batch) |
                          used(p.dv_row_stride, p.seqlen_k) | used(p.dv_head_stride, p.heads_kv);
  return aligned(p.dout) && aligned(p.dq) && aligned(p.dk) && aligned(p.dv) && (strides & 7) == 0;
}

}  // namespace

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
  if (p.batch == 0 || p.heads == 0) return Status::Ok();
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

// The checks the flash backwards share: CUDA tensors, fp16/bf16, head_dim 64 or 128, 16 B pieces.
Status flash_backward_checks(const AttentionBackwardParams& p, const std::string& backend) {
  if (p.device_type != DeviceType::kCUDA) {
    return Status::NotSupported("backend '" + backend + "' runs on CUDA devices; got tensors on the CPU");
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::NotSupported("backend '" + backend + "' (backward) supports float16 and bfloat16; got " +
                                dtype_name(p.dtype));
  }
  if (p.head_dim != 64 && p.head_dim != 128) {
    return Status::NotSupported("backend '" + backend + "' (backward) supports head_dim 64 and 128; got " +
                                std::to_string(p.head_dim));
  }
  if (!backward_vector_friendly(p)) {
    return Status::NotSupported("backend '" + backend + "' (backward) needs 16-byte aligned q/k/v/out/dout/dq/dk/dv "
                                "with strides that are multiples of 8 elements");
  }
  return Status::Ok();
}

// Ok, or why a block of smem_bytes of shared memory does not fit device p.device_id.
Status backward_smem_fits(const AttentionBackwardParams& p, const std::string& backend, int smem_bytes) {
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  if (smem_bytes > smem_optin) {
    return Status::NotSupported("backend '" + backend + "' (backward) needs " + std::to_string(smem_bytes) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  }
  return Status::Ok();
}

Status mma_can_implement_backward(const AttentionBackwardParams& p) {
  if (Status s = flash_backward_checks(p, "mma"); !s.ok()) return s;
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  if (cc < 80) {
    return Status::NotSupported("backend 'mma' needs compute capability >= 8.0; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  }
  const int64_t block_n = flash_bwd_mma_block_n(p.head_dim);
  dim3 grid;
  if (Status s = backward_grid(p, block_n, "mma", &grid); !s.ok()) return s;
  if (p.deterministic && (p.seqlen_k + block_n - 1) / block_n > INT32_MAX / 2) {
    // the semaphores count key blocks in int
    return Status::NotSupported("backend 'mma' (backward, deterministic) supports ceil(seqlen_k / " +
                                std::to_string(block_n) + ") up to 1073741823; got seqlen_k " +
                                std::to_string(p.seqlen_k));
  }
  return backward_smem_fits(p, "mma", flash_bwd_mma_smem_bytes(p.head_dim));
}

// Runs launch(p, workspace, stream) of a flash backward over a pool workspace of the mma
// backward's layout (flash_bwd_mma_workspace_bytes), freed on the stream afterwards.
template <typename Launch>
Status run_flash_backward(const AttentionBackwardParams& p, void* stream, const char* what, Launch launch) {
  if (p.batch == 0 || p.heads == 0) return Status::Ok();
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
  return run_flash_backward(p, stream, "mma backward workspace", [](const AttentionBackwardParams& q, void* ws,
                                                                    cudaStream_t s) -> Status {
    if (q.dtype == DType::kFloat16 && q.head_dim == 64) return launch_flash_bwd_mma<__half, 64>(q, ws, s);
    if (q.dtype == DType::kFloat16 && q.head_dim == 128) return launch_flash_bwd_mma<__half, 128>(q, ws, s);
    if (q.dtype == DType::kBFloat16 && q.head_dim == 64) return launch_flash_bwd_mma<__nv_bfloat16, 64>(q, ws, s);
    if (q.dtype == DType::kBFloat16 && q.head_dim == 128) return launch_flash_bwd_mma<__nv_bfloat16, 128>(q, ws, s);
    return Status::NotSupported(std::string("backend 'mma' (backward) supports float16 and bfloat16 with head_dim 64 "
                                            "and 128; got ") + dtype_name(q.dtype) + " with head_dim " +
                                std::to_string(q.head_dim));
  });
}

// ---------------------------------------------------------------------------
// wgmma (Hopper)
// ---------------------------------------------------------------------------

#ifdef WAVEBOOST_WITH_SM90A
// Defined in src/cuda/sm90/flash_bwd_wgmma.cu.
Status launch_flash_bwd_wgmma(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream);
int flash_bwd_wgmma_smem_bytes(int64_t head_dim);
int64_t flash_bwd_wgmma_block_n();

Status wgmma_can_implement_backward(const AttentionBackwardParams& p) {
  if (Status s = flash_backward_checks(p, "wgmma"); !s.ok()) return s;
  if (p.deterministic) {
    return Status::NotSupported("backend 'wgmma' (backward) adds dQ with atomics: deterministic=True runs on 'mma'");
  }
  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  if (cc != 90) {
    return Status::NotSupported("backend 'wgmma' runs on compute capability 9.0 (Hopper) only; device " +
                                std::to_string(p.device_id) + " has " + cc_string(cc));
  }
  dim3 grid;
  if (Status s = backward_grid(p, flash_bwd_wgmma_block_n(), "wgmma", &grid); !s.ok()) return s;
  return backward_smem_fits(p, "wgmma", flash_bwd_wgmma_smem_bytes(p.head_dim));
}

Status wgmma_backward(const AttentionBackwardParams& p, void* stream) {
  return run_flash_backward(p, stream, "wgmma backward workspace", launch_flash_bwd_wgmma);
}

#else  // no sm_90a objects in this build

Status wgmma_can_implement_backward(const AttentionBackwardParams&) {
  return Status::NotSupported(
      "backend 'wgmma' needs a build that targets sm_90 (CMAKE_CUDA_ARCHITECTURES including 90)");
}

Status wgmma_backward(const AttentionBackwardParams& p, void*) { return wgmma_can_implement_backward(p); }

#endif  // WAVEBOOST_WITH_SM90A

}  // namespace waveboost::cuda
