// Backend "decode": can_implement and dispatch of the split-KV decode kernel.
#include "cuda_paths.h"

namespace waveboost::cuda {

Status decode_can_implement(const AttentionParams&) {
  return Status::NotSupported("backend 'decode' is not built yet");
}

Status decode_forward(const AttentionParams& p, void*) { return decode_can_implement(p); }

}  // namespace waveboost::cuda

namespace waveboost::cuda {

Status merge_attention_states(const MergeStatesParams&, void*) {
  return Status::NotSupported("merge_attention_states is not implemented on CUDA yet");
}

Status kv_cache_append(const KVCacheAppendParams&, void*) {
  return Status::NotSupported("kv_cache_append is not implemented on CUDA yet");
}

}  // namespace waveboost::cuda
