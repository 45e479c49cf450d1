// Device queries shared by the CUDA paths.
#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

namespace {
// Device attributes per ordinal, cached lock-free: 0 = not yet queried. They never
// change, so racing first queries store the same value.
constexpr int kCachedDevices = 64;
std::atomic<int> g_compute_capability[kCachedDevices];
std::atomic<int> g_multiprocessors[kCachedDevices];
std::atomic<int> g_shared_memory_optin[kCachedDevices];
std::atomic<int> g_bandwidth_per_sm[kCachedDevices];
std::mutex g_pool_mutex;
cudaMemPool_t g_workspace_pools[kCachedDevices];

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

Status max_shared_memory_per_block(int device_id, int* bytes) {
  return cached_attribute(g_shared_memory_optin, device_id, bytes, [device_id](int* value) {
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id));
    return Status::Ok();
  });
}

Status memory_bandwidth_per_sm(int device_id, int* mbps) {
  return cached_attribute(g_bandwidth_per_sm, device_id, mbps, [device_id](int* value) {
    int clock_khz = 0;
    int bus_bits = 0;
    int sms = 0;
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device_id));
    WAVEBOOST_CUDA_RETURN(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_id));
    if (Status s = multiprocessor_count(device_id, &sms); !s.ok()) return s;
    // Two transfers per memory clock: kHz x 2 x bytes = KB/s; / 1000 = MB/s.
    const int64_t per_sm = sms > 0 ? int64_t{clock_khz} * 2 * (bus_bits / 8) / 1000 / sms : 0;
    *value = per_sm > 0 && per_sm < INT32_MAX ? static_cast<int>(per_sm) : 0;
    return Status::Ok();
  });
}

Status workspace_pool(int device_id, cudaMemPool_t* pool) {
  if (device_id < 0 || device_id >= kCachedDevices) {
    return Status::NotSupported("workspace pools cover CUDA devices 0.." + std::to_string(kCachedDevices - 1) +
                                "; got device " + std::to_string(device_id));
  }
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_workspace_pools[device_id] == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_id;
    cudaMemPool_t created = nullptr;
    WAVEBOOST_CUDA_RETURN(cudaMemPoolCreate(&created, &props));
    uint64_t threshold = kWorkspaceRetainBytes;
    if (const cudaError_t err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &threshold);
        err != cudaSuccess) {
      cudaMemPoolDestroy(created);
      return cuda_status(err, "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
    }
    g_workspace_pools[device_id] = created;
  }
  *pool = g_workspace_pools[device_id];
  return Status::Ok();
}

}  // namespace waveboost::cuda
