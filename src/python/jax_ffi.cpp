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

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cpu, attention_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // lse
                                  .Attr<bool>("causal")
                                  .Attr<double>("softmax_scale")
                                  .Attr<std::string_view>("backend"));

#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cuda, attention_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // lse
                                  .Attr<bool>("causal")
                                  .Attr<double>("softmax_scale")
                                  .Attr<std::string_view>("backend"));
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cpu, attention_backward_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dlse
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Attr<bool>("causal")
                                  .Attr<double>("softmax_scale")
                                  .Attr<bool>("has_dlse")
                                  .Attr<bool>("deterministic")
                                  .Attr<std::string_view>("backend"));

#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cuda, attention_backward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dlse
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Attr<bool>("causal")
                                  .Attr<double>("softmax_scale")
                                  .Attr<bool>("has_dlse")
                                  .Attr<bool>("deterministic")
                                  .Attr<std::string_view>("backend"));
#endif
