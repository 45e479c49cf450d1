// The backward pass on the host (backend "cpu").
#include "cpu_attention.h"

namespace waveboost::cpu {

Status can_implement_backward(const AttentionBackwardParams&) {
  return Status::NotSupported("backend 'cpu' has no backward pass yet");
}

Status attention_backward(const AttentionBackwardParams&) {
  return Status::NotSupported("backend 'cpu' has no backward pass yet");
}

}  // namespace waveboost::cpu
