// Backend "wgmma": can_implement, split-KV and launch of the Hopper flash forward, through the
// kernel registry.
//
// Compiled for every architecture of the build, so it holds no kernel template: the kernels
// live in src/cuda/sm90/generated/ (compiled for sm_90a only, and only when 90 is among
// CMAKE_CUDA_ARCHITECTURES, which then defines WAVEBOOST_WITH_SM90A here).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_paths.h"
#include "kernel_registry.h"
#include "workspace.h"
#include "waveboost/cuda/common.cuh"

namespace waveboost::cuda {

#ifdef WAVEBOOST_WITH_SM90A

Status wgmma_can_implement(const AttentionParams& p) {
  // The general kernel's requirements (the TMA kernel's are the same, or it declines at launch).
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kWgmma, &kernel); !s.ok()) return s;
  if (Status s = flash_sequence_layout_check(p, "wgmma", 1); !s.ok()) return s;
  // e4m3 inputs have one kernel, the TMA one: K and V must be tensors TMA can describe.
  if (p.is_fp8() && p.seqlen_k > 0 && !wgmma_tma_fits(p)) {
    return Status::NotSupported(
        "backend 'wgmma' reads float8_e4m3fn k and v through TMA: their batch, row and head strides must be positive "
        "multiples of 16 bytes and their data 16-byte aligned");
  }
  // kWgmmaBlockM = FlashWgmmaTraits::kBlockM of every instantiation (that header compiles for
  // sm_90a only); the launcher repeats this check with the traits' own value.
  return folded_grid_check(p, kWgmmaBlockM, "wgmma");
}

namespace {
// How unsplit blocks load K and V: by default a producer warpgroup issues TMA into an
// mbarrier ring (the kernel table's "tma" variant, flash_wgmma_ws.cuh; benchmarks/NOTES.md has
// its measurements); WAVEBOOST_WGMMA_PIPELINE=cp.async selects the kernel where every thread
// copies and the block meets one barrier per tile (flash_wgmma.cuh), which also runs split-KV
// and whatever TMA cannot describe. Read once per process.
bool use_tma_pipeline() {
  static const bool tma = [] {
    const char* v = std::getenv("WAVEBOOST_WGMMA_PIPELINE");
    return v == nullptr || std::strcmp(v, "cp.async") != 0;
  }();
  return tma;
}

Status launch(const AttentionParams& p, const SplitKV& split, cudaStream_t s) {
  ForwardLaunch launch;
  launch.stream = s;
  launch.split = &split;
  if (split.num_splits == 1 && use_tma_pipeline()) {
    const Status ws = run_forward(Backend::kWgmma, "tma", p, launch);
    if (ws.code() != StatusCode::kNotSupported) return ws;
  }
  return run_forward(Backend::kWgmma, "", p, launch);
}
}  // namespace

namespace {
// The split-KV pieces of a call (split_kv_pieces over the wgmma grid). Sequence layouts (varlen,
// seqused_k, paged) run unsplit: the pieces and their merge are laid out for dense batches; so do
// e4m3 inputs (their TMA kernel runs whole rows).
Status wgmma_split(const AttentionParams& p, SplitKV* split) {
  int multiprocessors = 0;
  if (Status st = multiprocessor_count(p.device_id, &multiprocessors); !st.ok()) return st;
  *split = p.is_dense() && !p.is_fp8() ? split_kv_pieces(p.batch * p.heads * ((p.seqlen_q + kWgmmaBlockM - 1) / kWgmmaBlockM),
                                          (p.seqlen_k + kWgmmaBlockN - 1) / kWgmmaBlockN, multiprocessors)
                        : SplitKV{};
  return Status::Ok();
}
}  // namespace

Status wgmma_plan(const AttentionParams& p, ForwardPlan* plan) {
  SplitKV split;
  if (Status st = wgmma_split(p, &split); !st.ok()) return st;
  plan->num_splits = split.num_splits;
  plan->merge = split.num_splits > 1 ? "combine-kernel" : "";
  // launch() tries the TMA kernel under the same conditions, and it declines exactly where
  // wgmma_tma_applies is false.
  // (e4m3's one kernel is the table's general row for its dtype: no "tma" variant.)
  const bool tma = !p.is_fp8() && split.num_splits == 1 && use_tma_pipeline() && wgmma_tma_applies(p);
  plan->persistent = tma && wgmma_tma_persistent(p);
  return plan_kernel(Backend::kWgmma, tma ? "tma" : "", p, plan);
}

Status wgmma_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  SplitKV split;
  if (Status st = wgmma_split(p, &split); !st.ok()) return st;
  if (split.num_splits == 1) return launch(p, split, s);

  // The pieces: num_splits x blocks <= SMs, so at most kWgmmaBlockM x SMs rows of head_dim + 1 floats
  // (8.7 MB on an H100 at head dim 128), which the workspace pool keeps between calls.
  const size_t floats = static_cast<size_t>(split.num_splits * p.batch * p.heads * p.seqlen_q);
  PoolWorkspace workspace(p.device_id, floats * (p.head_dim + 1) * sizeof(float), s, "wgmma split-KV workspace");
  if (!workspace.status().ok()) return workspace.status();
  split.o_accum = static_cast<float*>(workspace.get());
  split.lse_accum = split.o_accum + floats * p.head_dim;
  const Status status = launch(p, split, s);
  const Status freed = workspace.release();
  return status.ok() ? freed : status;
}

#else  // no sm_90a objects in this build

namespace {
Status not_built() {
  return Status::NotSupported(
      "backend 'wgmma' needs a build that targets sm_90 (CMAKE_CUDA_ARCHITECTURES including 90)");
}
}  // namespace

Status wgmma_can_implement(const AttentionParams&) { return not_built(); }

Status wgmma_forward(const AttentionParams&, void*) { return not_built(); }

Status wgmma_plan(const AttentionParams&, ForwardPlan*) { return not_built(); }

#endif  // WAVEBOOST_WITH_SM90A

}  // namespace waveboost::cuda
