// Serving pieces on the host: merging partial attention states, appending to a KV cache.
#include "cpu_attention.h"

namespace waveboost::cpu {

Status merge_attention_states(const MergeStatesParams&) {
  return Status::NotSupported("merge_attention_states is not implemented on the CPU yet");
}

Status kv_cache_append(const KVCacheAppendParams&) {
  return Status::NotSupported("kv_cache_append is not implemented on the CPU yet");
}

}  // namespace waveboost::cpu
