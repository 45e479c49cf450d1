// waveboost: exact attention forward, framework-free C++ API.
//
// Layout is BSHD: q is (batch, seqlen_q, heads, head_dim); k and v are
// (batch, seqlen_k, heads_kv, head_dim). Every tensor is described by a raw
// pointer plus int64 element strides per batch, row (sequence position) and
// head; the last dimension must have unit stride. Output has q's shape and
// dtype; lse (optional) is float32 (batch, heads, seqlen_q).
#pragma once

#include <cstdint>
#include <string>

#include "waveboost/status.h"

namespace waveboost {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

// Kernel paths. kAuto resolves to the fastest correct path for the device,
// dtype and head dim (see select_backend).
enum class Backend : int32_t {
  kAuto = 0,
  kCPU = 1,    // tiled online-softmax on the host, fp32/fp64, any head dim
  kNaive = 2,  // CUDA: materialized scores, softmax, then PV (the GPU baseline)
  kSimt = 3,   // CUDA cores flash forward, head dims 64/128
  kWmma = 4,   // tensor-core (nvcuda::wmma) flash forward, fp16/bf16, head dims 64/128
  kMma = 5,    // tensor-core flash forward on raw mma.sync + ldmatrix, fp16/bf16, head dims 64/128
  kWgmma = 6,  // Hopper (sm_90a) flash forward on warpgroup wgmma, fp16/bf16, head dims 64/128
};

// Everything a forward call needs, passed by value to kernels. POD on purpose:
// no framework, DLPack or std types, so it can be a __grid_constant__ parameter.
struct AttentionParams {
  const void* q = nullptr;  // (batch, seqlen_q, heads, head_dim)
  const void* k = nullptr;  // (batch, seqlen_k, heads_kv, head_dim)
  const void* v = nullptr;  // (batch, seqlen_k, heads_kv, head_dim)
  void* out = nullptr;      // (batch, seqlen_q, heads, head_dim), dtype of q
  float* lse = nullptr;     // optional (batch, heads, seqlen_q) natural-log logsumexp; nullptr = not wanted

  // Element strides (not bytes). The head_dim stride is 1 for every tensor.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads = 0;     // query heads
  int64_t heads_kv = 0;  // key/value heads; heads % heads_kv == 0 (GQA/MQA)
  int64_t head_dim = 0;

  double softmax_scale = 0.0;  // multiplies q.k before the softmax
  // Bottom-right aligned causal mask: query i sees key j iff j <= i + seqlen_k - seqlen_q.
  bool is_causal = false;

  DType dtype = DType::kFloat32;  // of q, k, v and out
  DeviceType device_type = DeviceType::kCPU;
  int device_id = 0;  // CUDA ordinal when device_type == kCUDA
};

// Runs the forward pass. `stream` is a cudaStream_t for CUDA data (nullptr =
// legacy default stream) and ignored on the CPU. CUDA work is asynchronous
// with respect to the host; no device-wide synchronization is done.
Status attention_forward(const AttentionParams& params, Backend backend, void* stream);

// Whether `backend` can run `params` on this build and machine; the status
// message says precisely why not. kAuto checks the backend it resolves to.
Status can_implement(const AttentionParams& params, Backend backend);

// The backend kAuto resolves to for these params.
Backend select_backend(const AttentionParams& params);

// Generic checks on shapes, strides, scale and pointers shared by every path.
Status validate(const AttentionParams& params);

const char* backend_name(Backend backend);
const char* dtype_name(DType dtype);
// Parses "auto", "cpu", "naive", "simt", "wmma", "mma", "wgmma"; false for anything else.
bool parse_backend(const std::string& name, Backend* backend);

// Whether `backend` can run on CUDA device `device_id` with this build (compiled
// in, compute capability high enough) for at least one dtype and head dim.
bool backend_available(Backend backend, int device_id);

// Blocks the host until `stream` on CUDA device `device_id` is idle (only for
// callers whose framework cannot order work after ours, e.g. eager JAX through DLPack).
Status stream_synchronize(int device_id, void* stream);

// Build facts.
const char* version();
bool cuda_compiled();
// Semicolon-separated CMAKE_CUDA_ARCHITECTURES the library was built for ("" without CUDA).
const char* cuda_architectures();
// CUDA devices visible to this process: 0 without CUDA support, a driver or a GPU (never an error).
int cuda_device_count();
// e.g. "NVIDIA H100 80GB HBM3, compute capability 9.0"; empty when `device` does not exist.
std::string cuda_device_description(int device);

}  // namespace waveboost
