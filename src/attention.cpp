// The C++ API: generic validation, backend selection and dispatch to the paths.
#include "waveboost/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/cpu_attention.h"
#ifdef WAVEBOOST_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_paths.h"
#include "cuda/kernel_registry.h"
#endif

namespace waveboost {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

bool is_cuda_backend(Backend b) {
  return b == Backend::kNaive || b == Backend::kSimt || b == Backend::kWmma || b == Backend::kMma ||
         b == Backend::kWgmma || b == Backend::kDecode;
}

// The backends that read the sequence-layout fields (varlen, seqused, paged); every other one
// refuses params that set them.
bool handles_sequence_layout(Backend b) {
  return b == Backend::kCPU || b == Backend::kDecode || b == Backend::kMma || b == Backend::kWgmma;
}

Status check_nonnegative(int64_t value, const char* name) {
  if (value < 0) return Status::InvalidArgument(std::string(name) + " must be >= 0; got " + str(value));
  return Status::Ok();
}

}  // namespace

const char* version() { return WAVEBOOST_VERSION; }

bool cuda_compiled() {
#ifdef WAVEBOOST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

const char* cuda_architectures() {
#ifdef WAVEBOOST_WITH_CUDA
  return WAVEBOOST_CUDA_ARCHS;
#else
  return "";
#endif
}

int cuda_device_count() {
#ifdef WAVEBOOST_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: not an error for the caller
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string cuda_device_description(int device) {
#ifdef WAVEBOOST_WITH_CUDA
  if (device < 0 || device >= cuda_device_count()) return "";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." +
         std::to_string(prop.minor);
#else
  (void)device;
  return "";
#endif
}

bool backend_available(Backend backend, int device_id) {
  if (backend == Backend::kAuto || backend == Backend::kCPU) return true;
  if (!is_cuda_backend(backend) || device_id < 0 || device_id >= cuda_device_count()) return false;
  // A representative call: can_implement reads only shapes, strides, dtype and the
  // device, never the (aligned, dummy) pointers.
  alignas(16) static const char dummy[16] = {};
  AttentionParams p;
  p.q = p.k = p.v = dummy;
  p.out = const_cast<char*>(dummy);
  p.batch = p.seqlen_q = p.seqlen_k = p.heads = p.heads_kv = 1;
  p.head_dim = 64;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 64;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = 64;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 64;
  p.softmax_scale = 0.125;
  p.device_type = DeviceType::kCUDA;
  p.device_id = device_id;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    p.dtype = dtype;
    if (can_implement(p, backend).ok()) return true;
  }
  return false;
}

Status stream_synchronize(int device_id, void* stream) {
#ifdef WAVEBOOST_WITH_CUDA
  int previous = -1;
  cudaGetDevice(&previous);
  cudaError_t err = cudaSetDevice(device_id);
  if (err == cudaSuccess) err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (previous >= 0) cudaSetDevice(previous);
  if (err != cudaSuccess)
    return Status::CudaError(std::string("cudaStreamSynchronize: ") + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  return Status::Ok();
#else
  (void)device_id;
  (void)stream;
  return Status::NotSupported("stream_synchronize needs CUDA, but this build of waveboost has no CUDA support");
#endif
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kCPU: return "cpu";
    case Backend::kNaive: return "naive";
    case Backend::kSimt: return "simt";
    case Backend::kWmma: return "wmma";
    case Backend::kMma: return "mma";
    case Backend::kWgmma: return "wgmma";
    case Backend::kDecode: return "decode";
  }
  return "unknown";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
  }
  return "unknown";
}

bool parse_backend(const std::string& name, Backend* backend) {
  for (Backend b : kAllBackends) {
    if (name == backend_name(b)) {
      *backend = b;
      return true;
    }
  }
  return false;
}

Status validate(const AttentionParams& p) {
  for (auto [value, name] : {std::pair{p.batch, "batch"}, {p.seqlen_q, "seqlen_q"}, {p.seqlen_k, "seqlen_k"},
                             {p.heads, "heads"}, {p.heads_kv, "heads_kv"}, {p.head_dim, "head_dim"}}) {
    if (Status s = check_nonnegative(value, name); !s.ok()) return s;
  }
  if (p.head_dim < 1) return Status::InvalidArgument("head_dim must be >= 1; got " + str(p.head_dim));
  if (p.heads_kv == 0 && p.heads > 0)
    return Status::InvalidArgument("heads_kv must be >= 1 when heads > 0; got 0");
  if (p.heads_kv > 0 && p.heads % p.heads_kv != 0)
    return Status::InvalidArgument("heads (" + str(p.heads) + ") must be a multiple of heads_kv (" + str(p.heads_kv) +
                                   ") for grouped-query attention");
  // NaN is kDefaultSoftmaxScale (1 / sqrt(head_dim)); infinities are refused.
  if (std::isinf(p.softmax_scale))
    return Status::InvalidArgument("softmax_scale must be a finite number (or kDefaultSoftmaxScale); got " +
                                   std::string(p.softmax_scale > 0 ? "inf" : "-inf"));
  const bool any_output = p.batch > 0 && p.seqlen_q > 0 && p.heads > 0;
  const bool reads_kv = any_output && p.seqlen_k > 0;
  if (any_output && p.q == nullptr) return Status::InvalidArgument("q is a null pointer");
  if (any_output && p.out == nullptr) return Status::InvalidArgument("out is a null pointer");
  if (reads_kv && (p.k == nullptr || p.v == nullptr)) return Status::InvalidArgument("k or v is a null pointer");
  if (p.device_type != DeviceType::kCPU && p.device_type != DeviceType::kCUDA)
    return Status::InvalidArgument("device_type must be kCPU or kCUDA");
  switch (p.dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      break;
    case DType::kFloat8E4M3:
      if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16)
        return Status::InvalidArgument(std::string("out_dtype must be bfloat16 or float16 with float8_e4m3fn inputs; "
                                                   "got ") + dtype_name(p.out_dtype));
      break;
    default:
      return Status::InvalidArgument("dtype is not one of float16, bfloat16, float32, float64, float8_e4m3fn");
  }
  if (p.is_paged()) {
    if (p.page_size < 1) return Status::InvalidArgument("page_size must be >= 1 with a block_table; got " + str(p.page_size));
    if (p.num_pages < 1) return Status::InvalidArgument("num_pages must be >= 1 with a block_table; got " + str(p.num_pages));
    if (p.is_varlen_k())
      return Status::InvalidArgument("cu_seqlens_k and block_table are exclusive: a paged cache gives each sequence's "
                                     "keys by its block_table row and seqused_k");
  }
  // Strides. Each (row, head) holds head_dim contiguous elements, so the stride of a dimension of
  // extent > 1 is either 0 (a broadcast, fine to read) or at least head_dim in magnitude; anything
  // in between makes neighbouring rows or heads share elements, which no framework's tensor does
  // (e.g. q_row_stride = 1 from a mistyped layout). The output must not overlap itself at all.
  const auto check_strides = [&](const char* tensor, const int64_t (&strides)[3], const int64_t (&extents)[3],
                                 bool is_output) -> Status {
    static const char* const kDims[3] = {"batch", "row", "head"};
    static const char* const kPlural[3] = {"batches", "rows", "heads"};
    std::vector<std::pair<int64_t, int64_t>> sorted;  // (|stride|, extent) of dimensions of extent > 1
    for (int d = 0; d < 3; ++d) {
      if (extents[d] <= 1) continue;
      const int64_t magnitude = strides[d] < 0 ? -strides[d] : strides[d];
      if ((magnitude != 0 || is_output) && magnitude < p.head_dim)
        return Status::InvalidArgument(std::string(tensor) + "_" + kDims[d] + "_stride is " + str(strides[d]) +
                                       " but head_dim is " + str(p.head_dim) + ": neighbouring " + kPlural[d] +
                                       " would share elements (the stride of a dimension of extent > 1 must be " +
                                       (is_output ? "" : "0 or ") + "at least head_dim in magnitude)");
      sorted.emplace_back(magnitude, extents[d]);
    }
    if (!is_output) return Status::Ok();
    std::sort(sorted.begin(), sorted.end());
    int64_t span = p.head_dim - 1;  // elements spanned by the smaller-stride dimensions so far
    for (auto [magnitude, extent] : sorted) {
      if (magnitude <= span)
        return Status::InvalidArgument("out strides (o_batch_stride " + str(strides[0]) + ", o_row_stride " +
                                       str(strides[1]) + ", o_head_stride " + str(strides[2]) +
                                       ") make distinct elements share memory; the output must not overlap itself");
      span += magnitude * (extent - 1);
    }
    return Status::Ok();
  };
  if (any_output) {
    // Varlen q and out pack sequences along rows (batch stride unused); paged k and v step pages.
    const int64_t q_batches = p.is_varlen_q() ? 1 : p.batch;
    const int64_t kv_batches = p.is_paged() ? p.num_pages : (p.is_varlen_k() ? 1 : p.batch);
    const int64_t kv_rows = p.is_paged() ? p.page_size : p.seqlen_k;
    const int64_t q_extents[3] = {q_batches, p.seqlen_q, p.heads};
    const int64_t kv_extents[3] = {kv_batches, kv_rows, p.heads_kv};
    if (Status s = check_strides("q", {p.q_batch_stride, p.q_row_stride, p.q_head_stride}, q_extents, false); !s.ok())
      return s;
    if (reads_kv) {
      if (Status s = check_strides("k", {p.k_batch_stride, p.k_row_stride, p.k_head_stride}, kv_extents, false);
          !s.ok())
        return s;
      if (Status s = check_strides("v", {p.v_batch_stride, p.v_row_stride, p.v_head_stride}, kv_extents, false);
          !s.ok())
        return s;
    }
    if (Status s = check_strides("o", {p.o_batch_stride, p.o_row_stride, p.o_head_stride}, q_extents, true); !s.ok())
      return s;
  }
  return Status::Ok();
}

AttentionParams with_resolved_scale(const AttentionParams& params) {
  AttentionParams p = params;
  if (std::isnan(p.softmax_scale) && p.head_dim > 0) p.softmax_scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  return p;
}

AttentionBackwardParams with_resolved_scale(const AttentionBackwardParams& params) {
  AttentionBackwardParams p = params;
  static_cast<AttentionParams&>(p) = with_resolved_scale(static_cast<const AttentionParams&>(params));
  return p;
}

namespace {
// Whether the wgmma path's grid (one block per kWgmmaBlockM query rows of each batch and head)
// has at most one block per multiprocessor of the device.
bool fits_one_wave(const AttentionParams& p) {
#ifdef WAVEBOOST_WITH_CUDA
  int sms = 0;
  if (!cuda::multiprocessor_count(p.device_id, &sms).ok()) return false;
  const int64_t blocks = p.batch * p.heads * ((p.seqlen_q + cuda::kWgmmaBlockM - 1) / cuda::kWgmmaBlockM);
  return blocks <= sms;
#else
  (void)p;
  return false;
#endif
}
}  // namespace

Backend select_backend(const AttentionParams& p) {
  if (p.device_type == DeviceType::kCPU) return Backend::kCPU;
  // e4m3 inputs have one kernel, wgmma's (whose can_implement says why where it cannot run).
  if (p.is_fp8()) return Backend::kWgmma;
  // Calls with few query rows per kv head (decode, speculative verify) go to decode: it packs
  // the rows of a kv head's query heads into one tile and reads each K/V byte once per kv head,
  // where the flash paths give every query head a 128-row tile of its own and read the keys once
  // per query head. With a sequence layout (varlen, seqused, paged) seqlen_q is the longest
  // sequence's length (max_seqlen_q). Up to 16 queries (speculative verify) go there whatever the
  // group: decode reads a kv head's keys once per 64-row tile, ceil(16 x group / 64) times, where the
  // flash paths read them once per query head, group times (benchmarks/NOTES.md, "Speculative verify
  // with large groups").
  if (p.heads_kv > 0 && (p.seqlen_q * (p.heads / p.heads_kv) <= 64 || p.seqlen_q <= 16) &&
      can_implement(p, Backend::kDecode).ok())
    return Backend::kDecode;
  // Sequence layouts with longer queries (prefill, chunked prefill on a paged cache) run on the
  // tensor-core flash paths: wgmma, whose TMA kernel takes contiguous sequence layouts (0.85x
  // mma's time at head dim 64, 0.66x at 128 on an H100,
  // benchmarks/results/nvidia-h100-80gb-hbm3-20261125/varlen-tma/), except packed K/V of unknown
  // extent (total_k unset: a C++ caller) at head dim 64, where its cp.async kernel trails mma's
  // (results/*-20261123/varlen/). What they refuse goes to decode (whose can_implement then says
  // why, if it cannot either).
  if (!p.is_dense()) {
    const bool wgmma_wins = p.head_dim == 128 || p.is_paged() || !p.is_varlen_k() || p.total_k > 0;
    if (p.dtype != DType::kFloat32 && wgmma_wins && can_implement(p, Backend::kWgmma).ok()) return Backend::kWgmma;
    if (can_implement(p, Backend::kMma).ok()) return Backend::kMma;
    return Backend::kDecode;
  }
  // On CUDA at the specialized head dims: mma (tensor cores; fp32 through 3xTF32) is ahead of
  // SDPA's FlashAttention-2 in fp16/bf16 and of SDPA's efficient kernel in fp32 on an H100
  // (benchmarks/results/*/fa2-*/summary.md), but needs sm_80+ and aligned data. What it
  // refuses goes to wmma (fp16/bf16) or simt (any dtype); the naive path covers every
  // other head dim.
  const bool specialized = p.head_dim == 64 || p.head_dim == 128;
  // Hopper: wgmma leads at head dim 128, and at head dim 64 from 256 keys (its TMA pipeline, with
  // blocks of 64 query rows two per SM under 2048 rows: 1.10-1.23x mma at 512-1024 keys on an H100 and an H200,
  // results/nvidia-h200-20261127/wgmma-d64-rows64/; with the persistent kernel for non-causal calls, H100
  // at 256 keys 1.15-1.17x non-causal, 1.02x causal, results/nvidia-h100-80gb-hbm3-20261128/persistent-rule/);
  // below 256 keys mma stays (not measured since). On a grid of at most one block per SM wgmma leads at
  // any seqlen, and where that grid leaves most SMs idle it splits the keys (split-KV) to fill
  // them. Measured: benchmarks/results/*/fa2-*/summary.md and .../small-grids/.
  const bool wgmma_wins = p.head_dim == 128 || p.seqlen_k >= 256 || fits_one_wave(p);
  if (specialized && p.dtype != DType::kFloat32 && wgmma_wins && can_implement(p, Backend::kWgmma).ok())
    return Backend::kWgmma;
  if (specialized && can_implement(p, Backend::kMma).ok()) return Backend::kMma;
  if (specialized && p.dtype != DType::kFloat32 && can_implement(p, Backend::kWmma).ok()) return Backend::kWmma;
  if (specialized && can_implement(p, Backend::kSimt).ok()) return Backend::kSimt;
  return Backend::kNaive;
}

Status can_implement(const AttentionParams& params, Backend backend) {
  if (Status s = validate(params); !s.ok()) return s;
  const AttentionParams p = with_resolved_scale(params);
  if (backend == Backend::kAuto) backend = select_backend(p);
  if (!p.is_dense() && !handles_sequence_layout(backend))
    return Status::NotSupported(std::string("backend '") + backend_name(backend) +
                                "' runs dense batches only; varlen (cu_seqlens), seqused_k and paged (block_table) "
                                "inputs need another backend");
  if (backend == Backend::kCPU) {
    if (p.device_type != DeviceType::kCPU)
      return Status::InvalidArgument("backend 'cpu' needs tensors in host memory; got CUDA tensors");
    return cpu::can_implement(p);
  }
  if (!is_cuda_backend(backend)) return Status::InvalidArgument("unknown backend");
  if (p.device_type != DeviceType::kCUDA)
    return Status::InvalidArgument(std::string("backend '") + backend_name(backend) +
                                   "' runs on CUDA tensors; got tensors in host memory (use backend 'cpu' or 'auto')");
#ifdef WAVEBOOST_WITH_CUDA
  switch (backend) {
    case Backend::kNaive: return cuda::naive_can_implement(p);
    case Backend::kSimt: return cuda::simt_can_implement(p);
    case Backend::kWmma: return cuda::wmma_can_implement(p);
    case Backend::kMma: return cuda::mma_can_implement(p);
    case Backend::kWgmma: return cuda::wgmma_can_implement(p);
    case Backend::kDecode: return cuda::decode_can_implement(p);
    default: break;
  }
  return Status::Internal("unreachable backend in can_implement");
#else
  return Status::NotSupported(std::string("backend '") + backend_name(backend) +
                              "' needs CUDA, but this build of waveboost has no CUDA support "
                              "(it was built without nvcc)");
#endif
}

namespace {
// What a forward call runs: the params with softmax_scale resolved and the backend kAuto resolves
// to, once both pass validate and can_implement.
Status resolve_forward(const AttentionParams& params, Backend* backend, AttentionParams* p) {
  if (Status s = validate(params); !s.ok()) return s;
  *p = with_resolved_scale(params);
  if (*backend == Backend::kAuto) *backend = select_backend(*p);
  return can_implement(*p, *backend);
}
}  // namespace

Status attention_forward(const AttentionParams& params, Backend backend, void* stream) {
  AttentionParams p;
  if (Status s = resolve_forward(params, &backend, &p); !s.ok()) return s;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads == 0) return Status::Ok();
  switch (backend) {
    case Backend::kCPU: return cpu::attention_forward(p);
#ifdef WAVEBOOST_WITH_CUDA
    case Backend::kNaive: return cuda::naive_forward(p, stream);
    case Backend::kSimt: return cuda::simt_forward(p, stream);
    case Backend::kWmma: return cuda::wmma_forward(p, stream);
    case Backend::kMma: return cuda::mma_forward(p, stream);
    case Backend::kWgmma: return cuda::wgmma_forward(p, stream);
    case Backend::kDecode: return cuda::decode_forward(p, stream);
#endif
    default: break;
  }
  (void)stream;
  return Status::Internal(std::string("no dispatch for backend '") + backend_name(backend) + "'");
}

Status plan_forward(const AttentionParams& params, Backend backend, ForwardPlan* plan) {
  AttentionParams p;
  if (Status s = resolve_forward(params, &backend, &p); !s.ok()) return s;
  plan->backend = backend;
  plan->kernel = backend_name(backend);
  plan->num_splits = 1;
#ifdef WAVEBOOST_WITH_CUDA
  if (is_cuda_backend(backend)) return cuda::plan_forward(p, backend, plan);
#endif
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

bool backend_has_backward(Backend backend) {
  return backend == Backend::kAuto || backend == Backend::kCPU || backend == Backend::kNaive ||
         backend == Backend::kMma || backend == Backend::kWgmma;
}

Status validate(const AttentionBackwardParams& p) {
  if (Status s = validate(static_cast<const AttentionParams&>(p)); !s.ok()) return s;
  const bool any_output = p.batch > 0 && p.seqlen_q > 0 && p.heads > 0;
  const bool any_key = p.batch > 0 && p.seqlen_k > 0 && p.heads_kv > 0;
  if (any_output && (p.dout == nullptr || p.dq == nullptr))
    return Status::InvalidArgument("dout and dq must not be null pointers");
  if (any_key && (p.dk == nullptr || p.dv == nullptr))
    return Status::InvalidArgument("dk and dv must not be null pointers");
  if (any_output && p.lse == nullptr)
    return Status::InvalidArgument("lse (the forward's float32 logsumexp) is required by the backward pass");
  if (!p.is_dense())
    return Status::NotSupported("the backward pass runs dense batches only (no varlen, seqused_k or paged inputs)");
  return Status::Ok();
}

Backend select_backend(const AttentionBackwardParams& p) {
  if (p.device_type == DeviceType::kCPU) return Backend::kCPU;
  // Hopper: the wgmma backward (its TMA kernel) is faster than mma's in every cell measured
  // (benchmarks/results/*-20261123/backward-wgmma-v2/ and peers-same-run/), deterministic=True
  // included (its writer warp takes the turns); where TMA cannot describe the inputs it refuses
  // deterministic=True and mma runs it.
  if (can_implement(p, Backend::kWgmma).ok()) return Backend::kWgmma;
  if (can_implement(p, Backend::kMma).ok()) return Backend::kMma;
  return Backend::kNaive;
}

Status can_implement(const AttentionBackwardParams& params, Backend backend) {
  if (Status s = validate(params); !s.ok()) return s;
  const AttentionBackwardParams p = with_resolved_scale(params);
  if (backend == Backend::kAuto) backend = select_backend(p);
  if (!backend_has_backward(backend))
    return Status::NotSupported(std::string("backend '") + backend_name(backend) +
                                "' is forward-only; the backward pass runs on 'cpu', 'naive', 'mma' and 'wgmma' (or 'auto')");
  if (backend == Backend::kCPU) {
    if (p.device_type != DeviceType::kCPU)
      return Status::InvalidArgument("backend 'cpu' needs tensors in host memory; got CUDA tensors");
    return cpu::can_implement_backward(p);
  }
  if (p.device_type != DeviceType::kCUDA)
    return Status::InvalidArgument(std::string("backend '") + backend_name(backend) +
                                   "' runs on CUDA tensors; got tensors in host memory (use backend 'cpu' or 'auto')");
#ifdef WAVEBOOST_WITH_CUDA
  switch (backend) {
    case Backend::kNaive: return cuda::naive_can_implement_backward(p);
    case Backend::kMma: return cuda::mma_can_implement_backward(p);
    case Backend::kWgmma: return cuda::wgmma_can_implement_backward(p);
    default: break;
  }
  return Status::Internal("unreachable backend in can_implement (backward)");
#else
  return Status::NotSupported(std::string("backend '") + backend_name(backend) +
                              "' needs CUDA, but this build of waveboost has no CUDA support "
                              "(it was built without nvcc)");
#endif
}

Status attention_backward(const AttentionBackwardParams& params, Backend backend, void* stream) {
  if (Status s = validate(params); !s.ok()) return s;
  const AttentionBackwardParams p = with_resolved_scale(params);
  if (backend == Backend::kAuto) backend = select_backend(p);
  if (Status s = can_implement(p, backend); !s.ok()) return s;
  if (p.batch == 0 || p.heads == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return Status::Ok();
  switch (backend) {
    case Backend::kCPU: return cpu::attention_backward(p);
#ifdef WAVEBOOST_WITH_CUDA
    case Backend::kNaive: return cuda::naive_backward(p, stream);
    case Backend::kMma: return cuda::mma_backward(p, stream);
    case Backend::kWgmma: return cuda::wgmma_backward(p, stream);
#endif
    default: break;
  }
  (void)stream;
  return Status::Internal(std::string("no backward dispatch for backend '") + backend_name(backend) + "'");
}

std::vector<KernelInfo> kernel_table() {
#ifdef WAVEBOOST_WITH_CUDA
  return cuda::kernel_infos();
#else
  return {};
#endif
}

// ---------------------------------------------------------------------------
// Serving pieces
// ---------------------------------------------------------------------------

Status merge_attention_states(const MergeStatesParams& p, void* stream) {
  if (p.device_type == DeviceType::kCPU) return cpu::merge_attention_states(p);
#ifdef WAVEBOOST_WITH_CUDA
  if (p.device_type == DeviceType::kCUDA) return cuda::merge_attention_states(p, stream);
#endif
  (void)stream;
  return Status::NotSupported("merge_attention_states: CUDA tensors need a build of waveboost with CUDA support");
}

Status kv_cache_append(const KVCacheAppendParams& p, void* stream) {
  if (p.device_type == DeviceType::kCPU) return cpu::kv_cache_append(p);
#ifdef WAVEBOOST_WITH_CUDA
  if (p.device_type == DeviceType::kCUDA) return cuda::kv_cache_append(p, stream);
#endif
  (void)stream;
  return Status::NotSupported("kv_cache_append: CUDA tensors need a build of waveboost with CUDA support");
}

}  // namespace waveboost
