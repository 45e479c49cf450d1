// Host side of backend "naive": what it can run, its workspace, and the
// dtype dispatch onto the kernels of include/waveboost/cuda/naive.cuh.
#include <string>

#include "cuda/cuda_paths.h"
#include "waveboost/cuda/naive.cuh"

namespace waveboost::cuda {

Status naive_can_implement(const AttentionParams& params) {
  if (params.dtype != DType::kFloat32 && params.dtype != DType::kFloat16 && params.dtype != DType::kBFloat16) {
    return Status::NotSupported(std::string("backend 'naive' supports float32, float16 and bfloat16; got ") +
                                dtype_name(params.dtype));
  }
  if (params.head_dim < 1 || params.head_dim > 256) {
    return Status::NotSupported("backend 'naive' supports head_dim 1..256; got " + std::to_string(params.head_dim));
  }
  // The workspace holds batch * heads * seqlen_q * seqlen_k floats. With broadcast (stride-0)
  // inputs that product can pass 2^63 and wrap to a small allocation the kernels would
  // overrun, so it is checked by division (2^62 bytes is far beyond any device anyway).
  {
    constexpr int64_t kMaxWorkspaceFloats = (int64_t{1} << 62) / int64_t{sizeof(float)};
    int64_t floats = 1;
    bool too_big = false;
    for (int64_t factor : {params.batch, params.heads, params.seqlen_q, params.seqlen_k}) {
      if (factor == 0) { floats = 0; too_big = false; break; }
      if (floats > kMaxWorkspaceFloats / factor) too_big = true;
      else floats *= factor;
    }
    if (too_big) {
      return Status::NotSupported("backend 'naive' materializes batch * heads * seqlen_q * seqlen_k float32 scores; "
                                  "got " + std::to_string(params.batch) + " * " + std::to_string(params.heads) +
                                  " * " + std::to_string(params.seqlen_q) + " * " + std::to_string(params.seqlen_k) +
                                  ", more than 2^62 bytes");
    }
  }
  if (params.dtype == DType::kBFloat16) {
    int cc = 0;
    const Status status = compute_capability(params.device_id, &cc);
    if (!status.ok()) return status;
    if (cc < 80) {
      return Status::NotSupported("backend 'naive' supports bfloat16 on compute capability >= 8.0; device " +
                                  std::to_string(params.device_id) + " is " + cc_string(cc));
    }
  }
  return Status::Ok();
}

Status naive_forward(const AttentionParams& params, void* stream) {
  DeviceGuard guard(params.device_id);
  if (!guard.status().ok()) return guard.status();
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);

  // Scores, then probs in place: one float per (batch, head, query, key),
  // stream-ordered so it is reused by the pool rather than cudaMalloc'd.
  const int64_t workspace_floats = params.batch * params.heads * params.seqlen_q * params.seqlen_k;
  const size_t workspace_bytes = static_cast<size_t>(workspace_floats) * sizeof(float);
  float* workspace = nullptr;
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&workspace), workspace_bytes, cuda_stream);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory here must not be reported again by the next unrelated check
      return cuda_status(err, ("cudaMallocAsync of the naive score workspace (" + std::to_string(workspace_bytes) +
                               " bytes)").c_str());
    }
  }

  Status status;
  switch (params.dtype) {
    case DType::kFloat32:
      status = run_naive_attention<float>(params, workspace, cuda_stream);
      break;
    case DType::kFloat16:
      status = run_naive_attention<__half>(params, workspace, cuda_stream);
      break;
    case DType::kBFloat16:
      status = run_naive_attention<__nv_bfloat16>(params, workspace, cuda_stream);
      break;
    default:
      status = Status::NotSupported(std::string("backend 'naive' supports float32, float16 and bfloat16; got ") +
                                    dtype_name(params.dtype));
  }

  if (workspace != nullptr) {
    const Status freed = cuda_status(cudaFreeAsync(workspace, cuda_stream), "cudaFreeAsync of the naive score workspace");
    if (status.ok()) status = freed;
  }
  return status;
}

}  // namespace waveboost::cuda
