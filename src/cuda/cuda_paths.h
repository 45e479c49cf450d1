// Entry points of the CUDA paths, seen from the host-side dispatcher
// (src/attention.cpp). Compiled only when CUDA is enabled (WAVEBOOST_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "waveboost/attention.h"
#include "waveboost/cuda/core/constants.cuh"

namespace waveboost::cuda {

// Each can_implement says precisely why the path cannot run these params on
// params.device_id (dtype, head dim, compute capability), or Ok.
Status naive_can_implement(const AttentionParams& params);
Status simt_can_implement(const AttentionParams& params);
Status wmma_can_implement(const AttentionParams& params);
Status mma_can_implement(const AttentionParams& params);
Status wgmma_can_implement(const AttentionParams& params);

// Launch on `stream` (a cudaStream_t) on params.device_id; asynchronous.
// Expect validate(params) and the matching can_implement to have passed, and a non-empty
// problem (batch, heads and seqlen_q > 0): attention_forward returns early on empty ones.
// can_implement expects params on a CUDA device (attention.cpp's can_implement checks it).
Status naive_forward(const AttentionParams& params, void* stream);
Status simt_forward(const AttentionParams& params, void* stream);
Status wmma_forward(const AttentionParams& params, void* stream);
Status mma_forward(const AttentionParams& params, void* stream);
Status wgmma_forward(const AttentionParams& params, void* stream);

// The kernel and split count a forward on `backend` would launch (plan_forward in attention.h);
// expects can_implement to have passed. Each backend's launcher takes its decisions through the
// same functions (src/cuda/kernel_registry.cu, wgmma_plan, decode_plan).
Status plan_forward(const AttentionParams& params, Backend backend, ForwardPlan* plan);
Status wgmma_plan(const AttentionParams& params, ForwardPlan* plan);
Status decode_plan(const AttentionParams& params, ForwardPlan* plan);

// Split-KV decode (src/cuda/decode_launch.cu).
Status decode_can_implement(const AttentionParams& params);
Status decode_forward(const AttentionParams& params, void* stream);
Status merge_attention_states(const MergeStatesParams& params, void* stream);
Status kv_cache_append(const KVCacheAppendParams& params, void* stream);

// Backward passes (src/cuda/backward_launch.cu).
Status naive_can_implement_backward(const AttentionBackwardParams& params);
Status mma_can_implement_backward(const AttentionBackwardParams& params);
Status naive_backward(const AttentionBackwardParams& params, void* stream);
Status mma_backward(const AttentionBackwardParams& params, void* stream);
Status wgmma_can_implement_backward(const AttentionBackwardParams& params);
Status wgmma_backward(const AttentionBackwardParams& params, void* stream);

// Compute capability (major * 10 + minor) of a device, or a CUDA error.
Status compute_capability(int device_id, int* cc);

// Number of streaming multiprocessors of a device, or a CUDA error.
Status multiprocessor_count(int device_id, int* sms);

// Shared memory one block may opt into on a device (cudaDevAttrMaxSharedMemoryPerBlockOptin),
// queried once per device, or a CUDA error.
Status max_shared_memory_per_block(int device_id, int* bytes);

// DRAM bandwidth per SM in MB/s from the driver's memory clock and bus width (2 x clock x width /
// SMs: an H100 SXM 25.4 GB/s, an H200 37.2 GB/s), queried once per device; 0 when the driver
// reports no clock or width.
Status memory_bandwidth_per_sm(int device_id, int* mbps);

// A device's pool for kernel workspaces (cudaMallocFromPoolAsync / cudaFreeAsync on the
// caller's stream), created on first use. Unlike the default pool, which hands its memory back
// at every synchronization (and then maps it anew, ~50-100 us, on the next call), it keeps up
// to kWorkspaceRetainBytes of freed workspace for the next call.
constexpr uint64_t kWorkspaceRetainBytes = uint64_t{32} << 20;
Status workspace_pool(int device_id, cudaMemPool_t* pool);

}  // namespace waveboost::cuda
