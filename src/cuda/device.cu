// Device queries shared by the CUDA paths.
#include <atomic>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

namespace {
// Compute capability per ordinal, cached lock-free: 0 = not yet queried. A device's
// capability never changes, so racing first queries store the same value.
constexpr int kCachedDevices = 64;
std::atomic<int> g_compute_capability[kCachedDevices];
}  // namespace

Status compute_capability(int device_id, int* cc) {
  const bool cacheable = device_id >= 0 && device_id < kCachedDevices;
  if (cacheable) {
    const int cached = g_compute_capability[device_id].load(std::memory_order_relaxed);
    if (cached != 0) {
      *cc = cached;
      return Status::Ok();
    }
  }
  int major = 0;
  int minor = 0;
  WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id));
  WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id));
  *cc = major * 10 + minor;
  if (cacheable) g_compute_capability[device_id].store(*cc, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace waveboost::cuda
