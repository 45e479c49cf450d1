// A kernel workspace from the device's stream-ordered pool (workspace_pool in cuda_paths.h):
// allocated on the caller's stream, freed on it when released or destroyed. One for every path
// that needs scratch memory (split-KV pieces, the backward's dQ accumulator, the naive backward).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

class PoolWorkspace {
 public:
  // `what` names the workspace in error messages; bytes == 0 allocates nothing (get() is null).
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

}  // namespace waveboost::cuda
