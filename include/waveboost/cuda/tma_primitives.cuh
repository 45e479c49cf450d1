// Hopper (sm_90a) asynchronous-copy and synchronization primitives in inline PTX: transaction
// barriers (mbarrier), the tensor memory accelerator (TMA, cp.async.bulk.tensor), named
// barriers and register reallocation between warpgroups (setmaxnreg). The vocabulary of the
// warp-specialized wgmma forward (flash_wgmma_ws.cuh) and of the decode kernel's TMA variant
// (decode.cuh). The device functions need sm_90 (setmaxnreg sm_90a): call them only from code
// compiled for it; the host functions exist only in builds with sm_90a objects (src/cuda/sm90/).
//
// A transaction barrier in shared memory counts arrivals and, separately, bytes: a phase
// completes when the expected number of threads has arrived and every byte announced with
// expect_tx has been written by the copies that signal it (complete_tx). Waiters name the
// parity of the phase they wait for; a freshly initialized barrier is in phase 0, and a wait
// for parity 1 returns at once (the phase "before" it counts as complete), which is how a
// producer starts on an empty ring without a special case.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "waveboost/attention.h"

namespace waveboost::cuda::tma {

// ---- Host: tensor maps (src/cuda/sm90/tma_host.cu) ----

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime's driver entry point, or null without one.
EncodeTiled encode_tiled();

// How much a box row's miss brings into L2: its own 128 B, or the aligned 256 B around it (the
// other half of a 128-column row, read by the next box of the same tile). 256 B unless a kernel
// measured otherwise (decode on an H200: benchmarks/NOTES.md, "Decode: L2 promotion of the TMA
// boxes").
enum class L2Promotion { k128B, k256B };

// The 4-D map (head_dim, rows, heads, batch) of a BSHD-strided fp16/bf16 tensor, boxes of 64
// columns x box_rows rows in the 128 B swizzle (the layout wgmma reads through descriptor_128b).
// The stride of an extent-1 dimension is never used: it is replaced by the span of the dimensions
// below it. false where TMA cannot describe the tensor (strides not positive 16 B multiples, a
// base not 16 B aligned, extents past 2^31).
bool encode_rows_map(CUtensorMap* map, const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads,
                     int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                     L2Promotion promotion = L2Promotion::k256B);

// Whether encode_rows_map can describe such a tensor: its checks, without asking the driver (which
// needs a current context), for can_implement.
bool rows_map_fits(const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                   int64_t row_stride, int64_t head_stride, int64_t batch_stride);

// The rows maps of a call's K and V (p.dtype), boxes of 64 columns x box_rows keys: (head_dim,
// seqlen_k, heads_kv, batch), with cu_seqlens_k the packed (head_dim, total_k, heads_kv, 1), paged
// (head_dim, page_size, heads_kv, num_pages); false where TMA cannot describe either.
// kv_maps_fit: the same checks without the driver.
bool encode_kv_maps(const AttentionParams& p, int box_rows, CUtensorMap* k_map, CUtensorMap* v_map,
                    L2Promotion promotion = L2Promotion::k256B);
bool kv_maps_fit(const AttentionParams& p);

// ---- Device ----

__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Ends a barrier's use, so that its memory may be reused for anything else.
__device__ __forceinline__ void barrier_inval(uint32_t bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Makes barrier initializations visible to the async proxy (TMA signals them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` to be written by copies signalling this barrier.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Loads the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map into shared memory at
// `dst` (the box's bytes, 128 B-swizzled if the map says so; elements outside the tensor are
// zero) and signals `bar` with the box's byte count.
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Brings a tensor map (a kernel parameter) into the descriptor cache ahead of its first use.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Programmatic dependent launch (sm_90): a grid launched with the programmatic stream
// serialization attribute may start before the kernel ahead of it in the stream has finished;
// grid_dependency_wait returns once that kernel has completed and its writes are visible (at once
// for a grid launched without the attribute). Nothing before it may read what the kernel ahead
// writes, or write what it reads. launch_dependents lets the grid behind this one start early.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- Thread block clusters (sm_90) ----

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every block of the cluster: this block's shared-memory writes before it are
// visible to the cluster's blocks after it (release / acquire). All threads of each warp take part.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// The shared::cluster address of this block's shared address `addr` in the block of rank `rank`.
__device__ __forceinline__ uint32_t cluster_address(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

__device__ __forceinline__ float cluster_load(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 cluster_load4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Barrier `id` (1..15; 0 is __syncthreads') among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrival at barrier `id` without waiting (the producer side of a named barrier whose
// consumers bar.sync with the same `threads`).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Loads `bytes` (a multiple of 16; both addresses 16 B aligned) from global memory to shared
// memory at `dst` with one bulk copy that signals `bar` with its byte count.
__device__ __forceinline__ void load_bulk(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Adds `bytes` (a multiple of 16; both addresses 16 B aligned) of fp32 values in shared memory
// at `src` to global memory at `dst`, element by element, as one bulk reduction of this
// thread's current bulk group.
__device__ __forceinline__ void reduce_add_bulk_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

// Adds the box at coordinates (c0, c1) of a 2-D fp32 tensor map, read from shared memory at
// `src` (in the map's swizzle), to global memory element by element, as one bulk reduction of
// this thread's current bulk group.
__device__ __forceinline__ void reduce_add_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}

// Closes this thread's current bulk group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's bulk groups still read their shared-memory
// sources (the sources may then be overwritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until at most kPending of this thread's bulk groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Orders this thread's generic-proxy accesses of global memory against its async-proxy ones (bulk
// copies and reductions) on either side of it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Register reallocation between warpgroups: every warp of the warpgroup executes it.
template <int kRegisters>
__device__ __forceinline__ void registers_grow() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_shrink() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace waveboost::cuda::tma
