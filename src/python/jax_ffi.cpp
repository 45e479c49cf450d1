// XLA FFI handlers behind waveboost.jax: they describe XLA's buffers as TensorArg, let the params
// builder (src/frontend/params_builder.h, shared with the nanobind binding) check them and fill the
// params, and call the C++ API on XLA's own stream. No kernel logic and no synchronization here:
// XLA allocates the outputs and orders the work.
//
// The handlers are exported C symbols of the _waveboost module; waveboost.jax
// wraps them in capsules (jax.ffi.pycapsule) and registers them under one
// target name for the "cpu" and "CUDA" platforms. Compiled only when jaxlib's
// FFI headers were found at build time (cmake/jax_ffi.cmake).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#ifdef WAVEBOOST_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "frontend/params_builder.h"
#include "waveboost/attention.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace fe = waveboost::frontend;
using waveboost::Backend;
using waveboost::DeviceType;
using waveboost::Status;
using fe::TensorArg;

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

fe::ElementType element_type(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::PRED: return {fe::ElementKind::kBool, 8, 1};
    case ffi::DataType::S8: return {fe::ElementKind::kInt, 8, 1};
    case ffi::DataType::S16: return {fe::ElementKind::kInt, 16, 1};
    case ffi::DataType::S32: return {fe::ElementKind::kInt, 32, 1};
    case ffi::DataType::S64: return {fe::ElementKind::kInt, 64, 1};
    case ffi::DataType::U8: return {fe::ElementKind::kUInt, 8, 1};
    case ffi::DataType::U16: return {fe::ElementKind::kUInt, 16, 1};
    case ffi::DataType::U32: return {fe::ElementKind::kUInt, 32, 1};
    case ffi::DataType::U64: return {fe::ElementKind::kUInt, 64, 1};
    case ffi::DataType::F16: return {fe::ElementKind::kFloat, 16, 1};
    case ffi::DataType::F32: return {fe::ElementKind::kFloat, 32, 1};
    case ffi::DataType::F64: return {fe::ElementKind::kFloat, 64, 1};
    case ffi::DataType::BF16: return {fe::ElementKind::kBFloat, 16, 1};
    case ffi::DataType::F8E4M3FN: return {fe::ElementKind::kFloat8E4M3FN, 8, 1};
    case ffi::DataType::C64: return {fe::ElementKind::kComplex, 64, 1};
    case ffi::DataType::C128: return {fe::ElementKind::kComplex, 128, 1};
    default: return {fe::ElementKind::kOpaque, static_cast<uint8_t>(8 * ffi::ByteWidth(type)), 1};
  }
}

// Where a handler runs: the device of every buffer, and XLA's stream there.
struct Place {
  DeviceType device_type;
  int device_id;
  void* stream;
};

// An XLA buffer as the params builder sees it: row-major element strides (XLA's default layout) on
// the handler's device. With `rank` > 0 a buffer of higher rank has its leading dimensions folded
// into one, so that it has `rank`: vmap (vmap_method="broadcast_all") prepends the mapped axes to
// every operand and result, and row-major folded axes have one stride.
TensorArg describe(const ffi::AnyBuffer& buf, const Place& place, int rank = 0) {
  const auto dims = buf.dimensions();
  const int given = static_cast<int>(dims.size());
  const int folded = rank > 0 && given > rank ? given - rank : 0;  // leading dims merged into the next one
  TensorArg t;
  t.data = buf.untyped_data();
  t.dtype = element_type(buf.element_type());
  t.ndim = given - folded;
  const int kept = std::min(t.ndim, TensorArg::kMaxRank);
  for (int i = 0; i < kept; ++i) t.shape[i] = dims[i + folded];
  for (int i = 0; i < folded; ++i) t.shape[0] *= dims[i];
  int64_t stride = 1;
  for (int i = kept - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride *= t.shape[i];
  }
  t.device_type =
      static_cast<int32_t>(place.device_type == DeviceType::kCUDA ? fe::DeviceKind::kCUDA : fe::DeviceKind::kCPU);
  t.device_id = place.device_id;
  return t;
}

std::string dims_str(ffi::AnyBuffer::Dimensions dims, size_t count) {
  std::string s = "(";
  for (size_t i = 0; i < count; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (count == 1 ? ",)" : ")");
}

// Buffers folded by describe() must agree on the folded (vmap) axes: those before the last `rank`.
void check_vmap_axes(const ffi::AnyBuffer& buf, const char* name, int rank, const ffi::AnyBuffer& q) {
  const auto dims = buf.dimensions(), q_dims = q.dimensions();
  const size_t axes = dims.size() > static_cast<size_t>(rank) ? dims.size() - rank : 0;
  const size_t q_axes = q_dims.size() > 4 ? q_dims.size() - 4 : 0;
  bool same = axes == q_axes;
  for (size_t i = 0; same && i < axes; ++i) same = dims[i] == q_dims[i];
  if (!same)
    throw fe::ArgumentError(fe::ArgumentError::Kind::kValue, std::string(name) + "'s leading (vmap) axes " +
                                                                 dims_str(dims, axes) + " must be q's " +
                                                                 dims_str(q_dims, q_axes));
}

ffi::Error to_ffi_error(const Status& s) {
  switch (s.code()) {
    case waveboost::StatusCode::kOk: return ffi::Error::Success();
    case waveboost::StatusCode::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case waveboost::StatusCode::kNotSupported: return ffi::Error(ffi::ErrorCode::kUnimplemented, s.message());
    case waveboost::StatusCode::kCudaError:
    case waveboost::StatusCode::kInternal: break;
  }
  return ffi::Error::Internal(s.message());
}

// Runs a handler's body, turning the params builder's argument errors into XLA errors: nothing
// may be thrown across the FFI boundary.
template <typename Body>
ffi::Error guarded(Body&& body) {
  try {
    return body();
  } catch (const fe::ArgumentError& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

// The cpu and CUDA handlers of one body: the same buffers and attributes, on the host, or on the
// device and stream XLA gives.
template <typename Signature, Signature* Body>
struct Handlers;
template <typename... Args, ffi::Error (*Body)(const Place&, Args...)>
struct Handlers<ffi::Error(const Place&, Args...), Body> {
  static ffi::Error cpu(Args... args) { return Body({DeviceType::kCPU, 0, nullptr}, args...); }
#ifdef WAVEBOOST_WITH_CUDA
  static ffi::Error cuda(cudaStream_t stream, int32_t device_ordinal, Args... args) {
    return Body({DeviceType::kCUDA, device_ordinal, stream}, args...);
  }
#endif
};

// An optional operand: described (and its vmap axes checked) only when `given`; XLA passes an empty
// placeholder otherwise.
std::optional<TensorArg> describe_if(bool given, const ffi::AnyBuffer& buf, const char* name, int rank,
                                     const Place& at, const ffi::AnyBuffer& q) {
  if (!given) return std::nullopt;
  check_vmap_axes(buf, name, rank, q);
  return describe(buf, at, rank);
}

const TensorArg* ptr(const std::optional<TensorArg>& t) { return t ? &*t : nullptr; }

// float8_e4m3fn q, k, v may come with float32 (batch, heads_kv) descale factors.
ffi::Error attention(const Place& at, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer q_descale,
                     ffi::AnyBuffer k_descale, ffi::AnyBuffer v_descale, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> lse, bool causal, double softmax_scale, std::string_view backend_name,
                     bool has_q_descale, bool has_k_descale, bool has_v_descale) {
  return guarded([&] {
    const Backend backend = fe::backend_from_name(std::string(backend_name));
    for (auto [buf, name, rank] : {std::tuple{&k, "k", 4}, {&v, "v", 4}, {&*out, "out", 4}, {&*lse, "lse", 3}})
      check_vmap_axes(*buf, name, rank, q);
    const std::optional<TensorArg> qd = describe_if(has_q_descale, q_descale, "q_descale", 2, at, q),
                                   kd = describe_if(has_k_descale, k_descale, "k_descale", 2, at, q),
                                   vd = describe_if(has_v_descale, v_descale, "v_descale", 2, at, q);
    const TensorArg out_arg = describe(*out, at, 4), lse_arg = describe(*lse, at, 3);
    const waveboost::AttentionParams p =
        fe::forward_params(describe(q, at, 4), describe(k, at, 4), describe(v, at, 4), &out_arg, &lse_arg, causal,
                           softmax_scale, {ptr(qd), ptr(kd), ptr(vd)});
    return to_ffi_error(waveboost::attention_forward(p, backend, at.stream));
  });
}

using AttentionHandlers = Handlers<decltype(attention), &attention>;

}  // namespace

#define WAVEBOOST_FORWARD_BINDING                                            \
  .Arg<ffi::AnyBuffer>()     /* q */                                         \
      .Arg<ffi::AnyBuffer>() /* k */                                         \
      .Arg<ffi::AnyBuffer>() /* v */                                         \
      .Arg<ffi::AnyBuffer>() /* q_descale ((0,) unless has_q_descale) */     \
      .Arg<ffi::AnyBuffer>() /* k_descale ((0,) unless has_k_descale) */     \
      .Arg<ffi::AnyBuffer>() /* v_descale ((0,) unless has_v_descale) */     \
      .Ret<ffi::AnyBuffer>() /* out (bfloat16 or float16 for e4m3 inputs) */ \
      .Ret<ffi::AnyBuffer>() /* lse */                                       \
      .Attr<bool>("causal")                                                  \
      .Attr<double>("softmax_scale")                                         \
      .Attr<std::string_view>("backend")                                     \
      .Attr<bool>("has_q_descale")                                           \
      .Attr<bool>("has_k_descale")                                           \
      .Attr<bool>("has_v_descale")

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cpu, AttentionHandlers::cpu,
                              ffi::Ffi::Bind() WAVEBOOST_FORWARD_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_cuda, AttentionHandlers::cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_FORWARD_BINDING);
#endif

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

namespace {

// dq, dk, dv from dout, q, k, v, out, lse and dlse (read only when has_dlse), all row-major
// with the leading (vmap) axes folded into batch like the forward's.
ffi::Error attention_backward(const Place& at, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                              ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dlse,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, bool causal, double softmax_scale, bool has_dlse,
                              bool deterministic, std::string_view backend_name) {
  return guarded([&] {
    const Backend backend = fe::backend_from_name(std::string(backend_name));
    for (auto [buf, name, rank] : {std::tuple{&k, "k", 4}, {&v, "v", 4}, {&out, "out", 4}, {&dout, "dout", 4},
                                   {&*dq, "dq", 4}, {&*dk, "dk", 4}, {&*dv, "dv", 4}, {&lse, "lse", 3},
                                   {&dlse, "dlse", 3}})
      check_vmap_axes(*buf, name, rank, q);
    const TensorArg dlse_arg = describe(dlse, at, 3);
    const waveboost::AttentionBackwardParams p = fe::backward_params(
        describe(dout, at, 4), describe(q, at, 4), describe(k, at, 4), describe(v, at, 4), describe(out, at, 4),
        describe(lse, at, 3), describe(*dq, at, 4), describe(*dk, at, 4), describe(*dv, at, 4),
        has_dlse ? &dlse_arg : nullptr, causal, softmax_scale, deterministic);
    return to_ffi_error(waveboost::attention_backward(p, backend, at.stream));
  });
}

using BackwardHandlers = Handlers<decltype(attention_backward), &attention_backward>;

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cpu, BackwardHandlers::cpu,
                              ffi::Ffi::Bind() WAVEBOOST_BACKWARD_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_attention_backward_cuda, BackwardHandlers::cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_BACKWARD_BINDING);
#endif

// ---------------------------------------------------------------------------
// KV-cache attention: optional append of k_new/v_new into the cache (the cache results alias the
// cache operands, so under jit with donation XLA updates the cache in place), then attention of q
// over each sequence's filled keys. Every buffer is row-major, as XLA lays them out by default.
// ---------------------------------------------------------------------------
namespace {

ffi::Error kvcache(const Place& at, ffi::AnyBuffer q, ffi::AnyBuffer k_cache_in, ffi::AnyBuffer v_cache_in,
                   ffi::AnyBuffer cache_seqlens, ffi::AnyBuffer block_table, ffi::AnyBuffer k_new,
                   ffi::AnyBuffer v_new, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                   ffi::Result<ffi::AnyBuffer> k_cache, ffi::Result<ffi::AnyBuffer> v_cache,
                   ffi::Result<ffi::AnyBuffer> seqused, bool causal, double softmax_scale,
                   std::string_view backend_name, bool paged, bool append) {
  (void)k_cache_in, (void)v_cache_in;  // the cache results alias them: the kernels use the results
  return guarded([&] {
    const Backend backend = fe::backend_from_name(std::string(backend_name));
    const TensorArg kc = describe(*k_cache, at), vc = describe(*v_cache, at), lengths = describe(cache_seqlens, at);
    const TensorArg table = describe(block_table, at), used = describe(*seqused, at), lse_arg = describe(*lse, at);
    std::optional<waveboost::KVCacheAppendParams> a;
    if (append)
      a = fe::append_params(kc, vc, describe(k_new, at), describe(v_new, at), lengths, &used, paged ? &table : nullptr);
    // Attention over each sequence's filled keys: cache_seqlens, or with the append its result.
    const waveboost::AttentionParams p = fe::sequence_params(
        describe(q, at), kc, vc, describe(*out, at), &lse_arg, nullptr, nullptr, append ? &used : &lengths,
        paged ? &table : nullptr, std::nullopt, std::nullopt, causal, softmax_scale);
    if (a)
      if (Status st = waveboost::kv_cache_append(*a, at.stream); !st.ok()) return to_ffi_error(st);
    return to_ffi_error(waveboost::attention_forward(p, backend, at.stream));
  });
}

using KVCacheHandlers = Handlers<decltype(kvcache), &kvcache>;

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_kvcache_cpu, KVCacheHandlers::cpu,
                              ffi::Ffi::Bind() WAVEBOOST_KVCACHE_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_kvcache_cuda, KVCacheHandlers::cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_KVCACHE_BINDING);
#endif

// ---------------------------------------------------------------------------
// Variable-length batches: q/out packed (total_q, heads, head_dim); k/v packed (total_k, heads_kv,
// head_dim) with cu_seqlens_k, or a paged cache (num_pages, page_size, heads_kv, head_dim) with
// block_table. Unused index operands are empty arrays, flagged off by the attributes.
// ---------------------------------------------------------------------------
namespace {

ffi::Error varlen(const Place& at, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer cu_seqlens_q,
                  ffi::AnyBuffer cu_seqlens_k, ffi::AnyBuffer seqused_k, ffi::AnyBuffer block_table,
                  ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, int64_t max_seqlen_q,
                  int64_t max_seqlen_k, bool causal, double softmax_scale, std::string_view backend_name, bool paged,
                  bool has_seqused) {
  return guarded([&] {
    const Backend backend = fe::backend_from_name(std::string(backend_name));
    const TensorArg cu_q = describe(cu_seqlens_q, at), cu_k = describe(cu_seqlens_k, at);
    const TensorArg used = describe(seqused_k, at), table = describe(block_table, at), lse_arg = describe(*lse, at);
    const waveboost::AttentionParams p = fe::sequence_params(
        describe(q, at), describe(k, at), describe(v, at), describe(*out, at), &lse_arg, &cu_q,
        paged ? nullptr : &cu_k, has_seqused ? &used : nullptr, paged ? &table : nullptr, max_seqlen_q,
        max_seqlen_k, causal, softmax_scale);
    return to_ffi_error(waveboost::attention_forward(p, backend, at.stream));
  });
}

using VarlenHandlers = Handlers<decltype(varlen), &varlen>;

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_varlen_cpu, VarlenHandlers::cpu, ffi::Ffi::Bind() WAVEBOOST_VARLEN_BINDING);
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_varlen_cuda, VarlenHandlers::cuda,
                              ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>()
                                  WAVEBOOST_VARLEN_BINDING);
#endif

// ---------------------------------------------------------------------------
// Merging partial attention states: outs (num_parts, batch, seqlen, heads, head_dim), lses float32
// (num_parts, batch, heads, seqlen) -> out (batch, seqlen, heads, head_dim) in outs' dtype, lse.
// ---------------------------------------------------------------------------
namespace {

ffi::Error merge(const Place& at, ffi::AnyBuffer outs, ffi::AnyBuffer lses, ffi::Result<ffi::AnyBuffer> out,
                 ffi::Result<ffi::AnyBuffer> lse) {
  return guarded([&] {
    const TensorArg lse_arg = describe(*lse, at);
    const waveboost::MergeStatesParams m =
        fe::merge_params(describe(outs, at), describe(lses, at), describe(*out, at), &lse_arg);
    return to_ffi_error(waveboost::merge_attention_states(m, at.stream));
  });
}

using MergeHandlers = Handlers<decltype(merge), &merge>;

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_merge_cpu, MergeHandlers::cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // outs
                                  .Arg<ffi::AnyBuffer>()   // lses
                                  .Ret<ffi::AnyBuffer>()   // out
                                  .Ret<ffi::AnyBuffer>());  // lse
#ifdef WAVEBOOST_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(waveboost_jax_merge_cuda, MergeHandlers::cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // outs
                                  .Arg<ffi::AnyBuffer>()   // lses
                                  .Ret<ffi::AnyBuffer>()   // out
                                  .Ret<ffi::AnyBuffer>());  // lse
#endif
