// The registry of compiled CUDA kernels (kernel_registry.h): the generated table and the checks
// that every kernel shares.
#include "cuda/kernel_registry.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_paths.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

#include "generated/kernel_table.inc"

namespace {

std::string pass_words(bool backward) { return backward ? " (backward)" : ""; }

// "a", "a and b", "a, b and c".
std::string word_list(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " and " : ", ";
    out += words[i];
  }
  return out;
}

// The general ("") rows of (backend, pass).
template <typename Visit>
void for_each_row(Backend backend, bool backward, Visit visit) {
  for (const KernelRecord& k : kKernelTable) {
    if (k.backend == backend && k.backward == backward && k.variant[0] == '\0') visit(k);
  }
}

// Why no row of (backend, pass) takes (dtype, head_dim): the dtypes it has, or the head dims it
// has for that dtype.
Status no_kernel(Backend backend, bool backward, DType dtype, int64_t head_dim) {
  // The dtypes in DType order, the head dims ascending, whatever the table's row order.
  std::vector<std::string> dtypes, head_dims;
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    bool present = false;
    for_each_row(backend, backward, [&](const KernelRecord& k) { present = present || k.dtype == d; });
    if (present) dtypes.push_back(dtype_name(d));
  }
  std::vector<int64_t> dims;
  for_each_row(backend, backward, [&](const KernelRecord& k) {
    if (k.dtype == dtype && std::find(dims.begin(), dims.end(), k.head_dim) == dims.end()) dims.push_back(k.head_dim);
  });
  std::sort(dims.begin(), dims.end());
  for (int64_t d : dims) head_dims.push_back(std::to_string(d));
  const std::string who = std::string("backend '") + backend_name(backend) + "'" + pass_words(backward);
  if (dtypes.empty())
    return Status::NotSupported(who + " has no kernels in this build: none for the architectures it targets (" +
                                cuda_architectures() + ")");
  if (head_dims.empty())
    return Status::NotSupported(who + " supports " + word_list(dtypes) + "; got " + dtype_name(dtype));
  return Status::NotSupported(who + " supports head_dim " + word_list(head_dims) + "; got " +
                              std::to_string(head_dim));
}

Status check_common(const AttentionParams& p, const AttentionBackwardParams* grads, Backend backend,
                    const KernelRecord** kernel) {
  const bool backward = grads != nullptr;
  const KernelRecord* k = find_kernel(backend, backward, "", p.dtype, p.head_dim);
  if (k == nullptr) return no_kernel(backend, backward, p.dtype, p.head_dim);
  const std::string who = std::string("backend '") + backend_name(backend) + "'";

  int cc = 0;
  if (Status s = compute_capability(p.device_id, &cc); !s.ok()) return s;
  const std::string device = "; device " + std::to_string(p.device_id) + " has " + cc_string(cc);
  if (k->max_cc != 0 && k->max_cc == k->min_cc && cc != k->min_cc)
    return Status::NotSupported(who + " runs on compute capability " + cc_string(k->min_cc) +
                                (k->min_cc == 90 ? " (Hopper)" : "") + " only" + device);
  if (cc < k->min_cc || (k->max_cc != 0 && cc > k->max_cc)) {
    // Name the dtype (and the head dim) when the backend's rows differ in what they need.
    bool per_dtype = false, per_head_dim = false;
    for_each_row(backend, backward, [&](const KernelRecord& r) {
      if (r.min_cc == k->min_cc) return;
      per_dtype = true;
      per_head_dim = per_head_dim || r.dtype == k->dtype;
    });
    const std::string which = per_head_dim ? " with head_dim " + std::to_string(p.head_dim) : std::string();
    return Status::NotSupported(who + " needs compute capability >= " + cc_string(k->min_cc) +
                                (k->max_cc != 0 ? " and <= " + cc_string(k->max_cc) : std::string()) +
                                (per_dtype ? std::string(" for ") + dtype_name(p.dtype) + which : std::string()) +
                                device);
  }

  if (k->vector_elements > 0) {
    const std::string multiples = " with strides that are multiples of " + std::to_string(k->vector_elements) +
                                  " elements for " + dtype_name(p.dtype);
    if (!vector_friendly(p, k->vector_elements))
      return Status::NotSupported(who + pass_words(backward) + " needs 16-byte aligned q/k/v/out" + multiples);
    if (backward && !gradients_vector_friendly(*grads, k->vector_elements))
      return Status::NotSupported(who + pass_words(backward) + " needs 16-byte aligned dout/dq/dk/dv" + multiples);
  }

  if (k->smem_bytes != nullptr) {
    int smem_optin = 0;
    if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
    const int needed = k->smem_bytes();
    if (needed > smem_optin)
      return Status::NotSupported(who + pass_words(backward) + " needs " + std::to_string(needed) +
                                  " bytes of shared memory per block for " + dtype_name(p.dtype) + " with head_dim " +
                                  std::to_string(p.head_dim) + "; device " + std::to_string(p.device_id) +
                                  " allows " + std::to_string(smem_optin));
  }
  *kernel = k;
  return Status::Ok();
}

}  // namespace

// The caller's dout/dq/dk/dv move like q/k/v/out: 16 B aligned, strides of the dimensions of
// extent > 1 multiples of `elements` elements.
bool gradients_vector_friendly(const AttentionBackwardParams& p, int64_t elements) {
  const auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const auto used = [](int64_t stride, int64_t extent) { return extent > 1 ? stride : int64_t{0}; };
  const int64_t strides = used(p.do_batch_stride, p.batch) | used(p.do_row_stride, p.seqlen_q) |
                          used(p.do_head_stride, p.heads) | used(p.dq_batch_stride, p.batch) |
                          used(p.dq_row_stride, p.seqlen_q) | used(p.dq_head_stride, p.heads) |
                          used(p.dk_batch_stride, p.batch) | used(p.dk_row_stride, p.seqlen_k) |
                          used(p.dk_head_stride, p.heads_kv) | used(p.dv_batch_stride, p.batch) |
                          used(p.dv_row_stride, p.seqlen_k) | used(p.dv_head_stride, p.heads_kv);
  return aligned(p.dout) && aligned(p.dq) && aligned(p.dk) && aligned(p.dv) && (strides & (elements - 1)) == 0;
}

const KernelRecord* kernel_table(size_t* count) {
  *count = sizeof(kKernelTable) / sizeof(kKernelTable[0]);
  return kKernelTable;
}

const KernelRecord* find_kernel(Backend backend, bool backward, const char* variant, DType dtype, int64_t head_dim) {
  for (const KernelRecord& k : kKernelTable) {
    if (k.backend == backend && k.backward == backward && k.dtype == dtype && k.head_dim == head_dim &&
        std::strcmp(k.variant, variant) == 0)
      return &k;
  }
  return nullptr;
}

Status run_forward(Backend backend, const char* variant, const AttentionParams& p, const ForwardLaunch& launch) {
  const KernelRecord* k = find_kernel(backend, false, variant, p.dtype, p.head_dim);
  if (k == nullptr) return no_kernel(backend, false, p.dtype, p.head_dim);
  return k->forward(p, launch);
}

Status run_backward(Backend backend, const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {
  const KernelRecord* k = find_kernel(backend, true, "", p.dtype, p.head_dim);
  if (k == nullptr) return no_kernel(backend, true, p.dtype, p.head_dim);
  return k->backward_entry(p, workspace, stream);
}

Status check_kernel(const AttentionParams& p, Backend backend, const KernelRecord** kernel) {
  return check_common(p, nullptr, backend, kernel);
}

Status check_kernel(const AttentionBackwardParams& p, Backend backend, const KernelRecord** kernel) {
  return check_common(p, &p, backend, kernel);
}

Status plan_forward(const AttentionParams& p, Backend backend, ForwardPlan* plan) {
  plan->backend = backend;
  plan->num_splits = 1;
  switch (backend) {
    case Backend::kWgmma: return wgmma_plan(p, plan);
    case Backend::kDecode: return decode_plan(p, plan);
    case Backend::kNaive: plan->kernel = "naive"; return Status::Ok();
    default: return plan_kernel(backend, "", p, plan);
  }
}

Status plan_kernel(Backend backend, const char* variant, const AttentionParams& p, ForwardPlan* plan) {
  const KernelRecord* k = find_kernel(backend, false, variant, p.dtype, p.head_dim);
  if (k == nullptr) return no_kernel(backend, false, p.dtype, p.head_dim);
  plan->kernel = k->name;
  return Status::Ok();
}

std::vector<KernelInfo> kernel_infos() {
  std::vector<KernelInfo> rows;
  for (const KernelRecord& k : kKernelTable) {
    KernelInfo r;
    r.name = k.name;
    r.backend = k.backend;
    r.backward = k.backward;
    r.variant = k.variant;
    r.dtype = k.dtype;
    r.head_dim = k.head_dim;
    r.min_compute_capability = k.min_cc;
    r.max_compute_capability = k.max_cc;
    r.vector_elements = k.vector_elements;
    r.smem_bytes = k.smem_bytes != nullptr ? k.smem_bytes() : -1;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace waveboost::cuda
