// Device queries shared by the CUDA paths.
#include <atomic>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

namespace {
// Device attributes per ordinal, cached lock-free: 0 = not yet queried. They never
// change, so racing first queries store the same value.
constexpr int kCachedDevices = 64;
std::atomic<int> g_compute_capability[kCachedDevices];
std::atomic<int> g_multiprocessors[kCachedDevices];

// `cache[device_id]`, filled by `query` on first use.
template <typename Query>
Status cached_attribute(std::atomic<int> (&cache)[kCachedDevices], int device_id, int* value, Query query) {
  const bool cacheable = device_id >= 0 && device_id < kCachedDevices;
  if (cacheable) {
    const int cached = cache[device_id].load(std::memory_order_relaxed);
    if (cached != 0) {
      *value = cached;
      return Status::Ok();
    }
  }
  if (Status s = query(value); !s.ok()) return s;
  if (cacheable) cache[device_id].store(*value, std::memory_order_relaxed);
  return Status::Ok();
}
}  // namespace

Status compute_capability(int device_id, int* cc) {
  return cached_attribute(g_compute_capability, device_id, cc, [device_id](int* value) {
    int major = 0;
    int minor = 0;
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id));
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id));
    *value = major * 10 + minor;
    return Status::Ok();
  });
}

Status multiprocessor_count(int device_id, int* sms) {
  return cached_attribute(g_multiprocessors, device_id, sms, [device_id](int* value) {
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(value, cudaDevAttrMultiProcessorCount, device_id));
    return Status::Ok();
  });
}

}  // namespace waveboost::cuda
