// The CPU path: tiled online-softmax attention on the host (backend "cpu").
#pragma once

#include "waveboost/attention.h"

namespace waveboost::cpu {

// Why the CPU path cannot run `params` (dtype, device), or Ok.
Status can_implement(const AttentionParams& params);

// Runs synchronously on the calling thread plus a pool of worker threads.
// Expects validate(params) and can_implement(params) to have passed.
Status attention_forward(const AttentionParams& params);

// The backward pass on the host (src/cpu/cpu_backward.cpp): fp32/fp64, any head dim.
Status can_implement_backward(const AttentionBackwardParams& params);
Status attention_backward(const AttentionBackwardParams& params);

// Serving pieces on the host (src/cpu/cpu_serving.cpp).
Status merge_attention_states(const MergeStatesParams& params);
Status kv_cache_append(const KVCacheAppendParams& params);

}  // namespace waveboost::cpu
