// Warp-level tensor-core and copy primitives for sm_80+ in inline PTX: the
// vocabulary of the mma.sync flash kernel (flash_mma.cuh).
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
// with g = lane / 4 (the group) and t = lane % 4 (the thread in the group):
//   A (16 x 16, row-major), four b32 registers of two 16-bit elements each:
//     a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col": element pairs run along k), two b32 registers:
//     b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32), four floats:
//     c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// So the accumulators of two adjacent n8 tiles, packed in pairs to 16 bits, are exactly the
// A operand of a k16 slice: scores become the probabilities of the next product in registers.
//
// Everything here needs sm_80 (cp.async, bf16 mma); callers compile it only for such targets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace waveboost::cuda::mma {

__device__ __forceinline__ uint32_t shared_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ----------------------------------------------------------------------------
// Asynchronous global -> shared copies
// ----------------------------------------------------------------------------

// 16 B copy that bypasses L1 (.cg: K/V tiles are reused through L2 by other blocks, not
// by this SM's L1). With valid == false the source is not read and the 16 B are zero-filled.
__device__ __forceinline__ void copy_async_16B(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ----------------------------------------------------------------------------
// Shared memory -> fragments
// ----------------------------------------------------------------------------

// Four 8 x 8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i, and
// register i receives matrix i with lane holding row lane / 4, columns 2 (lane % 4) + {0, 1}.
__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// As load_matrix_x4, transposed: lane receives column lane / 4, rows 2 (lane % 4) + {0, 1}.
// Reads a row-major [k][n] tile as the "col" B operand.
__device__ __forceinline__ void load_matrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ----------------------------------------------------------------------------
// Tensor-core product
// ----------------------------------------------------------------------------

// d += A (16 x 16) * B (16 x 8), fp32 accumulation.
template <typename Element>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Element, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Element, __nv_bfloat16>, "mma_16x8x16 takes __half or __nv_bfloat16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ----------------------------------------------------------------------------
// Element math
// ----------------------------------------------------------------------------

// Two floats rounded to the element type, `lo` in the low 16 bits (the lower column index).
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  }
  return bits;
}

// 2^x on the special-function unit; exp2(-inf) = +0.
__device__ __forceinline__ float exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace waveboost::cuda::mma
