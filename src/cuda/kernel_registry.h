// The registry of compiled CUDA kernels: one row per (backend, pass, variant, dtype, head dim),
// generated with the kernels' instantiation files from the table in src/cuda/kernels.py.
//
// A backend's can_implement starts with check_kernel (a kernel exists for the call's dtype and
// head dim, the device's compute capability is in its range, the tensors suit its 16 B pieces,
// its shared memory fits the device) and adds only what is particular to it; its launcher finds
// the kernel with find_kernel and calls its entry. So a new head dim or dtype is a line of the
// table, not a new case in each switch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "waveboost/attention.h"

namespace waveboost::cuda {

struct SplitKV;      // waveboost/cuda/common.cuh
struct DecodeSplit;  // waveboost/cuda/decode.cuh

// What a forward entry gets besides the params: the stream and, for the kernels that split the
// keys, where their pieces go (null when the family takes none).
struct ForwardLaunch {
  cudaStream_t stream = nullptr;
  const SplitKV* split = nullptr;       // wgmma (cp.async)
  const DecodeSplit* decode = nullptr;  // decode
};

using ForwardEntry = Status (*)(const AttentionParams&, const ForwardLaunch&);
using BackwardEntry = Status (*)(const AttentionBackwardParams&, void* workspace, cudaStream_t);

struct KernelRecord {
  const char* name;     // e.g. "mma_hdim64_bf16": its entry point (in the generated mma_bf16.cu)
  Backend backend;
  bool backward;        // pass: false forward, true backward
  const char* variant;  // "" the backend's general kernel; e.g. "tma" for a faster one it tries first
  DType dtype;
  int64_t head_dim;
  int min_cc;           // compute capability, major * 10 + minor
  int max_cc;           // 0: no upper bound (sm_90a code: 90)
  int vector_elements;  // tensors move in 16 B pieces of this many elements; 0: any alignment
  ForwardEntry forward;
  BackwardEntry backward_entry;
  int (*smem_bytes)();  // dynamic shared memory per block; null where it depends on the call
};

// The rows of this build (sm_90a rows only when it targets sm_90).
const KernelRecord* kernel_table(size_t* count);

// The kernel of (backend, pass, variant) for dtype and head_dim, or null.
const KernelRecord* find_kernel(Backend backend, bool backward, const char* variant, DType dtype, int64_t head_dim);

// The checks every kernel of the table shares, on the backend's general ("") kernel for p's dtype
// and head dim; Ok with *kernel set, or why not in the words of the table (the dtypes and head
// dims the backend has, the compute capability it needs, ...).
Status check_kernel(const AttentionParams& p, Backend backend, const KernelRecord** kernel);
Status check_kernel(const AttentionBackwardParams& p, Backend backend, const KernelRecord** kernel);

// Runs the forward kernel of (backend, variant) for p's dtype and head dim; NotSupported, with
// nothing launched, when the table has none.
Status run_forward(Backend backend, const char* variant, const AttentionParams& p, const ForwardLaunch& launch);
// Likewise the backward kernel of the backend.
Status run_backward(Backend backend, const AttentionBackwardParams& p, void* workspace, cudaStream_t stream);
// Sets plan->kernel to the name of (backend, variant)'s forward kernel for p's dtype and head dim;
// NotSupported when the table has none.
Status plan_kernel(Backend backend, const char* variant, const AttentionParams& p, ForwardPlan* plan);

// Whether the backward's dout/dq/dk/dv suit 16 B pieces of `elements` elements (as
// vector_friendly asks of q/k/v/out): 16 B aligned, strides of dimensions of extent > 1 multiples.
bool gradients_vector_friendly(const AttentionBackwardParams& p, int64_t elements);

// Whether the wgmma TMA kernel ("tma" variant) takes p: a dense batch with keys whose K and V
// TMA can describe (src/cuda/sm90/flash_wgmma_ws.cu; only in builds with sm_90a objects).
bool wgmma_tma_applies(const AttentionParams& p);
// The same without encoding the tensor maps (no driver call; the layout checks only).
bool wgmma_tma_fits(const AttentionParams& p);
// Whether the TMA kernel runs p on its persistent grid (a call it takes: wgmma_tma_applies).
bool wgmma_tma_persistent(const AttentionParams& p);

// Whether the decode kernel's TMA variant ("tma") takes p: a dense cache (not packed) or one in
// power-of-two pages of >= 16 keys, K and V that TMA can describe (layout checks, no driver call;
// src/cuda/sm90/decode_tma.cu, only in builds with sm_90a objects).
bool decode_tma_applies(const AttentionParams& p);

// The table as public records (waveboost::kernel_table()).
std::vector<KernelInfo> kernel_infos();

}  // namespace waveboost::cuda
