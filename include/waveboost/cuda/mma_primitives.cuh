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
// mma.sync.m16n8k8 with .tf32 inputs ("Matrix Fragments for mma.m16n8k8"), one 32-bit element
// per register:
//   A (16 x 8):  a0 = A[g][t]   a1 = A[g+8][t]   a2 = A[g][t+4]   a3 = A[g+8][t+4]
//   B (8 x 8):   b0 = B[t][g]   b1 = B[t+4][g]
//   C, D (16 x 8, fp32): as for m16n8k16.
// Here a C tile's columns 2t, 2t+1 are not A's columns t, t+4: flash_mma_tf32.cuh renumbers
// the keys instead of moving data (see there).
//
// Everything here needs sm_80 (cp.async, bf16 and tf32 mma); callers compile it only for such targets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "waveboost/cuda/core/constants.cuh"

namespace waveboost::cuda::mma {

__device__ __forceinline__ uint32_t shared_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Offset, in units of kUnit bytes, of 16 B chunk `chunk` of row `row` in a tile of kRows rows in the
// 128 B swizzle: panels of kRows rows of 128 B (chunk / 8 picks the panel), the chunk XOR-swizzled
// by the row within its 8-row atom. The layout a wgmma 128 B-swizzle descriptor reads and a TMA box
// of 128 B rows writes with the 128 B swizzle.
template <int kRows, int kUnit = 1>
__device__ __forceinline__ uint32_t swizzle_128b_offset(int row, int chunk) {
  static_assert(kUnit == 1 || kUnit == 2 || kUnit == 4, "bytes or elements");
  return static_cast<uint32_t>((chunk / 8) * kRows * (128 / kUnit) + row * (128 / kUnit) +
                               ((chunk % 8) ^ (row & 7)) * (16 / kUnit));
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

// Fragments -> shared memory (sm_90): the inverse of load_matrix_x4. Lanes 8i..8i+7 give the row
// addresses of matrix i; register i of lane holds matrix i's row lane / 4, columns 2 (lane % 4) + {0, 1}.
// So an A fragment of m16n8k16 (a0..a3 as above) lands as a 16 x 16 tile when lane l addresses row
// l % 16, 16-byte chunk l / 16 of it: the lane addresses of the ldmatrix A load of that tile.
__device__ __forceinline__ void store_matrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  __trap();  // callers take this path on sm_90 only
#endif
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

// d += A (16 x 8) * B (8 x 8) on tf32 inputs, fp32 accumulation. The tensor core reads the
// upper 19 bits of each input register (sign, exponent, 10 mantissa bits) and ignores the low
// 13: ptxas itself passes the unmasked result of cvt.rna.tf32.f32 to HMMA.1688.F32.TF32.
__device__ __forceinline__ void mma_16x8x8_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x = hi + lo with hi = x rounded to the nearest tf32 and lo = x - hi exactly
// (|lo| <= 2^-11 |x|). lo goes to the tensor core as it is, which truncates it to its top 11
// significant bits: an error below 2^-21 |x|, unbiased since lo's sign is random.
// sm_90: cvt.rn.tf32.f32 is one F2FP.TF32 instruction, so a split costs 2 (F2FP, FADD).
// sm_80 has no rounding instruction (cvt.rna.tf32.f32 becomes FSETP, IADD3, SEL, LOP3), so
// hi is rounded in two integer ops (ties away from zero, as cvt.rna), 3 in all.
// Non-finite x: NaN gives hi = lo = NaN; +-inf gives hi = +-inf, lo = 0, so infinities reach
// the products as IEEE arithmetic has them (2 more instructions per split). |x| within 2^-12
// of FLT_MAX rounds hi to inf, as both conversions do.
struct Tf32Pair {
  uint32_t hi;
  uint32_t lo;
};

__device__ __forceinline__ Tf32Pair split_tf32(float x) {
  uint32_t hi;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
#else
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
  // An infinite hi (x = +-inf) travels alone: x - hi would be inf - inf = NaN, turning an
  // infinity that IEEE arithmetic keeps (or a -inf score that softmax sends to 0) into NaN.
  const float lo = isinf(__uint_as_float(hi)) ? 0.0f : x - __uint_as_float(hi);
  return {hi, __float_as_uint(lo)};
}

// ----------------------------------------------------------------------------
// Element math
// ----------------------------------------------------------------------------

// Max and sum over a quad: the four threads (t = 0..3 of a group) that hold one row of a C
// fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullWarpMask, x, 1);
  return x + __shfl_xor_sync(kFullWarpMask, x, 2);
}

// 2^x on the special-function unit; exp2(-inf) = +0.
__device__ __forceinline__ float exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace waveboost::cuda::mma
