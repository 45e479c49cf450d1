// XLA FFI handlers behind waveboost.jax: they describe XLA's buffers as
// AttentionParams and call the C++ API on XLA's own stream. No kernel logic and
// no synchronization here: XLA allocates the outputs and orders the work.
//
// The handlers are exported C symbols of the _waveboost module; waveboost.jax
// wraps them in capsules (jax.ffi.pycapsule) and registers them under one
// target name for the "cpu" and "CUDA" platforms. Compiled only when jaxlib's
// FFI headers were found at build time (cmake/jax_ffi.cmake).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#ifdef WAVEBOOST_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "waveboost/attention.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using waveboost::AttentionParams;
using waveboost::Backend;
using waveboost::DeviceType;
using waveboost::DType;
using waveboost::Status;
using waveboost::StatusCode;

// nanobind builds the module with hidden visibility; the handlers must stay visible to dlsym (ctypes).
#if defined(_WIN32)
#define WAVEBOOST_FFI_EXPORT extern "C" __declspec(dllexport)
#else
#define WAVEBOOST_FFI_EXPORT extern "C" __attribute__((visibility("default")))
#endif
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_attention_cpu(XLA_FFI_CallFrame* call_frame);
#ifdef WAVEBOOST_WITH_CUDA
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_attention_cuda(XLA_FFI_CallFrame* call_frame);
#endif
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_attention_backward_cpu(XLA_FFI_CallFrame* call_frame);
#ifdef WAVEBOOST_WITH_CUDA
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_attention_backward_cuda(XLA_FFI_CallFrame* call_frame);
#endif
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_kvcache_cpu(XLA_FFI_CallFrame* call_frame);
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_varlen_cpu(XLA_FFI_CallFrame* call_frame);
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_merge_cpu(XLA_FFI_CallFrame* call_frame);
#ifdef WAVEBOOST_WITH_CUDA
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_merge_cuda(XLA_FFI_CallFrame* call_frame);
#endif
#ifdef WAVEBOOST_WITH_CUDA
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_varlen_cuda(XLA_FFI_CallFrame* call_frame);
#endif
#ifdef WAVEBOOST_WITH_CUDA
WAVEBOOST_FFI_EXPORT XLA_FFI_Error* waveboost_jax_kvcache_cuda(XLA_FFI_CallFrame* call_frame);
#endif

namespace {

std::optional<DType> to_dtype(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::BF16: return DType::kBFloat16;
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F64: return DType::kFloat64;
    default: return std::nullopt;
  }
}

std::string dims_str(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// A (..., seqlen, heads, head_dim) buffer with every leading dimension folded
// into batch: vmap (vmap_method="broadcast_all") prepends the mapped axes to
// every operand and result, and XLA's default layout is row-major, so the
// folded batch has one stride.
struct Bshd {
  int64_t batch = 1, seqlen = 0, heads = 0, head_dim = 0;
};

ffi::Error as_bshd(const ffi::AnyBuffer& buf, const char* name, Bshd* shape) {
  const auto dims = buf.dimensions();
  const size_t rank = dims.size();
  if (rank < 4)
    return ffi::Error::InvalidArgument(std::string(name) + " must have rank >= 4 (..., seqlen, heads, head_dim); got " +
                                       dims_str(dims));
  shape->batch = 1;
  for (size_t i = 0; i + 3 < rank; ++i) shape->batch *= dims[i];
  shape->seqlen = dims[rank - 3], shape->heads = dims[rank - 2], shape->head_dim = dims[rank - 1];
  return ffi::Error::Success();
}

bool same_leading_dims(ffi::AnyBuffer::Dimensions a, ffi::AnyBuffer::Dimensions b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i + 3 < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

ffi::Error to_ffi_error(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return ffi::Error::Success();
    case StatusCode::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case StatusCode::kNotSupported: return ffi::Error(ffi::ErrorCode::kUnimplemented, s.message());
    case StatusCode::kCudaError:
    case StatusCode::kInternal: break;
  }
  return ffi::Error::Internal(s.message());
}

ffi::Error attention(DeviceType device_type, int device_id, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                     ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, bool causal,
                     double softmax_scale, std::string_view backend_name) {
  Backend backend;
  if (!waveboost::parse_backend(std::string(backend_name), &backend))
    return ffi::Error::InvalidArgument("backend must be one of waveboost.BACKENDS; got '" + std::string(backend_name) +
                                       "'");
  const std::optional<DType> dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("q must have dtype float16, bfloat16, float32 or float64");
  for (auto [buf, name] : {std::pair{&k, "k"}, {&v, "v"}, {&*out, "out"}})
    if (buf->element_type() != q.element_type())
      return ffi::Error::InvalidArgument(std::string(name) + " must have q's dtype");
  if (lse->element_type() != ffi::DataType::F32) return ffi::Error::InvalidArgument("lse must have dtype float32");

  Bshd qs, ks, vs;
  for (auto [buf, name, shape] : {std::tuple{&q, "q", &qs}, {&k, "k", &ks}, {&v, "v", &vs}})
    if (ffi::Error e = as_bshd(*buf, name, shape); e.failure()) return e;
  if (!same_leading_dims(q.dimensions(), k.dimensions()) || !(k.dimensions() == v.dimensions()) ||
      ks.head_dim != qs.head_dim)
    return ffi::Error::InvalidArgument("k " + dims_str(k.dimensions()) + " and v " + dims_str(v.dimensions()) +
                                       " must share q's leading (batch) dims and head_dim; q is " +
                                       dims_str(q.dimensions()));
  if (!(out->dimensions() == q.dimensions()))
    return ffi::Error::InvalidArgument("out must have q's shape " + dims_str(q.dimensions()));
  const auto lse_dims = lse->dimensions();
  if (lse_dims.size() != q.dimensions().size() - 1 || lse_dims[lse_dims.size() - 2] != qs.heads ||
      lse_dims[lse_dims.size() - 1] != qs.seqlen)
    return ffi::Error::InvalidArgument("lse " + dims_str(lse_dims) + " must be (..., heads, seqlen_q) for q " +
                                       dims_str(q.dimensions()));

  AttentionParams p;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.out = out->untyped_data();
  p.lse = static_cast<float*>(lse->untyped_data());
  // Row-major element strides of (batch, seqlen, heads, head_dim) and (batch, heads, seqlen_q).
  p.q_head_stride = qs.head_dim, p.q_row_stride = qs.heads * qs.head_dim, p.q_batch_stride = qs.seqlen * p.q_row_stride;
  p.k_head_stride = ks.head_dim, p.k_row_stride = ks.heads * ks.head_dim, p.k_batch_stride = ks.seqlen * p.k_row_stride;
  p.v_head_stride = p.k_head_stride, p.v_row_stride = p.k_row_stride, p.v_batch_stride = p.k_batch_stride;
  p.o_head_stride = p.q_head_stride, p.o_row_stride = p.q_row_stride, p.o_batch_stride = p.q_batch_stride;
  p.lse_head_stride = qs.seqlen, p.lse_batch_stride = qs.heads * qs.seqlen;
  p.batch = qs.batch, p.seqlen_q = qs.seqlen, p.seqlen_k = ks.seqlen;
  p.heads = qs.heads, p.heads_kv = ks.heads, p.head_dim = qs.head_dim;
  p.softmax_scale = softmax_scale;
  p.is_causal = causal;
  p.dtype = *dtype;
  p.device_type = device_type;
  p.device_id = device_id;
  return to_ffi_error(waveboost::attention_forward(p, backend, stream));
}

ffi::Error attention_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::AnyBuffer> lse, bool causal, double softmax_scale,
                         std::string_view backend) {
  return attention(DeviceType::kCPU, 0, nullptr, q, k, v, out, lse, causal, softmax_scale, backend);
}

#ifdef WAVEBOOST_WITH_CUDA
ffi::Error attention_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer q, ffi::AnyBuffer k,
                          ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                          bool causal, double softmax_scale, std::string_view backend) {
  return attention(DeviceType::kCUDA, device_ordinal, stream, q, k, v, out, lse, causal, softmax_scale, backend);
}
#endif

}  // namespace

#define WAVEBOOST_FORWARD_BINDING   \
  .Arg<ffi::AnyBuffer>()     /* q */   \
      .Arg<ffi::AnyBuffer>() /* k */   \
      .Arg<ffi::AnyBuffer>() /* v */   \
      .Ret<ffi::AnyBuffer>() /* out */ \
      .Ret<ffi::AnyBuffer>() /* lse */ \
      .Attr<bool>("causal")            \
      .Attr<double>("softmax_scale")   \
      .Attr<std::string_view>("backend")

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cpu, attention_cpu, ffi::Ffi::Bind() WAVEBOOST_FORWARD_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cuda, attention_cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_FORWARD_BINDING);
#endif

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

namespace {

// dq, dk, dv from dout, q, k, v, out, lse and dlse (read only when has_dlse), all row-major
// with the leading (vmap) dims folded into batch like the forward's.
ffi::Error attention_backward(DeviceType device_type, int device_id, void* stream, ffi::AnyBuffer dout,
                              ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                              ffi::AnyBuffer lse, ffi::AnyBuffer dlse, ffi::Result<ffi::AnyBuffer> dq,
                              ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv, bool causal,
                              double softmax_scale, bool has_dlse, bool deterministic,
                              std::string_view backend_name) {
  Backend backend;
  if (!waveboost::parse_backend(std::string(backend_name), &backend))
    return ffi::Error::InvalidArgument("backend must be one of waveboost.BACKENDS; got '" + std::string(backend_name) +
                                       "'");
  const std::optional<DType> dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("q must have dtype float16, bfloat16, float32 or float64");
  for (auto [buf, name] :
       {std::pair{&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}, {&*dq, "dq"}, {&*dk, "dk"}, {&*dv, "dv"}})
    if (buf->element_type() != q.element_type())
      return ffi::Error::InvalidArgument(std::string(name) + " must have q's dtype");
  for (auto [buf, name] : {std::pair{&lse, "lse"}, {&dlse, "dlse"}})
    if (buf->element_type() != ffi::DataType::F32)
      return ffi::Error::InvalidArgument(std::string(name) + " must have dtype float32");

  Bshd qs, ks, vs;
  for (auto [buf, name, shape] : {std::tuple{&q, "q", &qs}, {&k, "k", &ks}, {&v, "v", &vs}})
    if (ffi::Error e = as_bshd(*buf, name, shape); e.failure()) return e;
  if (!same_leading_dims(q.dimensions(), k.dimensions()) || !(k.dimensions() == v.dimensions()) ||
      ks.head_dim != qs.head_dim)
    return ffi::Error::InvalidArgument("k " + dims_str(k.dimensions()) + " and v " + dims_str(v.dimensions()) +
                                       " must share q's leading (batch) dims and head_dim; q is " +
                                       dims_str(q.dimensions()));
  for (auto [buf, name] : {std::pair{&out, "out"}, {&dout, "dout"}, {&*dq, "dq"}})
    if (!(buf->dimensions() == q.dimensions()))
      return ffi::Error::InvalidArgument(std::string(name) + " must have q's shape " + dims_str(q.dimensions()));
  if (!(dk->dimensions() == k.dimensions()) || !(dv->dimensions() == v.dimensions()))
    return ffi::Error::InvalidArgument("dk and dv must have k's shape " + dims_str(k.dimensions()));
  for (auto [buf, name] : {std::pair{&lse, "lse"}, {&dlse, "dlse"}}) {
    const auto dims = buf->dimensions();
    if (dims.size() != q.dimensions().size() - 1 || dims[dims.size() - 2] != qs.heads ||
        dims[dims.size() - 1] != qs.seqlen)
      return ffi::Error::InvalidArgument(std::string(name) + " " + dims_str(dims) +
                                         " must be (..., heads, seqlen_q) for q " + dims_str(q.dimensions()));
  }

  waveboost::AttentionBackwardParams p;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.out = out.untyped_data();
  p.lse = static_cast<float*>(lse.untyped_data());
  p.dout = dout.untyped_data();
  p.dq = dq->untyped_data();
  p.dk = dk->untyped_data();
  p.dv = dv->untyped_data();
  p.dlse = has_dlse ? static_cast<const float*>(dlse.untyped_data()) : nullptr;
  // Row-major element strides of (batch, seqlen, heads, head_dim) and (batch, heads, seqlen_q).
  p.q_head_stride = qs.head_dim, p.q_row_stride = qs.heads * qs.head_dim, p.q_batch_stride = qs.seqlen * p.q_row_stride;
  p.k_head_stride = ks.head_dim, p.k_row_stride = ks.heads * ks.head_dim, p.k_batch_stride = ks.seqlen * p.k_row_stride;
  p.v_head_stride = p.k_head_stride, p.v_row_stride = p.k_row_stride, p.v_batch_stride = p.k_batch_stride;
  p.o_head_stride = p.q_head_stride, p.o_row_stride = p.q_row_stride, p.o_batch_stride = p.q_batch_stride;
  p.do_head_stride = p.dq_head_stride = p.q_head_stride;
  p.do_row_stride = p.dq_row_stride = p.q_row_stride;
  p.do_batch_stride = p.dq_batch_stride = p.q_batch_stride;
  p.dk_head_stride = p.dv_head_stride = p.k_head_stride;
  p.dk_row_stride = p.dv_row_stride = p.k_row_stride;
  p.dk_batch_stride = p.dv_batch_stride = p.k_batch_stride;
  p.lse_head_stride = p.dlse_head_stride = qs.seqlen;
  p.lse_batch_stride = p.dlse_batch_stride = qs.heads * qs.seqlen;
  p.batch = qs.batch, p.seqlen_q = qs.seqlen, p.seqlen_k = ks.seqlen;
  p.heads = qs.heads, p.heads_kv = ks.heads, p.head_dim = qs.head_dim;
  p.softmax_scale = softmax_scale;
  p.is_causal = causal;
  p.deterministic = deterministic;
  p.dtype = *dtype;
  p.device_type = device_type;
  p.device_id = device_id;
  return to_ffi_error(waveboost::attention_backward(p, backend, stream));
}

ffi::Error attention_backward_cpu(ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                  ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dlse,
                                  ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                  ffi::Result<ffi::AnyBuffer> dv, bool causal, double softmax_scale, bool has_dlse,
                                  bool deterministic, std::string_view backend) {
  return attention_backward(DeviceType::kCPU, 0, nullptr, dout, q, k, v, out, lse, dlse, dq, dk, dv, causal,
                            softmax_scale, has_dlse, deterministic, backend);
}

#ifdef WAVEBOOST_WITH_CUDA
ffi::Error attention_backward_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer dout, ffi::AnyBuffer q,
                                   ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                                   ffi::AnyBuffer dlse, ffi::Result<ffi::AnyBuffer> dq,
                                   ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv, bool causal,
                                   double softmax_scale, bool has_dlse, bool deterministic,
                                   std::string_view backend) {
  return attention_backward(DeviceType::kCUDA, device_ordinal, stream, dout, q, k, v, out, lse, dlse, dq, dk, dv,
                            causal, softmax_scale, has_dlse, deterministic, backend);
}
#endif

}  // namespace

#define WAVEBOOST_BACKWARD_BINDING               \
  .Arg<ffi::AnyBuffer>()     /* dout */             \
      .Arg<ffi::AnyBuffer>() /* q */                \
      .Arg<ffi::AnyBuffer>() /* k */                \
      .Arg<ffi::AnyBuffer>() /* v */                \
      .Arg<ffi::AnyBuffer>() /* out */              \
      .Arg<ffi::AnyBuffer>() /* lse */              \
      .Arg<ffi::AnyBuffer>() /* dlse */             \
      .Ret<ffi::AnyBuffer>() /* dq */               \
      .Ret<ffi::AnyBuffer>() /* dk */               \
      .Ret<ffi::AnyBuffer>() /* dv */               \
      .Attr<bool>("causal")                         \
      .Attr<double>("softmax_scale")                \
      .Attr<bool>("has_dlse")                       \
      .Attr<bool>("deterministic")                  \
      .Attr<std::string_view>("backend")

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cpu, attention_backward_cpu,
                              ffi::Ffi::Bind() WAVEBOOST_BACKWARD_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cuda, attention_backward_cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_BACKWARD_BINDING);
#endif

// ---------------------------------------------------------------------------
// KV-cache attention: optional append of k_new/v_new into the cache (the cache results alias the
// cache operands, so under jit with donation XLA updates the cache in place), then attention of q
// over each sequence's filled keys. Every buffer is row-major, as XLA lays them out by default.
// ---------------------------------------------------------------------------
namespace {

ffi::Error kvcache(DeviceType device_type, int device_id, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k_cache_in,
                   ffi::AnyBuffer v_cache_in, ffi::AnyBuffer cache_seqlens, ffi::AnyBuffer block_table,
                   ffi::AnyBuffer k_new, ffi::AnyBuffer v_new, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> k_cache,
                   ffi::Result<ffi::AnyBuffer> v_cache, ffi::Result<ffi::AnyBuffer> seqused, bool causal,
                   double softmax_scale, std::string_view backend_name, bool paged, bool append) {
  Backend backend;
  if (!waveboost::parse_backend(std::string(backend_name), &backend))
    return ffi::Error::InvalidArgument("unknown backend '" + std::string(backend_name) + "'");
  const std::optional<DType> dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("q must have dtype float16, bfloat16, float32 or float64");
  for (auto [buf, name] : {std::pair{&k_cache_in, "k_cache"}, {&v_cache_in, "v_cache"}, {&k_new, "k_new"},
                           {&v_new, "v_new"}})
    if (buf->element_type() != q.element_type()) return ffi::Error::InvalidArgument(std::string(name) + " must have q's dtype");
  for (auto [buf, name] : {std::pair{&cache_seqlens, "cache_seqlens"}, {&block_table, "block_table"}})
    if (buf->element_type() != ffi::DataType::S32) return ffi::Error::InvalidArgument(std::string(name) + " must be int32");
  const auto qd = q.dimensions(), cd = k_cache_in.dimensions(), nd = k_new.dimensions(), td = block_table.dimensions();
  if (qd.size() != 4 || cd.size() != 4 || nd.size() != 4 || td.size() != 2 || !(v_cache_in.dimensions() == cd) ||
      !(v_new.dimensions() == nd))
    return ffi::Error::InvalidArgument("q, k_cache, v_cache, k_new, v_new must be 4-D (v like k) and block_table 2-D");
  const int64_t batch = qd[0], heads = qd[2], head_dim = qd[3], heads_kv = cd[2];
  if (cd[3] != head_dim || nd[0] != batch || nd[2] != heads_kv || nd[3] != head_dim ||
      cache_seqlens.element_count() != static_cast<size_t>(batch) || (paged && td[0] != batch) ||
      (!paged && cd[0] != batch))
    return ffi::Error::InvalidArgument("inconsistent shapes: q " + dims_str(qd) + ", k_cache " + dims_str(cd) +
                                       ", k_new " + dims_str(nd) + ", block_table " + dims_str(td));
  const int64_t row = heads_kv * head_dim, capacity = paged ? td[1] * cd[1] : cd[1];
  const int32_t* lengths = static_cast<const int32_t*>(cache_seqlens.untyped_data());
  const int32_t* table = paged ? static_cast<const int32_t*>(block_table.untyped_data()) : nullptr;

  if (append) {
    waveboost::KVCacheAppendParams a;
    a.k_cache = k_cache->untyped_data();
    a.v_cache = v_cache->untyped_data();
    a.kc_head_stride = a.vc_head_stride = head_dim;
    a.kc_row_stride = a.vc_row_stride = row;
    a.kc_batch_stride = a.vc_batch_stride = cd[1] * row;
    a.k_new = k_new.untyped_data();
    a.v_new = v_new.untyped_data();
    a.kn_head_stride = a.vn_head_stride = head_dim;
    a.kn_row_stride = a.vn_row_stride = row;
    a.kn_batch_stride = a.vn_batch_stride = nd[1] * row;
    a.cache_seqlens = lengths;
    a.seqused_out = static_cast<int32_t*>(seqused->untyped_data());
    a.block_table = table;
    a.block_table_batch_stride = td[1];
    a.page_size = paged ? cd[1] : 0;
    a.num_pages = paged ? cd[0] : 0;
    a.batch = batch, a.seqlen_new = nd[1], a.heads_kv = heads_kv, a.head_dim = head_dim, a.capacity = capacity;
    a.dtype = *dtype;
    a.device_type = device_type;
    a.device_id = device_id;
    if (Status st = waveboost::kv_cache_append(a, stream); !st.ok()) return to_ffi_error(st);
  }

  AttentionParams p;
  p.q = q.untyped_data();
  p.k = k_cache->untyped_data();
  p.v = v_cache->untyped_data();
  p.out = out->untyped_data();
  p.lse = static_cast<float*>(lse->untyped_data());
  p.q_head_stride = p.o_head_stride = head_dim;
  p.q_row_stride = p.o_row_stride = heads * head_dim;
  p.q_batch_stride = p.o_batch_stride = qd[1] * heads * head_dim;
  p.k_head_stride = p.v_head_stride = head_dim;
  p.k_row_stride = p.v_row_stride = row;
  p.k_batch_stride = p.v_batch_stride = cd[1] * row;
  p.lse_head_stride = qd[1], p.lse_batch_stride = heads * qd[1];
  p.batch = batch, p.seqlen_q = qd[1], p.seqlen_k = capacity;
  p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  p.seqused_k = append ? static_cast<const int32_t*>(seqused->untyped_data()) : lengths;
  if (paged) {
    p.block_table = table;
    p.block_table_batch_stride = td[1];
    p.page_size = cd[1];
    p.num_pages = cd[0];
  }
  p.softmax_scale = softmax_scale;
  p.is_causal = causal;
  p.dtype = *dtype;
  p.device_type = device_type;
  p.device_id = device_id;
  return to_ffi_error(waveboost::attention_forward(p, backend, stream));
}

ffi::Error kvcache_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k_cache_in, ffi::AnyBuffer v_cache_in,
                       ffi::AnyBuffer cache_seqlens, ffi::AnyBuffer block_table, ffi::AnyBuffer k_new,
                       ffi::AnyBuffer v_new, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                       ffi::Result<ffi::AnyBuffer> k_cache, ffi::Result<ffi::AnyBuffer> v_cache,
                       ffi::Result<ffi::AnyBuffer> seqused, bool causal, double softmax_scale,
                       std::string_view backend, bool paged, bool append) {
  return kvcache(DeviceType::kCPU, 0, nullptr, q, k_cache_in, v_cache_in, cache_seqlens, block_table, k_new, v_new,
                 out, lse, k_cache, v_cache, seqused, causal, softmax_scale, backend, paged, append);
}

#ifdef WAVEBOOST_WITH_CUDA
ffi::Error kvcache_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer q, ffi::AnyBuffer k_cache_in,
                        ffi::AnyBuffer v_cache_in, ffi::AnyBuffer cache_seqlens, ffi::AnyBuffer block_table,
                        ffi::AnyBuffer k_new, ffi::AnyBuffer v_new, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> k_cache,
                        ffi::Result<ffi::AnyBuffer> v_cache, ffi::Result<ffi::AnyBuffer> seqused, bool causal,
                        double softmax_scale, std::string_view backend, bool paged, bool append) {
  return kvcache(DeviceType::kCUDA, device_ordinal, stream, q, k_cache_in, v_cache_in, cache_seqlens, block_table,
                 k_new, v_new, out, lse, k_cache, v_cache, seqused, causal, softmax_scale, backend, paged, append);
}
#endif

}  // namespace

#define WAVEBOOST_KVCACHE_BINDING                                                               \
  .Arg<ffi::AnyBuffer>()     /* q */                                                            \
      .Arg<ffi::AnyBuffer>() /* k_cache */                                                      \
      .Arg<ffi::AnyBuffer>() /* v_cache */                                                      \
      .Arg<ffi::AnyBuffer>() /* cache_seqlens */                                                \
      .Arg<ffi::AnyBuffer>() /* block_table ((batch, 0) when not paged) */                      \
      .Arg<ffi::AnyBuffer>() /* k_new ((batch, 0, heads_kv, head_dim) when not appending) */    \
      .Arg<ffi::AnyBuffer>() /* v_new */                                                        \
      .Ret<ffi::AnyBuffer>() /* out */                                                          \
      .Ret<ffi::AnyBuffer>() /* lse */                                                          \
      .Ret<ffi::AnyBuffer>() /* k_cache (aliases the k_cache operand) */                        \
      .Ret<ffi::AnyBuffer>() /* v_cache (aliases the v_cache operand) */                        \
      .Ret<ffi::AnyBuffer>() /* seqused: cache_seqlens + seqlen_new */                          \
      .Attr<bool>("causal")                                                                     \
      .Attr<double>("softmax_scale")                                                            \
      .Attr<std::string_view>("backend")                                                        \
      .Attr<bool>("paged")                                                                      \
      .Attr<bool>("append")

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_kvcache_cpu, kvcache_cpu, ffi::Ffi::Bind() WAVEBOOST_KVCACHE_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_kvcache_cuda, kvcache_cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_KVCACHE_BINDING);
#endif

// ---------------------------------------------------------------------------
// Variable-length batches: q/out packed (total_q, heads, head_dim); k/v packed (total_k, heads_kv,
// head_dim) with cu_seqlens_k, or a paged cache (num_pages, page_size, heads_kv, head_dim) with
// block_table. Unused index operands are empty arrays, flagged off by the attributes.
// ---------------------------------------------------------------------------
namespace {

ffi::Error varlen(DeviceType device_type, int device_id, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                  ffi::AnyBuffer v, ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k, ffi::AnyBuffer seqused_k,
                  ffi::AnyBuffer block_table, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                  int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, double softmax_scale,
                  std::string_view backend_name, bool paged, bool has_seqused) {
  Backend backend;
  if (!waveboost::parse_backend(std::string(backend_name), &backend))
    return ffi::Error::InvalidArgument("unknown backend '" + std::string(backend_name) + "'");
  const std::optional<DType> dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("q must have dtype float16, bfloat16, float32 or float64");
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("k and v must have q's dtype");
  for (auto [buf, name] : {std::pair{&cu_seqlens_q, "cu_seqlens_q"}, {&cu_seqlens_k, "cu_seqlens_k"},
                           {&seqused_k, "seqused_k"}, {&block_table, "block_table"}})
    if (buf->element_type() != ffi::DataType::S32) return ffi::Error::InvalidArgument(std::string(name) + " must be int32");
  const auto qd = q.dimensions(), kd = k.dimensions(), td = block_table.dimensions();
  const size_t k_rank = paged ? 4 : 3;
  if (qd.size() != 3 || kd.size() != k_rank || !(v.dimensions() == kd) || td.size() != 2 ||
      cu_seqlens_q.dimensions().size() != 1 || cu_seqlens_q.element_count() < 1)
    return ffi::Error::InvalidArgument("q must be (total_q, heads, head_dim), k and v " +
                                       std::string(paged ? "(num_pages, page_size, heads_kv, head_dim)"
                                                         : "(total_k, heads_kv, head_dim)") +
                                       ", cu_seqlens_q (batch + 1,); got q " + dims_str(qd) + ", k " + dims_str(kd));
  const int64_t batch = static_cast<int64_t>(cu_seqlens_q.element_count()) - 1;
  const int64_t heads = qd[1], head_dim = qd[2], heads_kv = kd[k_rank - 2];
  if (kd[k_rank - 1] != head_dim || (!paged && cu_seqlens_k.element_count() != static_cast<size_t>(batch + 1)) ||
      (has_seqused && seqused_k.element_count() != static_cast<size_t>(batch)) || (paged && td[0] != batch))
    return ffi::Error::InvalidArgument("inconsistent shapes: q " + dims_str(qd) + ", k " + dims_str(kd) +
                                       ", block_table " + dims_str(td) + " for a batch of " + std::to_string(batch));

  // Host memory costs nothing to read: the packed extents are checked here (the cpu backend checks
  // the rest of the indices it follows).
  if (device_type == DeviceType::kCPU) {
    const int32_t* cq = static_cast<const int32_t*>(cu_seqlens_q.untyped_data());
    const int32_t* ck = static_cast<const int32_t*>(cu_seqlens_k.untyped_data());
    if (cq[0] < 0 || cq[batch] > qd[0])
      return ffi::Error::InvalidArgument("cu_seqlens_q must lie in [0, " + std::to_string(qd[0]) + "] (the packed rows)");
    if (!paged && (ck[0] < 0 || ck[batch] > kd[0]))
      return ffi::Error::InvalidArgument("cu_seqlens_k must lie in [0, " + std::to_string(kd[0]) + "] (the packed rows)");
  }

  AttentionParams p;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.out = out->untyped_data();
  p.lse = static_cast<float*>(lse->untyped_data());
  p.q_head_stride = p.o_head_stride = head_dim;
  p.q_row_stride = p.o_row_stride = heads * head_dim;
  p.k_head_stride = p.v_head_stride = head_dim;
  p.k_row_stride = p.v_row_stride = heads_kv * head_dim;
  p.lse_head_stride = qd[0];
  p.cu_seqlens_q = static_cast<const int32_t*>(cu_seqlens_q.untyped_data());
  p.seqused_k = has_seqused ? static_cast<const int32_t*>(seqused_k.untyped_data()) : nullptr;
  if (paged) {
    p.k_batch_stride = p.v_batch_stride = kd[1] * p.k_row_stride;
    p.block_table = static_cast<const int32_t*>(block_table.untyped_data());
    p.block_table_batch_stride = td[1];
    p.page_size = kd[1];
    p.num_pages = kd[0];
    p.seqlen_k = td[1] * kd[1];
  } else {
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_seqlens_k.untyped_data());
    p.seqlen_k = max_seqlen_k;
  }
  p.batch = batch, p.seqlen_q = max_seqlen_q;
  p.heads = heads, p.heads_kv = heads_kv, p.head_dim = head_dim;
  p.softmax_scale = softmax_scale;
  p.is_causal = causal;
  p.dtype = *dtype;
  p.device_type = device_type;
  p.device_id = device_id;
  return to_ffi_error(waveboost::attention_forward(p, backend, stream));
}

ffi::Error varlen_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer cu_seqlens_q,
                      ffi::AnyBuffer cu_seqlens_k, ffi::AnyBuffer seqused_k, ffi::AnyBuffer block_table,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, bool causal, double softmax_scale, std::string_view backend, bool paged,
                      bool has_seqused) {
  return varlen(DeviceType::kCPU, 0, nullptr, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, out, lse,
                max_seqlen_q, max_seqlen_k, causal, softmax_scale, backend, paged, has_seqused);
}

#ifdef WAVEBOOST_WITH_CUDA
ffi::Error varlen_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                       ffi::AnyBuffer seqused_k, ffi::AnyBuffer block_table, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> lse, int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                       double softmax_scale, std::string_view backend, bool paged, bool has_seqused) {
  return varlen(DeviceType::kCUDA, device_ordinal, stream, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                block_table, out, lse, max_seqlen_q, max_seqlen_k, causal, softmax_scale, backend, paged, has_seqused);
}
#endif

}  // namespace

#define WAVEBOOST_VARLEN_BINDING                                                       \
  .Arg<ffi::AnyBuffer>()     /* q */                                                   \
      .Arg<ffi::AnyBuffer>() /* k */                                                   \
      .Arg<ffi::AnyBuffer>() /* v */                                                   \
      .Arg<ffi::AnyBuffer>() /* cu_seqlens_q */                                        \
      .Arg<ffi::AnyBuffer>() /* cu_seqlens_k ((0,) when paged) */                      \
      .Arg<ffi::AnyBuffer>() /* seqused_k ((0,) unless has_seqused) */                 \
      .Arg<ffi::AnyBuffer>() /* block_table ((0, 0) unless paged) */                   \
      .Ret<ffi::AnyBuffer>() /* out */                                                 \
      .Ret<ffi::AnyBuffer>() /* lse (heads, total_q) */                                \
      .Attr<int64_t>("max_seqlen_q")                                                   \
      .Attr<int64_t>("max_seqlen_k")                                                   \
      .Attr<bool>("causal")                                                            \
      .Attr<double>("softmax_scale")                                                   \
      .Attr<std::string_view>("backend")                                               \
      .Attr<bool>("paged")                                                             \
      .Attr<bool>("has_seqused")

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_varlen_cpu, varlen_cpu, ffi::Ffi::Bind() WAVEBOOST_VARLEN_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_varlen_cuda, varlen_cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_VARLEN_BINDING);
#endif

// ---------------------------------------------------------------------------
// Merging partial attention states: outs (num_parts, batch, seqlen, heads, head_dim), lses float32
// (num_parts, batch, heads, seqlen) -> out (batch, seqlen, heads, head_dim) in outs' dtype, lse.
// ---------------------------------------------------------------------------
namespace {

ffi::Error merge(DeviceType device_type, int device_id, void* stream, ffi::AnyBuffer outs, ffi::AnyBuffer lses,
                 ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  const std::optional<DType> dtype = to_dtype(outs.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("outs must have dtype float16, bfloat16, float32 or float64");
  if (lses.element_type() != ffi::DataType::F32) return ffi::Error::InvalidArgument("lses must be float32");
  const auto od = outs.dimensions(), ld = lses.dimensions();
  if (od.size() != 5 || ld.size() != 4 || ld[0] != od[0] || ld[1] != od[1] || ld[2] != od[3] || ld[3] != od[2])
    return ffi::Error::InvalidArgument("outs must be (num_parts, batch, seqlen, heads, head_dim) and lses "
                                       "(num_parts, batch, heads, seqlen); got " + dims_str(od) + " and " + dims_str(ld));
  const int64_t parts = od[0], batch = od[1], seqlen = od[2], heads = od[3], head_dim = od[4];
  waveboost::MergeStatesParams m;
  m.outs = outs.untyped_data();
  m.outs_dtype = *dtype;
  m.outs_head_stride = head_dim, m.outs_row_stride = heads * head_dim, m.outs_batch_stride = seqlen * heads * head_dim;
  m.outs_part_stride = batch * m.outs_batch_stride;
  m.lses = static_cast<const float*>(lses.untyped_data());
  m.lses_row_stride = 1, m.lses_head_stride = seqlen, m.lses_batch_stride = heads * seqlen;
  m.lses_part_stride = batch * heads * seqlen;
  m.out = out->untyped_data();
  m.dtype = *dtype;
  m.o_head_stride = head_dim, m.o_row_stride = heads * head_dim, m.o_batch_stride = seqlen * heads * head_dim;
  m.lse = static_cast<float*>(lse->untyped_data());
  m.lse_head_stride = seqlen, m.lse_batch_stride = heads * seqlen;
  m.num_parts = parts, m.batch = batch, m.seqlen = seqlen, m.heads = heads, m.head_dim = head_dim;
  m.device_type = device_type;
  m.device_id = device_id;
  return to_ffi_error(waveboost::merge_attention_states(m, stream));
}

ffi::Error merge_cpu(ffi::AnyBuffer outs, ffi::AnyBuffer lses, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> lse) {
  return merge(DeviceType::kCPU, 0, nullptr, outs, lses, out, lse);
}

#ifdef WAVEBOOST_WITH_CUDA
ffi::Error merge_cuda(cudaStream_t stream, int32_t device_ordinal, ffi::AnyBuffer outs, ffi::AnyBuffer lses,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  return merge(DeviceType::kCUDA, device_ordinal, stream, outs, lses, out, lse);
}
#endif

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_merge_cpu, merge_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // outs
                                  .Arg<ffi::AnyBuffer>()   // lses
                                  .Ret<ffi::AnyBuffer>()   // out
                                  .Ret<ffi::AnyBuffer>());  // lse
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_merge_cuda, merge_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // outs
                                  .Arg<ffi::AnyBuffer>()   // lses
                                  .Ret<ffi::AnyBuffer>()   // out
                                  .Ret<ffi::AnyBuffer>());  // lse
#endif
