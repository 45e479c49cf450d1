// capabilities(): what each compiled backend can run, asked of the dispatch's own can_implement
// with synthetic calls, so that the answer cannot drift from what a call would do.
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "waveboost/attention.h"

namespace waveboost {
namespace {

// can_implement reads shapes, strides, dtypes, flags, the device and the pointers' alignment,
// never the data, so one aligned zero buffer stands in for every tensor; as index arrays its
// zeros are valid offsets, lengths and page ids.
alignas(256) const int32_t kStandIn[64] = {};

// A dense call: batch 2, 4 query rows, 64 keys, 4 heads (heads_kv of them for k/v), contiguous BSHD.
AttentionParams dense_probe(Backend backend, DType dtype, int64_t head_dim, int device_id, int64_t heads_kv = 4) {
  AttentionParams p;
  p.q = p.k = p.v = kStandIn;
  p.out = const_cast<int32_t*>(kStandIn);
  p.lse = reinterpret_cast<float*>(const_cast<int32_t*>(kStandIn));
  p.batch = 2, p.seqlen_q = 4, p.seqlen_k = 64, p.heads = 4, p.heads_kv = heads_kv, p.head_dim = head_dim;
  p.q_head_stride = p.o_head_stride = head_dim;
  p.q_row_stride = p.o_row_stride = p.heads * head_dim;
  p.q_batch_stride = p.o_batch_stride = p.seqlen_q * p.q_row_stride;
  p.k_head_stride = p.v_head_stride = head_dim;
  p.k_row_stride = p.v_row_stride = heads_kv * head_dim;
  p.k_batch_stride = p.v_batch_stride = p.seqlen_k * p.k_row_stride;
  p.lse_head_stride = p.seqlen_q, p.lse_batch_stride = p.heads * p.seqlen_q;
  p.dtype = dtype;
  p.device_type = backend == Backend::kCPU ? DeviceType::kCPU : DeviceType::kCUDA;
  p.device_id = backend == Backend::kCPU ? 0 : device_id;
  return p;
}

// The backward of a dense probe: gradients laid out like their tensors.
AttentionBackwardParams backward_probe(const AttentionParams& forward, bool deterministic) {
  AttentionBackwardParams p;
  static_cast<AttentionParams&>(p) = forward;
  p.dout = forward.q;
  p.dq = p.dk = p.dv = forward.out;
  p.do_batch_stride = p.dq_batch_stride = forward.q_batch_stride;
  p.do_row_stride = p.dq_row_stride = forward.q_row_stride;
  p.do_head_stride = p.dq_head_stride = forward.q_head_stride;
  p.dk_batch_stride = p.dv_batch_stride = forward.k_batch_stride;
  p.dk_row_stride = p.dv_row_stride = forward.k_row_stride;
  p.dk_head_stride = p.dv_head_stride = forward.k_head_stride;
  p.deterministic = deterministic;
  return p;
}

// Packed q/out and k/v by cu_seqlens (each sequence as long as the dense probe's).
AttentionParams varlen_probe(AttentionParams p) {
  p.cu_seqlens_q = p.cu_seqlens_k = kStandIn;
  p.q_batch_stride = p.o_batch_stride = p.k_batch_stride = p.v_batch_stride = 0;
  p.lse_batch_stride = 0, p.lse_head_stride = p.batch * p.seqlen_q;
  return p;
}

// k/v as a paged cache: 16-key pages, 4 per sequence, 8 in all.
AttentionParams paged_probe(AttentionParams p) {
  p.block_table = kStandIn;
  p.page_size = 16, p.num_pages = 8, p.block_table_batch_stride = 4;
  p.seqlen_k = 4 * p.page_size;
  p.k_batch_stride = p.v_batch_stride = p.page_size * p.k_row_stride;
  p.seqused_k = kStandIn;
  return p;
}

constexpr DType kProbedDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};

bool runs(const AttentionParams& p, Backend backend) { return can_implement(p, backend).ok(); }
bool runs(const AttentionBackwardParams& p, Backend backend) { return can_implement(p, backend).ok(); }

}  // namespace

std::vector<BackendCapabilities> capabilities(int device_id) {
  std::vector<BackendCapabilities> records;
  for (Backend backend : kAllBackends) {
    if (backend == Backend::kAuto) continue;
    BackendCapabilities c;
    c.backend = backend;
    c.device_type = backend == Backend::kCPU ? DeviceType::kCPU : DeviceType::kCUDA;
    if (c.device_type == DeviceType::kCUDA && !cuda_compiled()) continue;  // not in this build
    if (c.device_type == DeviceType::kCUDA && (device_id < 0 || device_id >= cuda_device_count())) {
      c.reason = "no CUDA device " + std::to_string(device_id) + " is visible to this process";
      records.push_back(c);
      continue;
    }
    // The first refusal's message says why nothing runs, when nothing does.
    std::string first_refusal;
    bool found = false, found_backward = false;
    DType base_dtype = DType::kFloat32, backward_dtype = DType::kFloat32;
    int64_t base_head_dim = 0, backward_head_dim = 0;
    bool forward_dtype[std::size(kProbedDTypes)] = {}, backward_dtype_runs[std::size(kProbedDTypes)] = {};
    for (int64_t head_dim : kProbedHeadDims) {
      bool forward = false, backward = false;
      for (size_t i = 0; i < std::size(kProbedDTypes); ++i) {
        const DType dtype = kProbedDTypes[i];
        const AttentionParams p = dense_probe(backend, dtype, head_dim, device_id);
        const Status s = can_implement(p, backend);
        if (!s.ok()) {
          if (first_refusal.empty()) first_refusal = s.message();
          continue;
        }
        forward = forward_dtype[i] = true;
        if (!found) found = true, base_dtype = dtype, base_head_dim = head_dim;
        if (runs(backward_probe(p, false), backend)) {
          backward = backward_dtype_runs[i] = true;
          if (!found_backward) found_backward = true, backward_dtype = dtype, backward_head_dim = head_dim;
        }
      }
      if (forward) c.head_dims.push_back(head_dim);
      if (backward) c.backward_head_dims.push_back(head_dim);
    }
    for (size_t i = 0; i < std::size(kProbedDTypes); ++i) {
      if (forward_dtype[i]) c.forward_dtypes.push_back(kProbedDTypes[i]);
      if (backward_dtype_runs[i]) c.backward_dtypes.push_back(kProbedDTypes[i]);
    }
    c.available = found;
    if (!found) {
      c.reason = first_refusal;
      records.push_back(c);
      continue;
    }
    c.any_head_dim = c.head_dims.size() == std::size(kProbedHeadDims);

    const AttentionParams base = dense_probe(backend, base_dtype, base_head_dim, device_id);
    AttentionParams causal = base;
    causal.is_causal = true;
    c.causal = runs(causal, backend);
    c.gqa = runs(dense_probe(backend, base_dtype, base_head_dim, device_id, 2), backend);
    c.varlen = runs(varlen_probe(base), backend);
    AttentionParams seqused = base;
    seqused.seqused_k = kStandIn;
    c.seqused = runs(seqused, backend);
    c.paged = runs(paged_probe(base), backend);
    if (found_backward) {
      const AttentionParams b = dense_probe(backend, backward_dtype, backward_head_dim, device_id);
      c.deterministic_backward = runs(backward_probe(b, true), backend);
    }
    records.push_back(c);
  }
  return records;
}

}  // namespace waveboost
