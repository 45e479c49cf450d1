// The front ends' params builder: every argument check of the Python binding and the XLA FFI
// handlers, and the filling of the C++ API's params from TensorArg descriptions.
#include "frontend/params_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

namespace waveboost::frontend {

int64_t TensorArg::size() const {
  int64_t n = 1;
  for (int i = 0; i < std::min(ndim, kMaxRank); ++i) n *= shape[i];
  return n;
}

int64_t TensorArg::itemsize() const { return (static_cast<int64_t>(dtype.bits) * dtype.lanes + 7) / 8; }

namespace {

// Messages are built with std::to_string and concatenation, not iostreams: a module linked
// against a static libstdc++ next to another (e.g. PyTorch's) can crash formatting numbers
// through an uninitialized locale.
std::string str(int64_t x) { return std::to_string(x); }

std::string join_ints(const TensorArg& t, bool strides) {
  const int kept = std::min(t.ndim, TensorArg::kMaxRank);
  std::string s = "(";
  for (int i = 0; i < kept; ++i) s += (i ? ", " : "") + str(strides ? t.strides[i] : t.shape[i]);
  if (kept < t.ndim) s += ", ...";
  return s + (t.ndim == 1 ? ",)" : ")");
}

std::string shape_str(const TensorArg& t) { return join_ints(t, false); }

std::string dtype_str(ElementType dt) {
  const char* kind = "unknown";
  switch (dt.kind) {
    case ElementKind::kInt: kind = "int"; break;
    case ElementKind::kUInt: kind = "uint"; break;
    case ElementKind::kFloat: kind = "float"; break;
    case ElementKind::kBFloat: kind = "bfloat"; break;
    case ElementKind::kComplex: kind = "complex"; break;
    case ElementKind::kBool: return "bool";
    case ElementKind::kFloat8E4M3FN: return dt.bits == 8 && dt.lanes == 1 ? "float8_e4m3fn" : "float8_e4m3fn?";
    default: break;
  }
  std::string s = std::string(kind) + str(dt.bits);
  if (dt.lanes != 1) s += "x" + str(dt.lanes);
  return s;
}

std::string device_str(int32_t device_type, int32_t device_id) {
  switch (static_cast<DeviceKind>(device_type)) {
    case DeviceKind::kCPU: return "cpu";
    case DeviceKind::kCUDA: return "cuda:" + str(device_id);
    case DeviceKind::kCUDAHost: return "cuda_host (pinned host memory)";
    case DeviceKind::kCUDAManaged: return "cuda_managed:" + str(device_id);
  }
  return "DLPack device type " + str(device_type);
}

std::optional<DType> to_dtype(ElementType dt) {
  if (dt.lanes != 1) return std::nullopt;
  if (dt.kind == ElementKind::kFloat) {
    if (dt.bits == 16) return DType::kFloat16;
    if (dt.bits == 32) return DType::kFloat32;
    if (dt.bits == 64) return DType::kFloat64;
  }
  if (dt.kind == ElementKind::kBFloat && dt.bits == 16) return DType::kBFloat16;
  if (dt.kind == ElementKind::kFloat8E4M3FN && dt.bits == 8) return DType::kFloat8E4M3;
  return std::nullopt;
}

constexpr ElementType kFloat32{ElementKind::kFloat, 32, 1};
constexpr ElementType kInt32{ElementKind::kInt, 32, 1};

[[noreturn]] void value_error(const std::string& msg) { throw ArgumentError(ArgumentError::Kind::kValue, msg); }
[[noreturn]] void type_error(const std::string& msg) { throw ArgumentError(ArgumentError::Kind::kType, msg); }

void check_ndim(const TensorArg& t, const char* name, int ndim, const char* layout) {
  if (t.ndim != ndim)
    value_error(std::string(name) + " must be a " + str(ndim) + "-D tensor " + layout + "; got " + str(t.ndim) +
                "-D with shape " + shape_str(t));
}

void check_dim(const TensorArg& t, const char* name, int dim, const char* dim_name, int64_t expected,
               const std::string& expected_from) {
  if (t.shape[dim] != expected)
    value_error(std::string(name) + " has " + dim_name + " " + str(t.shape[dim]) + " (shape " + shape_str(t) +
                ") but " + expected_from + " is " + str(expected));
}

// The head_dim (last) dimension must be contiguous so kernels can use vector loads.
void check_unit_last_stride(const TensorArg& t, const char* name) {
  const int last = t.ndim - 1;
  if (t.size() > 0 && t.shape[last] > 1 && t.strides[last] != 1)
    value_error(std::string(name) + " must have unit stride in its last (head_dim) dimension; got stride " +
                str(t.strides[last]) + " (pass a view whose last dimension is contiguous, or a copy)");
}

void check_same_device(const TensorArg& t, const char* name, const TensorArg& ref, const char* ref_name = "q") {
  if (t.device_type != ref.device_type || t.device_id != ref.device_id)
    value_error(std::string(name) + " is on " + device_str(t.device_type, t.device_id) + " but " + ref_name +
                " is on " + device_str(ref.device_type, ref.device_id) + "; all tensors must be on one device");
}

void check_device_supported(const TensorArg& t, const char* name) {
  const auto kind = static_cast<DeviceKind>(t.device_type);
  if (kind != DeviceKind::kCPU && kind != DeviceKind::kCUDA)
    value_error(std::string(name) + " is on " + device_str(t.device_type, t.device_id) +
                "; waveboost runs on CPU memory and CUDA device memory");
}

void set_device(const TensorArg& t, DeviceType* type, int* id) {
  const bool cuda = static_cast<DeviceKind>(t.device_type) == DeviceKind::kCUDA;
  *type = cuda ? DeviceType::kCUDA : DeviceType::kCPU;
  *id = cuda ? t.device_id : 0;
}

DType check_float_dtype(const TensorArg& t, const char* name) {
  const std::optional<DType> dtype = to_dtype(t.dtype);
  if (!dtype)
    type_error(std::string(name) +
               " must have a floating-point dtype (float16, bfloat16, float32, float64, or float8_e4m3fn for the "
               "wgmma forward); got " + dtype_str(t.dtype));
  return *dtype;
}

void check_same_dtype(const TensorArg& t, const char* name, const TensorArg& ref, const char* ref_name,
                      const char* rule = "they must share one dtype") {
  if (t.dtype != ref.dtype)
    type_error(std::string(name) + " has dtype " + dtype_str(t.dtype) + " but " + ref_name + " has " +
               dtype_str(ref.dtype) + "; " + rule);
}

void check_float32(const TensorArg& t, const char* name) {
  if (t.dtype != kFloat32) type_error(std::string(name) + " must have dtype float32; got " + dtype_str(t.dtype));
}

void check_same_shape(const TensorArg& t, const char* name, const TensorArg& ref, const char* ref_name,
                      const char* has = "has ") {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] != ref.shape[d])
      value_error(std::string(name) + " has shape " + shape_str(t) + " but " + ref_name + " " + has + shape_str(ref) +
                  "; they must match");
}

// Byte range [first, last] a strided tensor can touch, for the aliasing check.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorArg& t) {
  uintptr_t lo = reinterpret_cast<uintptr_t>(t.data);
  uintptr_t hi = lo;
  for (int i = 0; i < std::min(t.ndim, TensorArg::kMaxRank); ++i) {
    if (t.shape[i] == 0) return {lo, lo};
    const int64_t reach = (t.shape[i] - 1) * t.strides[i] * t.itemsize();
    if (reach >= 0) hi += reach; else lo += reach;
  }
  return {lo, hi + t.itemsize() - 1};
}

bool overlaps(const TensorArg& a, const TensorArg& b) {
  if (a.size() == 0 || b.size() == 0) return false;
  auto [a0, a1] = byte_span(a);
  auto [b0, b1] = byte_span(b);
  return a0 <= b1 && b0 <= a1;
}

void check_no_overlap(const TensorArg& out, const char* out_name, const TensorArg& t, const char* name) {
  if (overlaps(out, t))
    value_error(std::string(out_name) + " overlaps the memory of " + name + "; outputs must not alias inputs");
}

// Kernels write every element of an output once, from one thread. An output whose elements share
// memory (a zero stride, e.g. an expand()ed or broadcast view, or strides that make rows or heads
// overlap) would have several threads race on one address. Sufficient test: sorted by stride, each
// dimension must step past everything the smaller-stride dimensions span. (It refuses only exotic
// interleavings that happen not to overlap; ordinary layouts pass.)
void check_no_internal_overlap(const TensorArg& t, const char* name) {
  if (t.size() == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent) of dimensions of extent > 1
  for (int i = 0; i < std::min(t.ndim, TensorArg::kMaxRank); ++i)
    if (t.shape[i] > 1) dims.emplace_back(std::abs(t.strides[i]), t.shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // elements spanned by the dimensions so far, minus one
  for (auto [stride, extent] : dims) {
    if (stride <= span)
      value_error(std::string(name) + " has overlapping elements (shape " + shape_str(t) + ", strides " +
                  join_ints(t, true) + "); outputs must not overlap themselves (e.g. no expand()ed or broadcast views)");
    span += stride * (extent - 1);
  }
}

// head_dim >= 1 and heads a multiple of heads_kv, named by q's and k's shapes.
void check_heads(const TensorArg& q, const TensorArg& k, int64_t heads, int64_t heads_kv, int64_t head_dim) {
  if (head_dim < 1) value_error("q has head_dim 0 (shape " + shape_str(q) + "); head_dim must be >= 1");
  if (heads_kv == 0 && heads > 0) value_error("k has 0 heads (shape " + shape_str(k) + ") but q has " + str(heads));
  if (heads_kv > 0 && heads % heads_kv != 0)
    value_error("q's heads (" + str(heads) + ") must be a multiple of k's heads_kv (" + str(heads_kv) +
                ") for grouped-query attention");
}

double checked_scale(std::optional<double> softmax_scale, double fallback) {
  if (softmax_scale && !std::isfinite(*softmax_scale))
    value_error(std::string("softmax_scale must be a finite number; got ") +
                (std::isnan(*softmax_scale) ? "nan" : (*softmax_scale > 0 ? "inf" : "-inf")));
  return softmax_scale ? *softmax_scale : fallback;
}

// An int32 index array (cu_seqlens, seqused, cache_seqlens, block_table) of the given shape (-1:
// any extent) on `ref`'s device. 1-D arrays must be contiguous (the C++ params carry no stride for
// them); a 2-D block_table needs a unit last stride.
const int32_t* index_array(const TensorArg& t, const char* name, std::initializer_list<int64_t> shape,
                           const char* layout, const TensorArg& ref, const char* ref_name) {
  check_ndim(t, name, static_cast<int>(shape.size()), layout);
  if (t.dtype != kInt32) type_error(std::string(name) + " must have dtype int32; got " + dtype_str(t.dtype));
  check_same_device(t, name, ref, ref_name);
  int d = 0;
  for (int64_t extent : shape) {
    if (extent >= 0 && t.shape[d] != extent) {
      std::string expected = "(";
      int i = 0;
      for (int64_t e : shape) expected += (i++ ? ", " : "") + (e >= 0 ? str(e) : std::string("*"));
      expected += shape.size() == 1 ? ",)" : ")";
      value_error(std::string(name) + " must have shape " + layout + " = " + expected + "; got " + shape_str(t));
    }
    ++d;
  }
  const int last = t.ndim - 1;
  if (t.shape[last] > 1 && t.strides[last] != 1)
    value_error(std::string(name) + " must be contiguous in its last dimension; got stride " + str(t.strides[last]));
  return static_cast<const int32_t*>(t.data);
}

// A packed layout: its cu_seqlens (batch + 1,) into *cu_seqlens, and its max_seqlen bound
// (required, >= 0) returned.
int64_t packed_bound(const TensorArg& cu, const char* cu_name, int64_t batch, std::optional<int64_t> max_seqlen,
                     const char* max_name, const TensorArg& q, const int32_t** cu_seqlens) {
  *cu_seqlens = index_array(cu, cu_name, {batch + 1}, "(batch + 1,)", q, "q");
  if (!max_seqlen) value_error(std::string(max_name) + " is required with " + cu_name);
  if (*max_seqlen < 0) value_error(std::string(max_name) + " must be >= 0; got " + str(*max_seqlen));
  return *max_seqlen;
}

// A paged cache (num_pages, page_size, heads_kv, head_dim) and its block_table (batch, max_pages).
struct Pages {
  const int32_t* table;
  int64_t table_stride, page_size, num_pages, capacity;  // capacity: keys one sequence can hold
};

Pages paged_layout(const TensorArg& block_table, const TensorArg& cache, int64_t batch, const TensorArg& ref,
                   const char* ref_name) {
  const int32_t* table = index_array(block_table, "block_table", {batch, -1}, "(batch, max_pages)", ref, ref_name);
  return {table, block_table.strides[0], cache.shape[1], cache.shape[0], block_table.shape[1] * cache.shape[1]};
}

// `t` must look like `ref` (a 4-D BSHD tensor): same dtype, device and shape, unit last stride.
void check_like(const TensorArg& t, const char* name, const TensorArg& ref, const char* ref_name, const char* layout) {
  check_ndim(t, name, 4, layout);
  check_same_dtype(t, name, ref, ref_name, "they must match");
  check_same_device(t, name, ref, ref_name);
  check_same_shape(t, name, ref, ref_name, "has shape ");
  check_unit_last_stride(t, name);
}

// Params holding the four tensors' pointers, after checking their unit last strides and (when
// `check_out`) that out overlaps neither itself nor an input.
AttentionParams checked_pointers(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg& out,
                                 bool check_out) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_unit_last_stride(*t, name);
  if (check_out) {
    check_no_internal_overlap(out, "out");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check_no_overlap(out, "out", *t, name);
  }
  AttentionParams p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = const_cast<void*>(out.data);
  return p;
}

}  // namespace

Backend backend_from_name(const std::string& name) {
  Backend b;
  if (!parse_backend(name, &b)) {
    std::string names;
    for (Backend known : kAllBackends) names += std::string(names.empty() ? "'" : ", '") + backend_name(known) + "'";
    value_error("backend must be one of " + names + "; got '" + name + "'");
  }
  return b;
}

AttentionParams forward_params(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg* out_arg,
                               const TensorArg* lse, bool causal, std::optional<double> softmax_scale,
                               const Descales& descales) {
  check_ndim(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
  check_ndim(k, "k", 4, "(batch, seqlen_k, heads_kv, head_dim)");
  check_ndim(v, "v", 4, "(batch, seqlen_k, heads_kv, head_dim)");
  // Without an output (a backend query) q stands in for it: every out check then holds trivially.
  const TensorArg& out = out_arg ? *out_arg : q;
  check_ndim(out, "out", 4, "(batch, seqlen_q, heads, head_dim)");

  const DType dtype = check_float_dtype(q, "q");
  const bool fp8 = dtype == DType::kFloat8E4M3;
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}})
    check_same_dtype(*t, name, q, "q", "q, k, v and out must share one dtype (out: bfloat16 or float16 with "
                                       "float8_e4m3fn inputs)");
  DType out_dtype = fp8 ? DType::kBFloat16 : dtype;
  if (!fp8) {
    check_same_dtype(out, "out", q, "q", "q, k, v and out must share one dtype");
  } else if (out_arg != nullptr) {
    const std::optional<DType> given = to_dtype(out.dtype);
    if (given != DType::kBFloat16 && given != DType::kFloat16)
      type_error("out must be bfloat16 or float16 for float8_e4m3fn q, k, v; got " + dtype_str(out.dtype));
    out_dtype = *given;
  }
  if (descales.any() && !fp8)
    value_error("q_descale, k_descale and v_descale apply to float8_e4m3fn inputs; q has dtype " + dtype_str(q.dtype));
  check_device_supported(q, "q");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_same_device(out, "out", q);

  const int64_t batch = q.shape[0], seqlen_q = q.shape[1], heads = q.shape[2], head_dim = q.shape[3];
  const int64_t seqlen_k = k.shape[1], heads_kv = k.shape[2];
  check_dim(k, "k", 0, "batch", batch, "q's batch");
  check_dim(k, "k", 3, "head_dim", head_dim, "q's head_dim");
  static const char* const kv_dims[] = {"batch", "seqlen_k", "heads_kv", "head_dim"};
  for (int d = 0; d < 4; ++d) check_dim(v, "v", d, kv_dims[d], k.shape[d], std::string("k's ") + kv_dims[d]);
  check_heads(q, k, heads, heads_kv, head_dim);
  static const char* const q_dims[] = {"batch", "seqlen_q", "heads", "head_dim"};
  for (int d = 0; d < 4; ++d) check_dim(out, "out", d, q_dims[d], q.shape[d], std::string("q's ") + q_dims[d]);
  AttentionParams p = checked_pointers(q, k, v, out, out_arg != nullptr);
  p.q_batch_stride = q.strides[0], p.q_row_stride = q.strides[1], p.q_head_stride = q.strides[2];
  p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
  p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
  p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  if (!out_arg)  // no output: describe the contiguous one a call would allocate, not q's (maybe broadcast) strides
    p.o_head_stride = head_dim, p.o_row_stride = heads * head_dim, p.o_batch_stride = seqlen_q * p.o_row_stride;

  if (lse) {
    const TensorArg& l = *lse;
    check_ndim(l, "lse", 3, "(batch, heads, seqlen_q)");
    check_float32(l, "lse");
    check_same_device(l, "lse", q);
    check_dim(l, "lse", 0, "batch", batch, "q's batch");
    check_dim(l, "lse", 1, "heads", heads, "q's heads");
    check_dim(l, "lse", 2, "seqlen_q", seqlen_q, "q's seqlen_q");
    check_unit_last_stride(l, "lse");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data));
    p.lse_batch_stride = l.strides[0], p.lse_head_stride = l.strides[1];
  }

  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  p.softmax_scale = checked_scale(softmax_scale, 1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.is_causal = causal;
  p.dtype = dtype;
  p.out_dtype = out_dtype;
  for (auto [t, name, data, batch_stride, head_stride] :
       {std::tuple{descales.q, "q_descale", &p.q_descale, &p.q_descale_batch_stride, &p.q_descale_head_stride},
        {descales.k, "k_descale", &p.k_descale, &p.k_descale_batch_stride, &p.k_descale_head_stride},
        {descales.v, "v_descale", &p.v_descale, &p.v_descale_batch_stride, &p.v_descale_head_stride}}) {
    if (t == nullptr) continue;
    check_ndim(*t, name, 2, "(batch, heads_kv)");
    check_float32(*t, name);
    check_same_device(*t, name, q);
    check_dim(*t, name, 0, "batch", batch, "q's batch");
    check_dim(*t, name, 1, "heads_kv", heads_kv, "k's heads_kv");
    *data = static_cast<const float*>(t->data);
    *batch_stride = t->strides[0], *head_stride = t->strides[1];
  }
  set_device(q, &p.device_type, &p.device_id);
  return p;
}

AttentionBackwardParams backward_params(const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                                        const TensorArg& v, const TensorArg& out, const TensorArg& lse,
                                        const TensorArg& dq, const TensorArg& dk, const TensorArg& dv,
                                        const TensorArg* dlse, bool causal, std::optional<double> softmax_scale,
                                        bool deterministic) {
  AttentionBackwardParams p;
  static_cast<AttentionParams&>(p) = forward_params(q, k, v, &out, &lse, causal, softmax_scale);
  check_like(dout, "dout", q, "q", "(batch, seqlen_q, heads, head_dim)");
  check_like(dq, "dq", q, "q", "(batch, seqlen_q, heads, head_dim)");
  check_like(dk, "dk", k, "k", "(batch, seqlen_k, heads_kv, head_dim)");
  check_like(dv, "dv", v, "v", "(batch, seqlen_k, heads_kv, head_dim)");
  if (dlse) {
    const TensorArg& l = *dlse;
    check_ndim(l, "dlse", 3, "(batch, heads, seqlen_q)");
    check_float32(l, "dlse");
    check_same_device(l, "dlse", q);
    check_same_shape(l, "dlse", lse, "lse", "has shape ");
    check_unit_last_stride(l, "dlse");
  }
  const std::pair<const TensorArg*, const char*> grads[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  for (size_t i = 0; i < 3; ++i) {
    auto [g, gname] = grads[i];
    check_no_internal_overlap(*g, gname);
    for (auto [t, name] : {std::pair{&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}})
      check_no_overlap(*g, gname, *t, name);
    if (dlse) check_no_overlap(*g, gname, *dlse, "dlse");
    for (size_t j = 0; j < i; ++j)
      if (overlaps(*g, *grads[j].first))
        value_error(std::string(gname) + " overlaps the memory of " + grads[j].second +
                    "; dq, dk and dv must be separate buffers");
  }
  p.dout = dout.data;
  p.dq = const_cast<void*>(dq.data);
  p.dk = const_cast<void*>(dk.data);
  p.dv = const_cast<void*>(dv.data);
  p.do_batch_stride = dout.strides[0], p.do_row_stride = dout.strides[1], p.do_head_stride = dout.strides[2];
  p.dq_batch_stride = dq.strides[0], p.dq_row_stride = dq.strides[1], p.dq_head_stride = dq.strides[2];
  p.dk_batch_stride = dk.strides[0], p.dk_row_stride = dk.strides[1], p.dk_head_stride = dk.strides[2];
  p.dv_batch_stride = dv.strides[0], p.dv_row_stride = dv.strides[1], p.dv_head_stride = dv.strides[2];
  if (dlse) {
    p.dlse = static_cast<const float*>(dlse->data);
    p.dlse_batch_stride = dlse->strides[0], p.dlse_head_stride = dlse->strides[1];
  }
  p.deterministic = deterministic;
  return p;
}

AttentionParams sequence_params(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg& out,
                                const TensorArg* lse, const TensorArg* cu_seqlens_q, const TensorArg* cu_seqlens_k,
                                const TensorArg* seqused_k, const TensorArg* block_table,
                                std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k, bool causal,
                                std::optional<double> softmax_scale) {
  const bool varlen_q = cu_seqlens_q != nullptr;
  const bool varlen_k = cu_seqlens_k != nullptr;
  const bool paged = block_table != nullptr;
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
  const int k_ndim = varlen_k ? 3 : 4;
  check_ndim(k, "k", k_ndim, k_layout);
  check_ndim(v, "v", k_ndim, k_layout);

  const DType dtype = check_float_dtype(q, "q");
  check_same_dtype(k, "k", q, "q");
  check_same_dtype(v, "v", q, "q");
  check_same_dtype(out, "out", q, "q");
  check_device_supported(q, "q");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_same_device(out, "out", q);

  const int qd = varlen_q ? 1 : 2;  // q's heads dimension
  const int kd = varlen_k ? 1 : 2;  // k's heads_kv dimension
  const int64_t heads = q.shape[qd], head_dim = q.shape[qd + 1], heads_kv = k.shape[kd];
  if (varlen_q && (cu_seqlens_q->ndim != 1 || cu_seqlens_q->shape[0] < 1))
    value_error("cu_seqlens_q must be a 1-D array (batch + 1,) with at least one entry; got shape " +
                shape_str(*cu_seqlens_q));
  const int64_t batch = varlen_q ? cu_seqlens_q->shape[0] - 1 : q.shape[0];
  check_same_shape(v, "v", k, "k");
  check_dim(k, "k", kd + 1, "head_dim", head_dim, "q's head_dim");
  check_same_shape(out, "out", q, "q");
  check_heads(q, k, heads, heads_kv, head_dim);
  AttentionParams p = checked_pointers(q, k, v, out, true);
  if (varlen_q) {
    p.seqlen_q = packed_bound(*cu_seqlens_q, "cu_seqlens_q", batch, max_seqlen_q, "max_seqlen_q", q, &p.cu_seqlens_q);
    p.q_row_stride = q.strides[0], p.q_head_stride = q.strides[1];
    p.o_row_stride = out.strides[0], p.o_head_stride = out.strides[1];
  } else {
    p.seqlen_q = q.shape[1];
    p.q_batch_stride = q.strides[0], p.q_row_stride = q.strides[1], p.q_head_stride = q.strides[2];
    p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  }
  if (paged) {
    const Pages pages = paged_layout(*block_table, k, batch, q, "q");
    p.block_table = pages.table, p.block_table_batch_stride = pages.table_stride;
    p.page_size = pages.page_size, p.num_pages = pages.num_pages, p.seqlen_k = pages.capacity;
    p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
    p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
  } else if (varlen_k) {
    p.seqlen_k = packed_bound(*cu_seqlens_k, "cu_seqlens_k", batch, max_seqlen_k, "max_seqlen_k", q, &p.cu_seqlens_k);
    p.total_k = k.shape[0];
    p.k_row_stride = k.strides[0], p.k_head_stride = k.strides[1];
    p.v_row_stride = v.strides[0], p.v_head_stride = v.strides[1];
  } else {
    check_dim(k, "k", 0, "batch", batch, varlen_q ? "the batch of cu_seqlens_q" : "q's batch");
    p.seqlen_k = k.shape[1];
    p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
    p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
  }
  if (seqused_k) p.seqused_k = index_array(*seqused_k, "seqused_k", {batch}, "(batch,)", q, "q");
  // Host memory costs nothing to read: the packed extents are checked here (the CPU backend checks
  // the rest of the indices it follows). On a device they are checked only by validate=True.
  if (static_cast<DeviceKind>(q.device_type) == DeviceKind::kCPU) {
    for (auto [cu, name, t] : {std::tuple{p.cu_seqlens_q, "cu_seqlens_q", &q}, {p.cu_seqlens_k, "cu_seqlens_k", &k}}) {
      if (cu == nullptr) continue;
      if (cu[0] < 0 || cu[batch] > t->shape[0])
        value_error(std::string(name) + " must lie in [0, " + str(t->shape[0]) + "] (the packed rows); got " + name +
                    "[0] = " + str(cu[0]) + ", " + name + "[-1] = " + str(cu[batch]));
    }
  }

  if (lse) {
    const TensorArg& l = *lse;
    check_float32(l, "lse");
    check_same_device(l, "lse", q);
    if (varlen_q) {
      check_ndim(l, "lse", 2, "(heads, total_q)");
      check_dim(l, "lse", 0, "heads", heads, "q's heads");
      check_dim(l, "lse", 1, "total_q", q.shape[0], "q's total_q");
      p.lse_head_stride = l.strides[0];
    } else {
      check_ndim(l, "lse", 3, "(batch, heads, seqlen_q)");
      check_dim(l, "lse", 0, "batch", batch, "q's batch");
      check_dim(l, "lse", 1, "heads", heads, "q's heads");
      check_dim(l, "lse", 2, "seqlen_q", p.seqlen_q, "q's seqlen_q");
      p.lse_batch_stride = l.strides[0], p.lse_head_stride = l.strides[1];
    }
    check_unit_last_stride(l, "lse");
    check_no_internal_overlap(l, "lse");
    for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data));
  }

  p.batch = batch, p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  p.softmax_scale = checked_scale(softmax_scale, kDefaultSoftmaxScale);
  p.is_causal = causal;
  p.dtype = dtype;
  set_device(q, &p.device_type, &p.device_id);
  return p;
}

MergeStatesParams merge_params(const TensorArg& outs, const TensorArg& lses, const TensorArg& out,
                               const TensorArg* lse) {
  check_ndim(outs, "outs", 5, "(num_parts, batch, seqlen, heads, head_dim)");
  check_ndim(lses, "lses", 4, "(num_parts, batch, heads, seqlen)");
  check_ndim(out, "out", 4, "(batch, seqlen, heads, head_dim)");
  const DType outs_dtype = check_float_dtype(outs, "outs");
  const DType out_dtype = check_float_dtype(out, "out");
  for (auto [d, name] : {std::pair{outs_dtype, "outs"}, {out_dtype, "out"}}) {
    if (d == DType::kFloat8E4M3)
      type_error(std::string(name) + " must be float16, bfloat16, float32 or float64 for merge_attention_states; "
                                     "got float8_e4m3fn");
  }
  check_float32(lses, "lses");
  check_device_supported(outs, "outs");
  check_same_device(lses, "lses", outs, "outs");
  check_same_device(out, "out", outs, "outs");
  const int64_t parts = outs.shape[0], batch = outs.shape[1], seqlen = outs.shape[2], heads = outs.shape[3],
                head_dim = outs.shape[4];
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
  p.outs = outs.data;
  p.outs_dtype = outs_dtype;
  p.outs_part_stride = outs.strides[0], p.outs_batch_stride = outs.strides[1], p.outs_row_stride = outs.strides[2],
  p.outs_head_stride = outs.strides[3];
  p.lses = static_cast<const float*>(lses.data);
  p.lses_part_stride = lses.strides[0], p.lses_batch_stride = lses.strides[1], p.lses_head_stride = lses.strides[2],
  p.lses_row_stride = lses.strides[3];
  p.out = const_cast<void*>(out.data);
  p.dtype = out_dtype;
  p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  if (lse) {
    const TensorArg& l = *lse;
    check_ndim(l, "lse", 3, "(batch, heads, seqlen)");
    check_float32(l, "lse");
    check_same_device(l, "lse", outs, "outs");
    check_dim(l, "lse", 0, "batch", batch, "outs' batch");
    check_dim(l, "lse", 1, "heads", heads, "outs' heads");
    check_dim(l, "lse", 2, "seqlen", seqlen, "outs' seqlen");
    check_unit_last_stride(l, "lse");
    check_no_internal_overlap(l, "lse");
    for (auto [t, name] : {std::pair{&outs, "outs"}, {&lses, "lses"}, {&out, "out"}}) check_no_overlap(l, "lse", *t, name);
    p.lse = static_cast<float*>(const_cast<void*>(l.data));
    p.lse_batch_stride = l.strides[0], p.lse_head_stride = l.strides[1];
  }
  p.num_parts = parts, p.batch = batch, p.seqlen = seqlen, p.heads = heads, p.head_dim = head_dim;
  set_device(outs, &p.device_type, &p.device_id);
  return p;
}

KVCacheAppendParams append_params(const TensorArg& k_cache, const TensorArg& v_cache, const TensorArg& k_new,
                                  const TensorArg& v_new, const TensorArg& cache_seqlens,
                                  const TensorArg* seqused_out, const TensorArg* block_table) {
  const bool paged = block_table != nullptr;
  const char* cache_layout = paged ? "(num_pages, page_size, heads_kv, head_dim) with block_table"
                                   : "(batch, max_len, heads_kv, head_dim)";
  check_ndim(k_cache, "k_cache", 4, cache_layout);
  check_ndim(v_cache, "v_cache", 4, cache_layout);
  check_ndim(k_new, "k_new", 4, "(batch, seqlen_new, heads_kv, head_dim)");
  check_ndim(v_new, "v_new", 4, "(batch, seqlen_new, heads_kv, head_dim)");
  const DType dtype = check_float_dtype(k_cache, "k_cache");
  check_same_dtype(v_cache, "v_cache", k_cache, "k_cache");
  check_same_dtype(k_new, "k_new", k_cache, "k_cache");
  check_same_dtype(v_new, "v_new", k_cache, "k_cache");
  check_device_supported(k_cache, "k_cache");
  check_same_device(v_cache, "v_cache", k_cache, "k_cache");
  check_same_device(k_new, "k_new", k_cache, "k_cache");
  check_same_device(v_new, "v_new", k_cache, "k_cache");
  check_same_shape(v_cache, "v_cache", k_cache, "k_cache");
  check_same_shape(v_new, "v_new", k_new, "k_new");
  const int64_t batch = k_new.shape[0];
  check_dim(k_new, "k_new", 2, "heads_kv", k_cache.shape[2], "k_cache's heads_kv");
  check_dim(k_new, "k_new", 3, "head_dim", k_cache.shape[3], "k_cache's head_dim");
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
  p.k_cache = const_cast<void*>(k_cache.data);
  p.v_cache = const_cast<void*>(v_cache.data);
  p.kc_batch_stride = k_cache.strides[0], p.kc_row_stride = k_cache.strides[1], p.kc_head_stride = k_cache.strides[2];
  p.vc_batch_stride = v_cache.strides[0], p.vc_row_stride = v_cache.strides[1], p.vc_head_stride = v_cache.strides[2];
  p.k_new = k_new.data;
  p.v_new = v_new.data;
  p.kn_batch_stride = k_new.strides[0], p.kn_row_stride = k_new.strides[1], p.kn_head_stride = k_new.strides[2];
  p.vn_batch_stride = v_new.strides[0], p.vn_row_stride = v_new.strides[1], p.vn_head_stride = v_new.strides[2];
  p.cache_seqlens = index_array(cache_seqlens, "cache_seqlens", {batch}, "(batch,)", k_cache, "k_cache");
  if (seqused_out) {
    p.seqused_out =
        const_cast<int32_t*>(index_array(*seqused_out, "seqused_out", {batch}, "(batch,)", k_cache, "k_cache"));
    check_no_overlap(*seqused_out, "seqused_out", cache_seqlens, "cache_seqlens");
  }
  if (paged) {
    const Pages pages = paged_layout(*block_table, k_cache, batch, k_cache, "k_cache");
    p.block_table = pages.table, p.block_table_batch_stride = pages.table_stride;
    p.page_size = pages.page_size, p.num_pages = pages.num_pages, p.capacity = pages.capacity;
  } else {
    check_dim(k_cache, "k_cache", 0, "batch", batch, "k_new's batch");
    p.capacity = k_cache.shape[1];
  }
  p.batch = batch, p.seqlen_new = k_new.shape[1], p.heads_kv = k_new.shape[2], p.head_dim = k_new.shape[3];
  p.dtype = dtype;
  set_device(k_cache, &p.device_type, &p.device_id);
  return p;
}

}  // namespace waveboost::frontend
