// waveboost._waveboost: the only nanobind code. It describes DLPack tensors as TensorArg, lets
// the params builder (src/frontend/params_builder.h) check every argument and fill the params,
// releases the GIL and calls the C++ API. No kernel logic here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "frontend/params_builder.h"
#include "waveboost/attention.h"

namespace nb = nanobind;
using waveboost::AttentionParams;
using waveboost::Backend;
using waveboost::KVCacheAppendParams;
using waveboost::MergeStatesParams;
using waveboost::Status;
using waveboost::StatusCode;
using waveboost::frontend::ArgumentError;
using waveboost::frontend::TensorArg;

namespace {

// Inputs may be read-only (JAX arrays, non-writeable NumPy arrays); outputs may not.
using InputTensor = nb::ndarray<nb::ro>;
using OutputTensor = nb::ndarray<>;

// A DLPack tensor as the params builder sees it (nanobind keeps DLPack's dtype codes, device
// types and element strides, which TensorArg shares).
TensorArg describe(const InputTensor& t) {
  TensorArg a;
  a.data = t.data();
  const nb::dlpack::dtype dt = t.dtype();
  a.dtype = {static_cast<waveboost::frontend::ElementKind>(dt.code), dt.bits, dt.lanes};
  a.ndim = static_cast<int>(t.ndim());
  for (int i = 0; i < std::min(a.ndim, TensorArg::kMaxRank); ++i) {
    a.shape[i] = static_cast<int64_t>(t.shape(i));
    a.strides[i] = t.stride(i);
  }
  a.device_type = t.device_type();
  a.device_id = t.device_id();
  return a;
}

std::optional<TensorArg> describe(const std::optional<InputTensor>& t) {
  if (!t) return std::nullopt;
  return describe(*t);
}

std::optional<TensorArg> describe(const std::optional<OutputTensor>& t) {
  if (!t) return std::nullopt;
  return describe(InputTensor(*t));
}

const TensorArg* ptr(const std::optional<TensorArg>& t) { return t ? &*t : nullptr; }

void raise_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotSupported: throw nb::value_error(s.message().c_str());
    case StatusCode::kCudaError:
    case StatusCode::kInternal: break;
  }
  throw std::runtime_error(s.message());
}

// Runs a C++ API call with the GIL released and raises its error.
template <typename Call>
void without_gil(Call&& call) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = call();
  }
  raise_status(s);
}

using waveboost::frontend::backend_from_name;

// The backend a call with params `p` (forward or backward) runs for `requested`; raises why not.
template <typename Params>
std::string resolved_backend_name(const Params& p, Backend requested) {
  const Backend chosen = requested == Backend::kAuto ? waveboost::select_backend(p) : requested;
  raise_status(waveboost::can_implement(p, chosen));
  return waveboost::backend_name(chosen);
}

}  // namespace

NB_MODULE(_waveboost, m) {
  m.doc() = "waveboost's compiled core: exact attention forward over DLPack tensors";
  // The params builder's argument errors: TypeError for a wrong dtype, ValueError otherwise.
  nb::register_exception_translator([](const std::exception_ptr& e, void*) {
    try {
      std::rethrow_exception(e);
    } catch (const ArgumentError& error) {
      PyErr_SetString(error.kind() == ArgumentError::Kind::kType ? PyExc_TypeError : PyExc_ValueError, error.what());
    }
  });

  m.def(
      "forward",
      [](InputTensor q, InputTensor k, InputTensor v, OutputTensor out, std::optional<OutputTensor> lse,
         bool causal, std::optional<double> softmax_scale, const std::string& backend, uintptr_t stream,
         std::optional<InputTensor> q_descale, std::optional<InputTensor> k_descale,
         std::optional<InputTensor> v_descale) {
        const Backend b = backend_from_name(backend);
        const TensorArg out_arg = describe(InputTensor(out));
        const std::optional<TensorArg> lse_arg = describe(lse);
        const std::optional<TensorArg> qd = describe(q_descale), kd = describe(k_descale), vd = describe(v_descale);
        const AttentionParams p =
            waveboost::frontend::forward_params(describe(q), describe(k), describe(v), &out_arg, ptr(lse_arg), causal,
                                                softmax_scale, {ptr(qd), ptr(kd), ptr(vd)});
        without_gil([&] { return waveboost::attention_forward(p, b, reinterpret_cast<void*>(stream)); });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), nb::arg("causal"),
      nb::arg("softmax_scale").none(), nb::arg("backend"), nb::arg("stream"), nb::arg("q_descale").none() = nb::none(),
      nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
      "Writes attention(q, k, v) into `out` (and the logsumexp into `lse` when given), "
      "on `stream` (a cudaStream_t as an integer; 0 = legacy default) for CUDA tensors; float8_e4m3fn q, k, v "
      "with optional float32 (batch, heads_kv) descale factors.");

  m.def(
      "resolve_backend",
      [](InputTensor q, InputTensor k, InputTensor v, bool causal, const std::string& backend) {
        const Backend b = backend_from_name(backend);
        const AttentionParams p = waveboost::frontend::forward_params(describe(q), describe(k), describe(v), nullptr,
                                                                      nullptr, causal, std::nullopt);
        return resolved_backend_name(p, b);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("backend") = "auto",
      "The backend a call with these tensors would run; raises ValueError with the reason if it cannot run.");

  m.def(
      "plan",
      [](InputTensor q, InputTensor k, InputTensor v, bool causal, const std::string& backend) {
        const Backend b = backend_from_name(backend);
        const AttentionParams p = waveboost::frontend::forward_params(describe(q), describe(k), describe(v), nullptr,
                                                                      nullptr, causal, std::nullopt);
        waveboost::ForwardPlan plan;
        raise_status(waveboost::plan_forward(p, b, &plan));
        nb::dict r;
        r["backend"] = waveboost::backend_name(plan.backend);
        r["kernel"] = plan.kernel;
        r["num_splits"] = plan.num_splits;
        r["merge"] = plan.merge;
        r["persistent"] = plan.persistent;
        return r;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("backend") = "auto",
      "What a call with these tensors would launch: backend, kernel and split-KV pieces; nothing runs.");

  m.def(
      "stream_synchronize",
      [](int device_id, uintptr_t stream) {
        without_gil([&] { return waveboost::stream_synchronize(device_id, reinterpret_cast<void*>(stream)); });
      },
      nb::arg("device_id"), nb::arg("stream"));
  m.def(
      "backend_available",
      [](const std::string& backend, int device_id) {
        return waveboost::backend_available(backend_from_name(backend), device_id);
      },
      nb::arg("backend"), nb::arg("device_id"),
      "Whether a CUDA backend can run on that device with this build, for some dtype and head dim.");
  // ---- Backward ----
  m.def(
      "backward",
      [](InputTensor dout, InputTensor q, InputTensor k, InputTensor v, InputTensor out, InputTensor lse,
         OutputTensor dq, OutputTensor dk, OutputTensor dv, std::optional<InputTensor> dlse, bool causal,
         std::optional<double> softmax_scale, bool deterministic, const std::string& backend, uintptr_t stream) {
        const Backend b = backend_from_name(backend);
        const std::optional<TensorArg> dlse_arg = describe(dlse);
        const waveboost::AttentionBackwardParams p = waveboost::frontend::backward_params(
            describe(dout), describe(q), describe(k), describe(v), describe(out), describe(lse),
            describe(InputTensor(dq)), describe(InputTensor(dk)), describe(InputTensor(dv)), ptr(dlse_arg), causal,
            softmax_scale, deterministic);
        without_gil([&] { return waveboost::attention_backward(p, b, reinterpret_cast<void*>(stream)); });
      },
      nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dq"),
      nb::arg("dk"), nb::arg("dv"), nb::arg("dlse").none(), nb::arg("causal"), nb::arg("softmax_scale").none(),
      nb::arg("deterministic"), nb::arg("backend"), nb::arg("stream"),
      "Writes the gradients of attention(q, k, v) (whose output and float32 logsumexp were `out` "
      "and `lse`) with respect to q, k and v into dq, dk and dv, given dout (and dlse, the "
      "gradient flowing into lse, when given), on `stream` for CUDA tensors.");

  m.def(
      "resolve_backward_backend",
      [](InputTensor q, InputTensor k, InputTensor v, bool causal, const std::string& backend, bool deterministic) {
        const Backend b = backend_from_name(backend);
        // A representative call: can_implement reads shapes, strides, dtype and the device, and
        // only the alignment of the pointers, so the inputs stand in for the other tensors.
        waveboost::AttentionBackwardParams p;
        static_cast<AttentionParams&>(p) = waveboost::frontend::forward_params(describe(q), describe(k), describe(v),
                                                                               nullptr, nullptr, causal, std::nullopt);
        p.dout = p.q, p.dq = const_cast<void*>(p.q);
        p.dk = const_cast<void*>(p.k), p.dv = const_cast<void*>(p.v);
        p.lse = static_cast<float*>(const_cast<void*>(p.q));
        p.lse_head_stride = p.seqlen_q, p.lse_batch_stride = p.heads * p.seqlen_q;
        p.do_batch_stride = p.dq_batch_stride = p.q_batch_stride;
        p.do_row_stride = p.dq_row_stride = p.q_row_stride;
        p.do_head_stride = p.dq_head_stride = p.q_head_stride;
        p.dk_batch_stride = p.k_batch_stride, p.dk_row_stride = p.k_row_stride, p.dk_head_stride = p.k_head_stride;
        p.dv_batch_stride = p.v_batch_stride, p.dv_row_stride = p.v_row_stride, p.dv_head_stride = p.v_head_stride;
        p.deterministic = deterministic;
        return resolved_backend_name(p, b);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("backend") = "auto",
      nb::arg("deterministic") = false,
      "The backend a backward call with these tensors would run; raises ValueError with the reason if it cannot run.");

  m.def(
      "backend_has_backward",
      [](const std::string& backend) { return waveboost::backend_has_backward(backend_from_name(backend)); },
      nb::arg("backend"), "Whether `backend` has a backward pass (on some device, dtype and head dim).");

  m.def(
      "backend_names",
      [] {
        std::vector<std::string> names;
        for (Backend b : waveboost::kAllBackends) names.emplace_back(waveboost::backend_name(b));
        return names;
      },
      "Every backend name the C++ API takes, 'auto' first.");
  m.def(
      "capabilities",
      [](int device_id) {
        const auto dtype_names = [](const std::vector<waveboost::DType>& dtypes) {
          std::vector<std::string> names;
          for (waveboost::DType d : dtypes) names.emplace_back(waveboost::dtype_name(d));
          return names;
        };
        nb::list records;
        for (const waveboost::BackendCapabilities& c : waveboost::capabilities(device_id)) {
          nb::dict r;
          r["backend"] = waveboost::backend_name(c.backend);
          r["device"] = c.device_type == waveboost::DeviceType::kCUDA ? "cuda" : "cpu";
          r["available"] = c.available;
          r["reason"] = c.available ? nb::none() : nb::cast(c.reason);
          r["forward_dtypes"] = dtype_names(c.forward_dtypes);
          r["backward_dtypes"] = dtype_names(c.backward_dtypes);
          r["head_dims"] = c.head_dims;
          r["backward_head_dims"] = c.backward_head_dims;
          r["any_head_dim"] = c.any_head_dim;
          r["causal"] = c.causal;
          r["gqa"] = c.gqa;
          r["varlen"] = c.varlen;
          r["seqused"] = c.seqused;
          r["paged"] = c.paged;
          r["deterministic_backward"] = c.deterministic_backward;
          records.append(r);
        }
        return records;
      },
      nb::arg("device_id") = 0,
      "What each compiled backend can run (asked of its can_implement; CUDA backends on device_id).");
  m.def(
      "kernel_table",
      [] {
        nb::list rows;
        for (const waveboost::KernelInfo& k : waveboost::kernel_table()) {
          nb::dict r;
          r["name"] = k.name;
          r["backend"] = waveboost::backend_name(k.backend);
          r["pass"] = k.backward ? "backward" : "forward";
          r["variant"] = k.variant;
          r["dtype"] = waveboost::dtype_name(k.dtype);
          r["head_dim"] = k.head_dim;
          r["min_compute_capability"] = k.min_compute_capability;
          r["max_compute_capability"] = k.max_compute_capability > 0 ? nb::cast(k.max_compute_capability) : nb::none();
          r["vector_elements"] = k.vector_elements;
          r["smem_bytes"] = k.smem_bytes >= 0 ? nb::cast(k.smem_bytes) : nb::none();
          rows.append(r);
        }
        return rows;
      },
      "The compiled CUDA kernels: one record per row of the kernel registry (empty without CUDA).");
  m.def("probed_head_dims", [] {
    return std::vector<int64_t>(std::begin(waveboost::kProbedHeadDims), std::end(waveboost::kProbedHeadDims));
  });

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
        const Backend b = backend_from_name(backend);
        const std::optional<TensorArg> lse_arg = describe(lse), cu_q = describe(cu_seqlens_q),
                                       cu_k = describe(cu_seqlens_k), used = describe(seqused_k),
                                       table = describe(block_table);
        const AttentionParams p = waveboost::frontend::sequence_params(
            describe(q), describe(k), describe(v), describe(InputTensor(out)), ptr(lse_arg), ptr(cu_q), ptr(cu_k),
            ptr(used), ptr(table), max_seqlen_q, max_seqlen_k, causal, softmax_scale);
        const Backend chosen = b == Backend::kAuto ? waveboost::select_backend(waveboost::with_resolved_scale(p)) : b;
        raise_status(waveboost::can_implement(p, chosen));
        if (check_only) return std::string(waveboost::backend_name(chosen));
        without_gil([&] { return waveboost::attention_forward(p, chosen, reinterpret_cast<void*>(stream)); });
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
        const std::optional<TensorArg> lse_arg = describe(lse);
        const MergeStatesParams p =
            waveboost::frontend::merge_params(describe(outs), describe(lses), describe(InputTensor(out)), ptr(lse_arg));
        without_gil([&] { return waveboost::merge_attention_states(p, reinterpret_cast<void*>(stream)); });
      },
      nb::arg("outs"), nb::arg("lses"), nb::arg("out"), nb::arg("lse").none(), nb::arg("stream"),
      "Merges partial attention results over disjoint key sets: (num_parts, batch, seqlen, heads, head_dim) "
      "outputs and float32 (num_parts, batch, heads, seqlen) logsumexps into `out` (and `lse`).");

  m.def(
      "kv_cache_append",
      [](OutputTensor k_cache, OutputTensor v_cache, InputTensor k_new, InputTensor v_new, InputTensor cache_seqlens,
         std::optional<OutputTensor> seqused_out, std::optional<InputTensor> block_table, uintptr_t stream) {
        const std::optional<TensorArg> used = describe(seqused_out), table = describe(block_table);
        const KVCacheAppendParams p = waveboost::frontend::append_params(
            describe(InputTensor(k_cache)), describe(InputTensor(v_cache)), describe(k_new), describe(v_new),
            describe(cache_seqlens), ptr(used), ptr(table));
        without_gil([&] { return waveboost::kv_cache_append(p, reinterpret_cast<void*>(stream)); });
      },
      nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("k_new"), nb::arg("v_new"), nb::arg("cache_seqlens"),
      nb::arg("seqused_out").none(), nb::arg("block_table").none(), nb::arg("stream"),
      "Writes k_new/v_new into the cache at positions cache_seqlens[b] + i (contiguous or paged by block_table); "
      "seqused_out, when given, receives cache_seqlens + seqlen_new.");
}
