// The params builder of the front ends: turns framework-neutral tensor descriptions into the C++
// API's params (AttentionParams, AttentionBackwardParams, MergeStatesParams, KVCacheAppendParams),
// checking every argument on the way with a message that names it, what was expected and what was
// given. The nanobind binding (src/python/waveboost_ext.cpp, DLPack tensors) and the XLA FFI
// handlers (src/python/jax_ffi.cpp, XLA buffers) only describe their tensors as TensorArg and call
// the builder of their entry point, so each argument is validated once, in one place, with the same
// messages. No nanobind, DLPack, XLA or Python types here.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "waveboost/attention.h"

namespace waveboost::frontend {

// Element type codes and device types with DLPack's numbering (what nanobind hands over as is).
enum class ElementKind : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kOpaque = 3,
  kBFloat = 4,
  kComplex = 5,
  kBool = 6,
  kFloat8E4M3FN = 10,  // DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn, jnp.float8_e4m3fn)
};

struct ElementType {
  ElementKind kind = ElementKind::kFloat;
  uint8_t bits = 32;
  uint16_t lanes = 1;
  bool operator==(const ElementType& o) const { return kind == o.kind && bits == o.bits && lanes == o.lanes; }
  bool operator!=(const ElementType& o) const { return !(*this == o); }
};

enum class DeviceKind : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };

// One tensor as a front end sees it: data pointer, element type, shape, element strides, device.
struct TensorArg {
  static constexpr int kMaxRank = 8;  // dimensions past this are counted in ndim but not kept
  const void* data = nullptr;
  ElementType dtype;
  int ndim = 0;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];  // in elements, not bytes; entries past ndim are not set
  int32_t device_type = static_cast<int32_t>(DeviceKind::kCPU);  // a DLPack device type
  int32_t device_id = 0;

  int64_t size() const;      // elements
  int64_t itemsize() const;  // bytes per element
};

// A wrong argument. kType: the dtype is wrong (Python's TypeError); kValue: anything else (ValueError).
class ArgumentError : public std::exception {
 public:
  enum class Kind { kValue, kType };
  ArgumentError(Kind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  Kind kind() const { return kind_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  Kind kind_;
  std::string message_;
};

// The backend `name` stands for; "backend must be one of 'auto', 'cpu', ...; got 'x'" otherwise.
Backend backend_from_name(const std::string& name);

// The descale factors of float8_e4m3fn q, k, v: float32 (batch, heads_kv) each, any strides (0
// repeats a value), or null for 1.
struct Descales {
  const TensorArg* q = nullptr;
  const TensorArg* k = nullptr;
  const TensorArg* v = nullptr;
  bool any() const { return q != nullptr || k != nullptr || v != nullptr; }
};

// Dense forward: q (batch, seqlen_q, heads, head_dim), k and v (batch, seqlen_k, heads_kv,
// head_dim), out like q, lse float32 (batch, heads, seqlen_q). Without `out` (a backend query)
// the params describe the contiguous output a call would allocate (float8_e4m3fn inputs: in
// bfloat16). With float8_e4m3fn q, k, v, out is bfloat16 or float16 and `descales` may be given.
AttentionParams forward_params(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg* out,
                               const TensorArg* lse, bool causal, std::optional<double> softmax_scale,
                               const Descales& descales = {});

// Backward: the forward's checks plus those of dout, dlse and the three gradients, which must not
// overlap each other or any input.
AttentionBackwardParams backward_params(const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                                        const TensorArg& v, const TensorArg& out, const TensorArg& lse,
                                        const TensorArg& dq, const TensorArg& dk, const TensorArg& dv,
                                        const TensorArg* dlse, bool causal, std::optional<double> softmax_scale,
                                        bool deterministic);

// Forward with a sequence layout. q/out are packed (total_q, heads, head_dim) with cu_seqlens_q,
// else (batch, seqlen_q, heads, head_dim); k/v are a paged cache (num_pages, page_size, heads_kv,
// head_dim) with block_table, packed (total_k, heads_kv, head_dim) with cu_seqlens_k, else
// (batch, seqlen_k, heads_kv, head_dim). Host index arrays are read for their packed extents.
AttentionParams sequence_params(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg& out,
                                const TensorArg* lse, const TensorArg* cu_seqlens_q, const TensorArg* cu_seqlens_k,
                                const TensorArg* seqused_k, const TensorArg* block_table,
                                std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k, bool causal,
                                std::optional<double> softmax_scale);

// outs (num_parts, batch, seqlen, heads, head_dim), lses float32 (num_parts, batch, heads, seqlen),
// out (batch, seqlen, heads, head_dim), lse float32 (batch, heads, seqlen).
MergeStatesParams merge_params(const TensorArg& outs, const TensorArg& lses, const TensorArg& out,
                               const TensorArg* lse);

// k_cache/v_cache (batch, max_len, heads_kv, head_dim), or paged (num_pages, page_size, heads_kv,
// head_dim) with block_table; k_new/v_new (batch, seqlen_new, heads_kv, head_dim); int32
// cache_seqlens and seqused_out (batch,).
KVCacheAppendParams append_params(const TensorArg& k_cache, const TensorArg& v_cache, const TensorArg& k_new,
                                  const TensorArg& v_new, const TensorArg& cache_seqlens,
                                  const TensorArg* seqused_out, const TensorArg* block_table);

}  // namespace waveboost::frontend
