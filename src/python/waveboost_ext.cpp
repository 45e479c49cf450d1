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
        const Backend chosen = b == Backend::kAuto ? waveboost::select_backend(p) : b;
        raise_status(waveboost::can_implement(p, chosen));
        return std::string(waveboost::backend_name(chosen));
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
  m.def("version", &waveboost::version);
  m.def("cuda_compiled", &waveboost::cuda_compiled);
  m.def("cuda_architectures", &waveboost::cuda_architectures);
  m.def("cuda_device_count", &waveboost::cuda_device_count);
  m.def("cpu_isa", &waveboost::cpu_isa);
  m.def("cpu_num_threads", &waveboost::cpu_num_threads);
  m.def("cuda_device_description", &waveboost::cuda_device_description, nb::arg("device"));
}
