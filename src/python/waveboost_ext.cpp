// waveboost._waveboost: the only nanobind code. It turns DLPack tensors into
// AttentionParams, checks every constraint with a message that names the
// argument, releases the GIL and calls the C++ API. No kernel logic here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "waveboost/attention.h"

namespace nb = nanobind;
using waveboost::AttentionParams;
using waveboost::Backend;
using waveboost::DType;
using waveboost::Status;
using waveboost::StatusCode;

namespace {

// Inputs may be read-only (JAX arrays, non-writeable NumPy arrays); outputs may not.
using InputTensor = nb::ndarray<nb::ro>;
using OutputTensor = nb::ndarray<>;

// Messages are built with std::to_string and concatenation, not iostreams: a module
// linked against a static libstdc++ next to another (e.g. PyTorch's) can crash formatting
// numbers through an uninitialized locale.
std::string join_ints(const nb::ndarray<nb::ro>& t, bool strides) {
  std::string s = "(";
  for (size_t i = 0; i < t.ndim(); ++i)
    s += (i ? ", " : "") + (strides ? std::to_string(t.stride(i)) : std::to_string(t.shape(i)));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

std::string shape_str(const nb::ndarray<nb::ro>& t) { return join_ints(t, false); }

std::string dtype_str(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  const char* kind = "unknown";
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: kind = "int"; break;
    case Code::UInt: kind = "uint"; break;
    case Code::Float: kind = "float"; break;
    case Code::Bfloat: kind = "bfloat"; break;
    case Code::Complex: kind = "complex"; break;
    case Code::Bool: return "bool";
    default: break;
  }
  std::string s = std::string(kind) + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

std::string device_str(int device_type, int device_id) {
  switch (device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda:" + std::to_string(device_id);
    case nb::device::cuda_host::value: return "cuda_host (pinned host memory)";
    case nb::device::cuda_managed::value: return "cuda_managed:" + std::to_string(device_id);
    default: return "DLPack device type " + std::to_string(device_type);
  }
}

std::optional<DType> to_dtype(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return std::nullopt;
  if (dt.code == static_cast<uint8_t>(Code::Float)) {
    if (dt.bits == 16) return DType::kFloat16;
    if (dt.bits == 32) return DType::kFloat32;
    if (dt.bits == 64) return DType::kFloat64;
  }
  if (dt.code == static_cast<uint8_t>(Code::Bfloat) && dt.bits == 16) return DType::kBFloat16;
  return std::nullopt;
}

[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }
[[noreturn]] void type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }

void check_ndim(const InputTensor& t, const char* name, size_t ndim, const char* layout) {
  if (t.ndim() != ndim)
    value_error(std::string(name) + " must be a " + std::to_string(ndim) + "-D tensor " + layout + "; got " +
                std::to_string(t.ndim()) + "-D with shape " + shape_str(t));
}

void check_dim(const InputTensor& t, const char* name, size_t dim, const char* dim_name, int64_t expected,
               const char* expected_from) {
  if (static_cast<int64_t>(t.shape(dim)) != expected)
    value_error(std::string(name) + " has " + dim_name + " " + std::to_string(t.shape(dim)) + " (shape " +
                shape_str(t) + ") but " + expected_from + " is " + std::to_string(expected));
}

// The head_dim (last) dimension must be contiguous so kernels can use vector loads.
void check_unit_last_stride(const InputTensor& t, const char* name) {
  const size_t last = t.ndim() - 1;
  if (t.size() > 0 && t.shape(last) > 1 && t.stride(last) != 1)
    value_error(std::string(name) + " must have unit stride in its last (head_dim) dimension; got stride " +
                std::to_string(t.stride(last)) + " (pass a view whose last dimension is contiguous, or a copy)");
}

void check_same_device(const InputTensor& t, const char* name, const InputTensor& q) {
  if (t.device_type() != q.device_type() || t.device_id() != q.device_id())
    value_error(std::string(name) + " is on " + device_str(t.device_type(), t.device_id()) + " but q is on " +
                device_str(q.device_type(), q.device_id()) + "; all tensors must be on one device");
}

// Byte range [first, last] a strided tensor can touch, for the aliasing check.
std::pair<uintptr_t, uintptr_t> byte_span(const InputTensor& t) {
  uintptr_t lo = reinterpret_cast<uintptr_t>(t.data());
  uintptr_t hi = lo;
  for (size_t i = 0; i < t.ndim(); ++i) {
    if (t.shape(i) == 0) return {lo, lo};
    const int64_t reach = (static_cast<int64_t>(t.shape(i)) - 1) * t.stride(i) * static_cast<int64_t>(t.itemsize());
    if (reach >= 0) hi += reach; else lo += reach;
  }
  return {lo, hi + t.itemsize() - 1};
}

void check_no_overlap(const InputTensor& out, const char* out_name, const InputTensor& t, const char* name) {
  if (out.size() == 0 || t.size() == 0) return;
  auto [a0, a1] = byte_span(out);
  auto [b0, b1] = byte_span(t);
  if (a0 <= b1 && b0 <= a1)
    value_error(std::string(out_name) + " overlaps the memory of " + name + "; outputs must not alias inputs");
}

// Kernels write every element of `out` once, from one thread. An `out` whose
// elements share memory (a zero stride, e.g. an expand()ed or broadcast view,
// or strides that make rows or heads overlap) would have several threads race
// on one address. Sufficient test: sorted by stride, each dimension must step
// past everything the smaller-stride dimensions span. (It refuses only exotic
// interleavings that happen not to overlap; ordinary layouts pass.)
void check_no_internal_overlap(const InputTensor& t, const char* name) {
  if (t.size() == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent) of dimensions of extent > 1
  for (size_t i = 0; i < t.ndim(); ++i)
    if (t.shape(i) > 1) dims.emplace_back(std::abs(static_cast<int64_t>(t.stride(i))), static_cast<int64_t>(t.shape(i)));
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // elements spanned by the dimensions so far, minus one
  for (auto [stride, extent] : dims) {
    if (stride <= span)
      value_error(std::string(name) + " has overlapping elements (shape " + shape_str(t) + ", strides " +
                  join_ints(t, true) + "); outputs must not overlap themselves (e.g. no expand()ed or broadcast views)");
    span += stride * (extent - 1);
  }
}

void raise_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotSupported: value_error(s.message());
    case StatusCode::kCudaError:
    case StatusCode::kInternal: break;
  }
  throw std::runtime_error(s.message());
}

Backend parse_backend_or_raise(const std::string& name) {
  Backend b;
  if (!waveboost::parse_backend(name, &b))
    value_error("backend must be one of 'auto', 'cpu', 'naive', 'simt', 'wmma', 'mma', 'wgmma', 'decode'; got '" + name + "'");
  return b;
}

// The backend a call with params `p` (forward or backward) runs for `requested`; raises why not.
template <typename Params>
std::string resolved_backend_name(const Params& p, Backend requested) {
  const Backend chosen = requested == Backend::kAuto ? waveboost::select_backend(p) : requested;
  raise_status(waveboost::can_implement(p, chosen));
  return waveboost::backend_name(chosen);
}

// Fills AttentionParams from DLPack tensors after checking every constraint.
AttentionParams make_params(const InputTensor& q, const InputTensor& k, const InputTensor& v,
                            const InputTensor* out_ptr, const std::optional<InputTensor>& lse, bool causal,
                            std::optional<double> softmax_scale) {
  check_ndim(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
  check_ndim(k, "k", 4, "(batch, seqlen_k, heads_kv, head_dim)");
  check_ndim(v, "v", 4, "(batch, seqlen_k, heads_kv, head_dim)");
  // Without an output (resolve_backend) q stands in for it: every out check then holds trivially.
  const InputTensor& out = out_ptr ? *out_ptr : q;
  check_ndim(out, "out", 4, "(batch, seqlen_q, heads, head_dim)");

  const std::optional<DType> dtype = to_dtype(q.dtype());
  if (!dtype)
    type_error("q must have a floating-point dtype (float16, bfloat16, float32 or float64); got " +
               dtype_str(q.dtype()));
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    if (t->dtype() != q.dtype())
      type_error(std::string(name) + " has dtype " + dtype_str(t->dtype()) + " but q has " + dtype_str(q.dtype()) +
                 "; q, k, v and out must share one dtype");
  }

  const int dev_type = q.device_type();
  if (dev_type != nb::device::cpu::value && dev_type != nb::device::cuda::value)
    value_error("q is on " + device_str(dev_type, q.device_id()) +
                "; waveboost runs on CPU memory and CUDA device memory");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_same_device(out, "out", q);

  const int64_t batch = q.shape(0), seqlen_q = q.shape(1), heads = q.shape(2), head_dim = q.shape(3);
  const int64_t seqlen_k = k.shape(1), heads_kv = k.shape(2);
  check_dim(k, "k", 0, "batch", batch, "q's batch");
  check_dim(k, "k", 3, "head_dim", head_dim, "q's head_dim");
  for (size_t d = 0; d < 4; ++d) {
    static const char* names[] = {"batch", "seqlen_k", "heads_kv", "head_dim"};
    check_dim(v, "v", d, names[d], static_cast<int64_t>(k.shape(d)), (std::string("k's ") + names[d]).c_str());
  }
  if (head_dim < 1) value_error("q has head_dim 0 (shape " + shape_str(q) + "); head_dim must be >= 1");
  if (heads_kv == 0 && heads > 0)
    value_error("k has 0 heads (shape " + shape_str(k) + ") but q has " + std::to_string(heads));
  if (heads_kv > 0 && heads % heads_kv != 0)
    value_error("q's heads (" + std::to_string(heads) + ") must be a multiple of k's heads_kv (" +
                std::to_string(heads_kv) + ") for grouped-query attention");
  for (size_t d = 0; d < 4; ++d) {
    static const char* names[] = {"batch", "seqlen_q", "heads", "head_dim"};
    check_dim(out, "out", d, names[d], static_cast<int64_t>(q.shape(d)), (std::string("q's ") + names[d]).c_str());
  }
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_unit_last_stride(*t, name);
  if (out_ptr) {
    check_no_internal_overlap(out, "out");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check_no_overlap(out, "out", *t, name);
  }

  AttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = const_cast<void*>(out.data());
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  if (!out_ptr)  // no output: describe the contiguous one a call would allocate, not q's (maybe broadcast) strides
    p.o_head_stride = q.shape(3), p.o_row_stride = q.shape(2) * q.shape(3), p.o_batch_stride = q.shape(1) * p.o_row_stride;

  if (lse) {
    const InputTensor& l = *lse;
    check_ndim(l, "lse", 3, "(batch, heads, seqlen_q)");
    if (!(l.dtype() == nb::dtype<float>()))
      type_error("lse must have dtype float32; got " + dtype_str(l.dtype()));
    check_same_device(l, "lse", q);
    check_dim(l, "lse", 0, "batch", batch, "q's batch");
    check_dim(l, "lse", 1, "heads", heads, "q's heads");
    check_dim(l, "lse", 2, "seqlen_q", seqlen_q, "q's seqlen_q");
    check_unit_last_stride(l, "lse");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data()));
    p.lse_batch_stride = l.stride(0), p.lse_head_stride = l.stride(1);
  }

  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  if (softmax_scale && !std::isfinite(*softmax_scale))
    value_error(std::string("softmax_scale must be a finite number; got ") +
                (std::isnan(*softmax_scale) ? "nan" : (*softmax_scale > 0 ? "inf" : "-inf")));
  p.softmax_scale = softmax_scale ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  p.is_causal = causal;
  p.dtype = *dtype;
  p.device_type = dev_type == nb::device::cuda::value ? waveboost::DeviceType::kCUDA : waveboost::DeviceType::kCPU;
  p.device_id = dev_type == nb::device::cuda::value ? q.device_id() : 0;
  return p;
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

// `t` must look like `ref` (a 4-D BSHD tensor): same dtype, device and shape, unit last stride.
void check_like(const InputTensor& t, const char* name, const InputTensor& ref, const char* ref_name,
                const char* layout) {
  check_ndim(t, name, 4, layout);
  if (t.dtype() != ref.dtype())
    type_error(std::string(name) + " has dtype " + dtype_str(t.dtype()) + " but " + ref_name + " has " +
               dtype_str(ref.dtype()) + "; they must match");
  check_same_device(t, name, ref);
  for (size_t d = 0; d < 4; ++d)
    if (t.shape(d) != ref.shape(d))
      value_error(std::string(name) + " has shape " + shape_str(t) + " but " + ref_name + " has shape " +
                  shape_str(ref) + "; they must match");
  check_unit_last_stride(t, name);
}

// Fills AttentionBackwardParams from DLPack tensors: the forward's checks (make_params) plus
// those of dout, dlse and the three gradients, which must not overlap each other or any input.
waveboost::AttentionBackwardParams make_backward_params(
    const InputTensor& dout, const InputTensor& q, const InputTensor& k, const InputTensor& v,
    const InputTensor& out, const InputTensor& lse, const InputTensor& dq, const InputTensor& dk,
    const InputTensor& dv, const std::optional<InputTensor>& dlse, bool causal, std::optional<double> softmax_scale,
    bool deterministic) {
  waveboost::AttentionBackwardParams p;
  static_cast<AttentionParams&>(p) = make_params(q, k, v, &out, lse, causal, softmax_scale);
  check_like(dout, "dout", q, "q", "(batch, seqlen_q, heads, head_dim)");
  check_like(dq, "dq", q, "q", "(batch, seqlen_q, heads, head_dim)");
  check_like(dk, "dk", k, "k", "(batch, seqlen_k, heads_kv, head_dim)");
  check_like(dv, "dv", v, "v", "(batch, seqlen_k, heads_kv, head_dim)");
  if (dlse) {
    const InputTensor& l = *dlse;
    check_ndim(l, "dlse", 3, "(batch, heads, seqlen_q)");
    if (!(l.dtype() == nb::dtype<float>())) type_error("dlse must have dtype float32; got " + dtype_str(l.dtype()));
    check_same_device(l, "dlse", q);
    for (size_t d = 0; d < 3; ++d)
      if (l.shape(d) != lse.shape(d))
        value_error("dlse has shape " + shape_str(l) + " but lse has shape " + shape_str(lse) + "; they must match");
    check_unit_last_stride(l, "dlse");
  }
  const std::pair<const InputTensor*, const char*> grads[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  for (size_t i = 0; i < 3; ++i) {
    auto [g, gname] = grads[i];
    check_no_internal_overlap(*g, gname);
    for (auto [t, name] : {std::pair{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}})
      check_no_overlap(*g, gname, *t, name);
    if (dlse) check_no_overlap(*g, gname, *dlse, "dlse");
    for (size_t j = 0; j < i; ++j)
      if (g->size() > 0 && grads[j].first->size() > 0) {
        auto [a0, a1] = byte_span(*g);
        auto [b0, b1] = byte_span(*grads[j].first);
        if (a0 <= b1 && b0 <= a1)
          value_error(std::string(gname) + " overlaps the memory of " + grads[j].second +
                      "; dq, dk and dv must be separate buffers");
      }
  }
  p.dout = dout.data();
  p.dq = const_cast<void*>(dq.data());
  p.dk = const_cast<void*>(dk.data());
  p.dv = const_cast<void*>(dv.data());
  p.do_batch_stride = dout.stride(0), p.do_row_stride = dout.stride(1), p.do_head_stride = dout.stride(2);
  p.dq_batch_stride = dq.stride(0), p.dq_row_stride = dq.stride(1), p.dq_head_stride = dq.stride(2);
  p.dk_batch_stride = dk.stride(0), p.dk_row_stride = dk.stride(1), p.dk_head_stride = dk.stride(2);
  p.dv_batch_stride = dv.stride(0), p.dv_row_stride = dv.stride(1), p.dv_head_stride = dv.stride(2);
  if (dlse) {
    p.dlse = static_cast<const float*>(dlse->data());
    p.dlse_batch_stride = dlse->stride(0), p.dlse_head_stride = dlse->stride(1);
  }
  p.deterministic = deterministic;
  return p;
}

}  // namespace


// ---------------------------------------------------------------------------
// Serving: varlen / paged / seqused forward, merging attention states, KV-cache append.
// ---------------------------------------------------------------------------
namespace {

using waveboost::KVCacheAppendParams;
using waveboost::MergeStatesParams;

// An int32 index array (cu_seqlens, seqused, cache_seqlens, block_table) of the given shape on
// q's device. 1-D arrays must be contiguous (the C++ params carry no stride for them); a 2-D
// block_table needs a unit last stride.
const int32_t* index_array(const InputTensor& t, const char* name, const std::vector<int64_t>& shape,
                           const char* layout, const InputTensor& q, const char* q_name) {
  check_ndim(t, name, shape.size(), layout);
  if (!(t.dtype() == nb::dtype<int32_t>()))
    type_error(std::string(name) + " must have dtype int32; got " + dtype_str(t.dtype()));
  if (t.device_type() != q.device_type() || t.device_id() != q.device_id())
    value_error(std::string(name) + " is on " + device_str(t.device_type(), t.device_id()) + " but " + q_name +
                " is on " + device_str(q.device_type(), q.device_id()) + "; all tensors must be on one device");
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] >= 0 && static_cast<int64_t>(t.shape(d)) != shape[d])
      value_error(std::string(name) + " must have shape " + layout + " = " + [&] {
        std::string s = "(";
        for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (shape[i] >= 0 ? std::to_string(shape[i]) : std::string("*"));
        return s + (shape.size() == 1 ? ",)" : ")");
      }() + "; got " + shape_str(t));
  }
  const size_t last = t.ndim() - 1;
  if (t.shape(last) > 1 && t.stride(last) != 1)
    value_error(std::string(name) + " must be contiguous in its last dimension; got stride " +
                std::to_string(t.stride(last)));
  return static_cast<const int32_t*>(t.data());
}

void check_float_dtype(const InputTensor& t, const char* name) {
  if (!to_dtype(t.dtype()))
    type_error(std::string(name) + " must have a floating-point dtype (float16, bfloat16, float32 or float64); got " +
               dtype_str(t.dtype()));
}

void check_same_dtype(const InputTensor& t, const char* name, const InputTensor& ref, const char* ref_name) {
  if (t.dtype() != ref.dtype())
    type_error(std::string(name) + " has dtype " + dtype_str(t.dtype()) + " but " + ref_name + " has " +
               dtype_str(ref.dtype()) + "; they must share one dtype");
}

void check_float32(const InputTensor& t, const char* name) {
  if (!(t.dtype() == nb::dtype<float>())) type_error(std::string(name) + " must have dtype float32; got " + dtype_str(t.dtype()));
}

void check_device_supported(const InputTensor& t, const char* name) {
  const int dev_type = t.device_type();
  if (dev_type != nb::device::cpu::value && dev_type != nb::device::cuda::value)
    value_error(std::string(name) + " is on " + device_str(dev_type, t.device_id()) +
                "; waveboost runs on CPU memory and CUDA device memory");
}

void set_device(const InputTensor& t, waveboost::DeviceType* type, int* id) {
  const bool cuda = t.device_type() == nb::device::cuda::value;
  *type = cuda ? waveboost::DeviceType::kCUDA : waveboost::DeviceType::kCPU;
  *id = cuda ? t.device_id() : 0;
}

// Fills AttentionParams for a forward with a sequence layout. q/out are packed (total_q, heads,
// head_dim) with cu_seqlens_q, else (batch, seqlen_q, heads, head_dim); k/v are a paged cache
// (num_pages, page_size, heads_kv, head_dim) with block_table, packed (total_k, heads_kv, head_dim)
// with cu_seqlens_k, else (batch, seqlen_k, heads_kv, head_dim).
AttentionParams make_sequence_params(const InputTensor& q, const InputTensor& k, const InputTensor& v,
                                     const InputTensor& out, const std::optional<InputTensor>& lse,
                                     const std::optional<InputTensor>& cu_seqlens_q,
                                     const std::optional<InputTensor>& cu_seqlens_k,
                                     const std::optional<InputTensor>& seqused_k,
                                     const std::optional<InputTensor>& block_table, std::optional<int64_t> max_seqlen_q,
                                     std::optional<int64_t> max_seqlen_k, bool causal,
                                     std::optional<double> softmax_scale) {
  const bool varlen_q = cu_seqlens_q.has_value();
  const bool varlen_k = cu_seqlens_k.has_value();
  const bool paged = block_table.has_value();
  if (varlen_k && paged)
    value_error("cu_seqlens_k and block_table are exclusive: with a paged cache each sequence's keys are given by "
                "its block_table row and seqused_k");
  if (varlen_q) {
    check_ndim(q, "q", 3, "(total_q, heads, head_dim) with cu_seqlens_q");
    check_ndim(out, "out", 3, "(total_q, heads, head_dim)");
  } else {
    check_ndim(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
    check_ndim(out, "out", 4, "(batch, seqlen_q, heads, head_dim)");
  }
  const char* k_layout = paged ? "(num_pages, page_size, heads_kv, head_dim) with block_table"
                               : (varlen_k ? "(total_k, heads_kv, head_dim) with cu_seqlens_k"
                                           : "(batch, seqlen_k, heads_kv, head_dim)");
  const size_t k_ndim = varlen_k ? 3 : 4;
  check_ndim(k, "k", k_ndim, k_layout);
  check_ndim(v, "v", k_ndim, k_layout);

  const std::optional<DType> dtype = to_dtype(q.dtype());
  if (!dtype)
    type_error("q must have a floating-point dtype (float16, bfloat16, float32 or float64); got " +
               dtype_str(q.dtype()));
  check_same_dtype(k, "k", q, "q");
  check_same_dtype(v, "v", q, "q");
  check_same_dtype(out, "out", q, "q");
  check_device_supported(q, "q");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_same_device(out, "out", q);

  const size_t qd = varlen_q ? 1 : 2;  // q's heads dimension
  const size_t kd = varlen_k ? 1 : 2;  // k's heads_kv dimension
  const int64_t heads = q.shape(qd), head_dim = q.shape(qd + 1), heads_kv = k.shape(kd);
  if (varlen_q && (cu_seqlens_q->ndim() != 1 || cu_seqlens_q->shape(0) < 1))
    value_error("cu_seqlens_q must be a 1-D array (batch + 1,) with at least one entry; got shape " +
                shape_str(*cu_seqlens_q));
  const int64_t batch = varlen_q ? static_cast<int64_t>(cu_seqlens_q->shape(0)) - 1 : static_cast<int64_t>(q.shape(0));
  for (size_t d = 0; d < k.ndim(); ++d)
    if (v.shape(d) != k.shape(d))
      value_error("v has shape " + shape_str(v) + " but k has " + shape_str(k) + "; they must match");
  check_dim(k, "k", kd + 1, "head_dim", head_dim, "q's head_dim");
  for (size_t d = 0; d < q.ndim(); ++d)
    if (out.shape(d) != q.shape(d))
      value_error("out has shape " + shape_str(out) + " but q has " + shape_str(q) + "; they must match");
  if (head_dim < 1) value_error("q has head_dim 0 (shape " + shape_str(q) + "); head_dim must be >= 1");
  if (heads_kv == 0 && heads > 0) value_error("k has 0 heads (shape " + shape_str(k) + ") but q has " + std::to_string(heads));
  if (heads_kv > 0 && heads % heads_kv != 0)
    value_error("q's heads (" + std::to_string(heads) + ") must be a multiple of k's heads_kv (" +
                std::to_string(heads_kv) + ") for grouped-query attention");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_unit_last_stride(*t, name);
  check_no_internal_overlap(out, "out");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check_no_overlap(out, "out", *t, name);

  AttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = const_cast<void*>(out.data());
  if (varlen_q) {
    p.cu_seqlens_q = index_array(*cu_seqlens_q, "cu_seqlens_q", {batch + 1}, "(batch + 1,)", q, "q");
    if (!max_seqlen_q) value_error("max_seqlen_q is required with cu_seqlens_q");
    if (*max_seqlen_q < 0) value_error("max_seqlen_q must be >= 0; got " + std::to_string(*max_seqlen_q));
    p.seqlen_q = *max_seqlen_q;
    p.q_row_stride = q.stride(0), p.q_head_stride = q.stride(1);
    p.o_row_stride = out.stride(0), p.o_head_stride = out.stride(1);
  } else {
    p.seqlen_q = q.shape(1);
    p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
    p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  }
  if (paged) {
    p.block_table = index_array(*block_table, "block_table", {batch, -1}, "(batch, max_pages)", q, "q");
    p.block_table_batch_stride = block_table->stride(0);
    p.page_size = k.shape(1);
    p.num_pages = k.shape(0);
    p.seqlen_k = static_cast<int64_t>(block_table->shape(1)) * p.page_size;
    p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
    p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  } else if (varlen_k) {
    p.cu_seqlens_k = index_array(*cu_seqlens_k, "cu_seqlens_k", {batch + 1}, "(batch + 1,)", q, "q");
    if (!max_seqlen_k) value_error("max_seqlen_k is required with cu_seqlens_k");
    if (*max_seqlen_k < 0) value_error("max_seqlen_k must be >= 0; got " + std::to_string(*max_seqlen_k));
    p.seqlen_k = *max_seqlen_k;
    p.k_row_stride = k.stride(0), p.k_head_stride = k.stride(1);
    p.v_row_stride = v.stride(0), p.v_head_stride = v.stride(1);
  } else {
    check_dim(k, "k", 0, "batch", batch, varlen_q ? "the batch of cu_seqlens_q" : "q's batch");
    p.seqlen_k = k.shape(1);
    p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
    p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  }
  if (seqused_k) p.seqused_k = index_array(*seqused_k, "seqused_k", {batch}, "(batch,)", q, "q");
  // Host memory costs nothing to read: the packed extents are checked here (the CPU backend checks
  // the rest of the indices it follows). On a device they are checked only by validate=True.
  if (q.device_type() == nb::device::cpu::value) {
    for (auto [cu, name, t] : {std::tuple{p.cu_seqlens_q, "cu_seqlens_q", &q}, {p.cu_seqlens_k, "cu_seqlens_k", &k}}) {
      if (cu == nullptr) continue;
      if (cu[0] < 0 || cu[batch] > static_cast<int64_t>(t->shape(0)))
        value_error(std::string(name) + " must lie in [0, " + std::to_string(t->shape(0)) + "] (the packed rows); got " +
                    name + "[0] = " + std::to_string(cu[0]) + ", " + name + "[-1] = " + std::to_string(cu[batch]));
    }
  }

  if (lse) {
    const InputTensor& l = *lse;
    check_float32(l, "lse");
    check_same_device(l, "lse", q);
    if (varlen_q) {
      check_ndim(l, "lse", 2, "(heads, total_q)");
      check_dim(l, "lse", 0, "heads", heads, "q's heads");
      check_dim(l, "lse", 1, "total_q", q.shape(0), "q's total_q");
      p.lse_head_stride = l.stride(0);
    } else {
      check_ndim(l, "lse", 3, "(batch, heads, seqlen_q)");
      check_dim(l, "lse", 0, "batch", batch, "q's batch");
      check_dim(l, "lse", 1, "heads", heads, "q's heads");
      check_dim(l, "lse", 2, "seqlen_q", p.seqlen_q, "q's seqlen_q");
      p.lse_batch_stride = l.stride(0), p.lse_head_stride = l.stride(1);
    }
    check_unit_last_stride(l, "lse");
    check_no_internal_overlap(l, "lse");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data()));
  }

  p.batch = batch, p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  if (softmax_scale && !std::isfinite(*softmax_scale))
    value_error(std::string("softmax_scale must be a finite number; got ") +
                (std::isnan(*softmax_scale) ? "nan" : (*softmax_scale > 0 ? "inf" : "-inf")));
  p.softmax_scale = softmax_scale ? *softmax_scale : waveboost::kDefaultSoftmaxScale;
  p.is_causal = causal;
  p.dtype = *dtype;
  set_device(q, &p.device_type, &p.device_id);
  return p;
}

MergeStatesParams make_merge_params(const InputTensor& outs, const InputTensor& lses, const InputTensor& out,
                                    const std::optional<InputTensor>& lse) {
  check_ndim(outs, "outs", 5, "(num_parts, batch, seqlen, heads, head_dim)");
  check_ndim(lses, "lses", 4, "(num_parts, batch, heads, seqlen)");
  check_ndim(out, "out", 4, "(batch, seqlen, heads, head_dim)");
  check_float_dtype(outs, "outs");
  check_float_dtype(out, "out");
  check_float32(lses, "lses");
  check_device_supported(outs, "outs");
  check_same_device(lses, "lses", outs);
  check_same_device(out, "out", outs);
  const int64_t parts = outs.shape(0), batch = outs.shape(1), seqlen = outs.shape(2), heads = outs.shape(3),
                head_dim = outs.shape(4);
  check_dim(lses, "lses", 0, "num_parts", parts, "outs' num_parts");
  check_dim(lses, "lses", 1, "batch", batch, "outs' batch");
  check_dim(lses, "lses", 2, "heads", heads, "outs' heads");
  check_dim(lses, "lses", 3, "seqlen", seqlen, "outs' seqlen");
  check_dim(out, "out", 0, "batch", batch, "outs' batch");
  check_dim(out, "out", 1, "seqlen", seqlen, "outs' seqlen");
  check_dim(out, "out", 2, "heads", heads, "outs' heads");
  check_dim(out, "out", 3, "head_dim", head_dim, "outs' head_dim");
  check_unit_last_stride(outs, "outs");  // lses may have any strides: the params carry all four
  check_unit_last_stride(out, "out");
  check_no_internal_overlap(out, "out");
  check_no_overlap(out, "out", outs, "outs");
  check_no_overlap(out, "out", lses, "lses");

  MergeStatesParams p;
  p.outs = outs.data();
  p.outs_dtype = *to_dtype(outs.dtype());
  p.outs_part_stride = outs.stride(0), p.outs_batch_stride = outs.stride(1), p.outs_row_stride = outs.stride(2),
  p.outs_head_stride = outs.stride(3);
  p.lses = static_cast<const float*>(lses.data());
  p.lses_part_stride = lses.stride(0), p.lses_batch_stride = lses.stride(1), p.lses_head_stride = lses.stride(2),
  p.lses_row_stride = lses.stride(3);
  p.out = const_cast<void*>(out.data());
  p.dtype = *to_dtype(out.dtype());
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  if (lse) {
    const InputTensor& l = *lse;
    check_ndim(l, "lse", 3, "(batch, heads, seqlen)");
    check_float32(l, "lse");
    check_same_device(l, "lse", outs);
    check_dim(l, "lse", 0, "batch", batch, "outs' batch");
    check_dim(l, "lse", 1, "heads", heads, "outs' heads");
    check_dim(l, "lse", 2, "seqlen", seqlen, "outs' seqlen");
    check_unit_last_stride(l, "lse");
    check_no_internal_overlap(l, "lse");
    for (auto [t, name] : {std::pair{&outs, "outs"}, {&lses, "lses"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data()));
    p.lse_batch_stride = l.stride(0), p.lse_head_stride = l.stride(1);
  }
  p.num_parts = parts, p.batch = batch, p.seqlen = seqlen, p.heads = heads, p.head_dim = head_dim;
  set_device(outs, &p.device_type, &p.device_id);
  return p;
}

KVCacheAppendParams make_append_params(const InputTensor& k_cache, const InputTensor& v_cache,
                                       const InputTensor& k_new, const InputTensor& v_new,
                                       const InputTensor& cache_seqlens, const std::optional<InputTensor>& seqused_out,
                                       const std::optional<InputTensor>& block_table) {
  const bool paged = block_table.has_value();
  const char* cache_layout = paged ? "(num_pages, page_size, heads_kv, head_dim) with block_table"
                                   : "(batch, max_len, heads_kv, head_dim)";
  check_ndim(k_cache, "k_cache", 4, cache_layout);
  check_ndim(v_cache, "v_cache", 4, cache_layout);
  check_ndim(k_new, "k_new", 4, "(batch, seqlen_new, heads_kv, head_dim)");
  check_ndim(v_new, "v_new", 4, "(batch, seqlen_new, heads_kv, head_dim)");
  check_float_dtype(k_cache, "k_cache");
  check_same_dtype(v_cache, "v_cache", k_cache, "k_cache");
  check_same_dtype(k_new, "k_new", k_cache, "k_cache");
  check_same_dtype(v_new, "v_new", k_cache, "k_cache");
  check_device_supported(k_cache, "k_cache");
  check_same_device(v_cache, "v_cache", k_cache);
  check_same_device(k_new, "k_new", k_cache);
  check_same_device(v_new, "v_new", k_cache);
  for (size_t d = 0; d < 4; ++d) {
    if (v_cache.shape(d) != k_cache.shape(d))
      value_error("v_cache has shape " + shape_str(v_cache) + " but k_cache has " + shape_str(k_cache) + "; they must match");
    if (v_new.shape(d) != k_new.shape(d))
      value_error("v_new has shape " + shape_str(v_new) + " but k_new has " + shape_str(k_new) + "; they must match");
  }
  const int64_t batch = k_new.shape(0);
  check_dim(k_new, "k_new", 2, "heads_kv", k_cache.shape(2), "k_cache's heads_kv");
  check_dim(k_new, "k_new", 3, "head_dim", k_cache.shape(3), "k_cache's head_dim");
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&k_new, "k_new"}, {&v_new, "v_new"}})
    check_unit_last_stride(*t, name);
  check_no_internal_overlap(k_cache, "k_cache");
  check_no_internal_overlap(v_cache, "v_cache");
  check_no_overlap(k_cache, "k_cache", v_cache, "v_cache");
  for (auto [t, name] : {std::pair{&k_new, "k_new"}, {&v_new, "v_new"}}) {
    check_no_overlap(k_cache, "k_cache", *t, name);
    check_no_overlap(v_cache, "v_cache", *t, name);
  }

  KVCacheAppendParams p;
  p.k_cache = const_cast<void*>(k_cache.data());
  p.v_cache = const_cast<void*>(v_cache.data());
  p.kc_batch_stride = k_cache.stride(0), p.kc_row_stride = k_cache.stride(1), p.kc_head_stride = k_cache.stride(2);
  p.vc_batch_stride = v_cache.stride(0), p.vc_row_stride = v_cache.stride(1), p.vc_head_stride = v_cache.stride(2);
  p.k_new = k_new.data();
  p.v_new = v_new.data();
  p.kn_batch_stride = k_new.stride(0), p.kn_row_stride = k_new.stride(1), p.kn_head_stride = k_new.stride(2);
  p.vn_batch_stride = v_new.stride(0), p.vn_row_stride = v_new.stride(1), p.vn_head_stride = v_new.stride(2);
  p.cache_seqlens = index_array(cache_seqlens, "cache_seqlens", {batch}, "(batch,)", k_cache, "k_cache");
  if (seqused_out) {
    p.seqused_out = const_cast<int32_t*>(index_array(*seqused_out, "seqused_out", {batch}, "(batch,)", k_cache, "k_cache"));
    check_no_overlap(*seqused_out, "seqused_out", cache_seqlens, "cache_seqlens");
  }
  if (paged) {
    p.block_table = index_array(*block_table, "block_table", {batch, -1}, "(batch, max_pages)", k_cache, "k_cache");
    p.block_table_batch_stride = block_table->stride(0);
    p.page_size = k_cache.shape(1);
    p.num_pages = k_cache.shape(0);
    p.capacity = static_cast<int64_t>(block_table->shape(1)) * p.page_size;
  } else {
    check_dim(k_cache, "k_cache", 0, "batch", batch, "k_new's batch");
    p.capacity = k_cache.shape(1);
  }
  p.batch = batch, p.seqlen_new = k_new.shape(1), p.heads_kv = k_new.shape(2), p.head_dim = k_new.shape(3);
  p.dtype = *to_dtype(k_cache.dtype());
  set_device(k_cache, &p.device_type, &p.device_id);
  return p;
}

std::optional<InputTensor> as_input(const std::optional<OutputTensor>& t) {
  if (!t) return std::nullopt;
  return InputTensor(*t);
}

}  // namespace

NB_MODULE(_waveboost, m) {
  m.doc() = "waveboost's compiled core: exact attention forward over DLPack tensors";

  m.def(
      "forward",
      [](InputTensor q, InputTensor k, InputTensor v, OutputTensor out, std::optional<OutputTensor> lse,
         bool causal, std::optional<double> softmax_scale, const std::string& backend, uintptr_t stream) {
        const Backend b = parse_backend_or_raise(backend);
        std::optional<InputTensor> lse_view;
        if (lse) lse_view = InputTensor(*lse);
        const InputTensor out_view(out);
        const AttentionParams p = make_params(q, k, v, &out_view, lse_view, causal, softmax_scale);
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::attention_forward(p, b, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"),
      nb::arg("softmax_scale").none(), nb::arg("backend"), nb::arg("stream"),
      "Writes attention(q, k, v) into `out` (and the logsumexp into `lse` when given), "
      "on `stream` (a cudaStream_t as an integer; 0 = legacy default) for CUDA tensors.");

  m.def(
      "resolve_backend",
      [](InputTensor q, InputTensor k, InputTensor v, bool causal, const std::string& backend) {
        const Backend b = parse_backend_or_raise(backend);
        const AttentionParams p = make_params(q, k, v, nullptr, std::nullopt, causal, std::nullopt);
        return resolved_backend_name(p, b);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("backend") = "auto",
      "The backend a call with these tensors would run; raises ValueError with the reason if it cannot run.");

  m.def(
      "stream_synchronize",
      [](int device_id, uintptr_t stream) {
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::stream_synchronize(device_id, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
      },
      nb::arg("device_id"), nb::arg("stream"));
  m.def(
      "backend_available",
      [](const std::string& backend, int device_id) {
        return waveboost::backend_available(parse_backend_or_raise(backend), device_id);
      },
      nb::arg("backend"), nb::arg("device_id"),
      "Whether a CUDA backend can run on that device with this build, for some dtype and head dim.");
  // ---- Backward ----
  m.def(
      "backward",
      [](InputTensor dout, InputTensor q, InputTensor k, InputTensor v, InputTensor out, InputTensor lse,
         OutputTensor dq, OutputTensor dk, OutputTensor dv, std::optional<InputTensor> dlse, bool causal,
         std::optional<double> softmax_scale, bool deterministic, const std::string& backend, uintptr_t stream) {
        const Backend b = parse_backend_or_raise(backend);
        const InputTensor dq_view(dq), dk_view(dk), dv_view(dv);
        const waveboost::AttentionBackwardParams p = make_backward_params(
            dout, q, k, v, out, lse, dq_view, dk_view, dv_view, dlse, causal, softmax_scale, deterministic);
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::attention_backward(p, b, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
      },
      nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), nb::arg("dlse").none(), nb::arg("causal"), nb::arg("softmax_scale").none(),
      nb::arg("deterministic"), nb::arg("backend"), nb::arg("stream"),
      "Writes the gradients of attention(q, k, v) (whose output and float32 logsumexp were `out` "
      "and `lse`) with respect to q, k and v into dq, dk and dv, given dout (and dlse, the "
      "gradient flowing into lse, when given), on `stream` for CUDA tensors.");

  m.def(
      "resolve_backward_backend",
      [](InputTensor q, InputTensor k, InputTensor v, bool causal, const std::string& backend) {
        const Backend b = parse_backend_or_raise(backend);
        // A representative call: can_implement reads shapes, strides, dtype and the device, and
        // only the alignment of the pointers, so the inputs stand in for the other tensors.
        waveboost::AttentionBackwardParams p;
        static_cast<AttentionParams&>(p) = make_params(q, k, v, nullptr, std::nullopt, causal, std::nullopt);
        p.dout = p.q, p.dq = const_cast<void*>(p.q);
        p.dk = const_cast<void*>(p.k), p.dv = const_cast<void*>(p.v);
        p.lse = static_cast<float*>(const_cast<void*>(p.q));
        p.lse_head_stride = p.seqlen_q, p.lse_batch_stride = p.heads * p.seqlen_q;
        p.do_batch_stride = p.dq_batch_stride = p.q_batch_stride;
        p.do_row_stride = p.dq_row_stride = p.q_row_stride;
        p.do_head_stride = p.dq_head_stride = p.q_head_stride;
        p.dk_batch_stride = p.k_batch_stride, p.dk_row_stride = p.k_row_stride, p.dk_head_stride = p.k_head_stride;
        p.dv_batch_stride = p.v_batch_stride, p.dv_row_stride = p.v_row_stride, p.dv_head_stride = p.v_head_stride;
        return resolved_backend_name(p, b);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("backend") = "auto",
      "The backend a backward call with these tensors would run; raises ValueError with the reason if it cannot run.");

  m.def(
      "backend_has_backward",
      [](const std::string& backend) { return waveboost::backend_has_backward(parse_backend_or_raise(backend)); },
      nb::arg("backend"), "Whether `backend` has a backward pass (on some device, dtype and head dim).");

  m.def("version", &waveboost::version);
  m.def("cuda_compiled", &waveboost::cuda_compiled);
  m.def("cuda_architectures", &waveboost::cuda_architectures);
  m.def("cuda_device_count", &waveboost::cuda_device_count);
  m.def("cpu_isa", &waveboost::cpu_isa);
  m.def("cpu_num_threads", &waveboost::cpu_num_threads);
  m.def("cuda_device_description", &waveboost::cuda_device_description, nb::arg("device"));

  m.def(
      "forward_sequences",
      [](InputTensor q, InputTensor k, InputTensor v, OutputTensor out, std::optional<OutputTensor> lse,
         std::optional<InputTensor> cu_seqlens_q, std::optional<InputTensor> cu_seqlens_k,
         std::optional<InputTensor> seqused_k, std::optional<InputTensor> block_table,
         std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k, bool causal,
         std::optional<double> softmax_scale, const std::string& backend, uintptr_t stream, bool check_only) {
        const Backend b = parse_backend_or_raise(backend);
        const InputTensor out_view(out);
        const AttentionParams p =
            make_sequence_params(q, k, v, out_view, as_input(lse), cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                 max_seqlen_q, max_seqlen_k, causal, softmax_scale);
        const Backend chosen = b == Backend::kAuto ? waveboost::select_backend(waveboost::with_resolved_scale(p)) : b;
        raise_status(waveboost::can_implement(p, chosen));
        if (check_only) return std::string(waveboost::backend_name(chosen));
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::attention_forward(p, chosen, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
        return std::string(waveboost::backend_name(chosen));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), nb::arg("cu_seqlens_q").none(),
      nb::arg("cu_seqlens_k").none(), nb::arg("seqused_k").none(), nb::arg("block_table").none(),
      nb::arg("max_seqlen_q").none(), nb::arg("max_seqlen_k").none(), nb::arg("causal"),
      nb::arg("softmax_scale").none(), nb::arg("backend"), nb::arg("stream"), nb::arg("check_only") = false,
      "Attention over a batch with a sequence layout (varlen q/k by cu_seqlens, paged k/v by block_table, "
      "seqused_k); returns the backend's name. With check_only, only checks and resolves the backend.");

  m.def(
      "merge_attention_states",
      [](InputTensor outs, InputTensor lses, OutputTensor out, std::optional<OutputTensor> lse, uintptr_t stream) {
        const MergeStatesParams p = make_merge_params(outs, lses, InputTensor(out), as_input(lse));
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::merge_attention_states(p, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
      },
      nb::arg("outs"), nb::arg("lses"), nb::arg("out"), nb::arg("lse").none(), nb::arg("stream"),
      "Merges partial attention results over disjoint key sets: (num_parts, batch, seqlen, heads, head_dim) "
      "outputs and float32 (num_parts, batch, heads, seqlen) logsumexps into `out` (and `lse`).");

  m.def(
      "kv_cache_append",
      [](OutputTensor k_cache, OutputTensor v_cache, InputTensor k_new, InputTensor v_new, InputTensor cache_seqlens,
         std::optional<OutputTensor> seqused_out, std::optional<InputTensor> block_table, uintptr_t stream) {
        const KVCacheAppendParams p = make_append_params(InputTensor(k_cache), InputTensor(v_cache), k_new, v_new,
                                                         cache_seqlens, as_input(seqused_out), block_table);
        Status s;
        {
          nb::gil_scoped_release release;
          s = waveboost::kv_cache_append(p, reinterpret_cast<void*>(stream));
        }
        raise_status(s);
      },
      nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("k_new"), nb::arg("v_new"), nb::arg("cache_seqlens"),
      nb::arg("seqused_out").none(), nb::arg("block_table").none(), nb::arg("stream"),
      "Writes k_new/v_new into the cache at positions cache_seqlens[b] + i (contiguous or paged by block_table); "
      "seqused_out, when given, receives cache_seqlens + seqlen_new.");
}
