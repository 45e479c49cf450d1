// The arrival counters of a split decode call, zeroed by a kernel (src/cuda/decode_launch.cu).
#include <cstdint>

#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {
namespace {

__global__ void zero_decode_arrivals_kernel(int* counters, int64_t n) {
  // The decode kernel behind this one may be scheduled now: it waits for this grid to complete
  // before it reads a counter.
  tma::launch_dependents();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    counters[i] = 0;
}

}  // namespace

Status zero_decode_arrivals(int* counters, int64_t n, cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads < 1024 ? (n + kThreads - 1) / kThreads : 1024;
  zero_decode_arrivals_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(counters, n);
  return cuda_status(cudaGetLastError(), "zero_decode_arrivals_kernel launch");
}

}  // namespace waveboost::cuda
