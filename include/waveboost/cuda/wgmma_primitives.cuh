// Warpgroup-level tensor-core primitives of Hopper (sm_90a) in inline PTX: the vocabulary
// of the wgmma flash kernel (flash_wgmma.cuh). Include only from translation units compiled
// for sm_90a (src/cuda/sm90/).
//
// Register fragments of wgmma.mma_async.m64nNk16 (PTX ISA, "Register Fragments", 9.7.15.5.1),
// g = lane / 4, t = lane % 4, w = warp index within the warpgroup:
//   D (64 x N, f32), N / 2 floats: d[4i + 2h + e] = D[16w + g + 8h][8i + 2t + e]   (h, e in {0, 1})
//     i.e. per warp and per 8 columns exactly the C fragment of mma.sync.m16n8.
//   A (64 x 16, 16-bit, from registers), four b32 registers of two elements each:
//     a0 = A[16w + g][2t, 2t+1]   a1 = A[16w + g + 8][2t, 2t+1]
//     a2 = A[16w + g][2t+8, 2t+9] a3 = A[16w + g + 8][2t+8, 2t+9]
//     i.e. per warp the A fragment of mma.sync.m16n8k16.
// So, as with mma.sync, the accumulators of two adjacent 8-column groups of S = Q K^T, packed
// in pairs to 16 bits, are the A operand of one k16 slice of P V.
//
// Shared-memory operands are described by 64-bit matrix descriptors (9.7.15.5.1.2.2):
//   bits  0..13  start address >> 4
//   bits 16..29  leading dimension byte offset (LBO) >> 4
//   bits 32..45  stride dimension byte offset (SBO) >> 4
//   bits 49..51  base offset (0: every swizzle pattern starts on a 1024 B boundary, as here)
//   bits 62..63  swizzle mode, 1 = 128 B
// Every tile here uses the 128 B swizzle: rows of 128 B (64 16-bit elements), 16 B chunk c of
// row r stored at chunk c ^ (r % 8), the pattern repeating every 8 rows = 1024 B ("atom").
// The hardware applies the XOR to address bits 4..6 from bits 7..9 of the address it forms,
// so a descriptor may start 32 B or 64 B into an atom (a k16 slice of a K-major operand)
// as long as the atoms themselves are 1024 B aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace waveboost::cuda::wgmma {

// Descriptor of a 128 B-swizzled operand at shared address `smem_addr`.
//   K-major (Q, K: rows along M or N, the k16 slice inside one 128 B row): SBO = distance
//     between 8-row groups (1024 B for dense atoms); LBO unused (the PTX ISA: "assumed 1").
//   MN-major (V as P V's B: rows along K = keys, 64 contiguous N = head-dim columns per
//     128 B row): SBO = distance between groups of 8 K rows (1024 B); LBO = distance between
//     64-column blocks along N.
__device__ __forceinline__ uint64_t descriptor_128b(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// The same descriptor moved `bytes` further on. The address field holds < 2^14 units of
// 16 B (all of shared memory), so the addition never carries into LBO.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Makes this thread's ordinary (generic-proxy) writes to shared memory, cp.async included,
// visible to later wgmma reads (async proxy) once a barrier has ordered the threads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders this warpgroup's earlier register writes (accumulators, A fragments) before the
// wgmma operations that follow.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending of this warpgroup's committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// An empty volatile asm that "modifies" each register: the compiler may not move reads or
// writes of these registers across it, nor across the (volatile) wgmma statements around it.
// Wraps wgmma issue and wait so that accumulator and fragment accesses stay on the right side.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// ----------------------------------------------------------------------------
// wgmma.mma_async
// ----------------------------------------------------------------------------
// Operand lists of 32 / 64 accumulators, with constraint C ("+f" to accumulate, "=f" when the
// instruction's scale-d predicate is false and D is not read).
#define WAVEBOOST_WGMMA_REGS8(C, d, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define WAVEBOOST_WGMMA_REGS32(C, d) \
  WAVEBOOST_WGMMA_REGS8(C, d, 0), WAVEBOOST_WGMMA_REGS8(C, d, 8), WAVEBOOST_WGMMA_REGS8(C, d, 16), \
      WAVEBOOST_WGMMA_REGS8(C, d, 24)
#define WAVEBOOST_WGMMA_REGS64(C, d)                                                                  \
  WAVEBOOST_WGMMA_REGS32(C, d), WAVEBOOST_WGMMA_REGS8(C, d, 32), WAVEBOOST_WGMMA_REGS8(C, d, 40),     \
      WAVEBOOST_WGMMA_REGS8(C, d, 48), WAVEBOOST_WGMMA_REGS8(C, d, 56)
#define WAVEBOOST_WGMMA_D32                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WAVEBOOST_WGMMA_D64                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63}"
#define WAVEBOOST_WGMMA_REGS96(C, d)                                                                  \
  WAVEBOOST_WGMMA_REGS64(C, d), WAVEBOOST_WGMMA_REGS8(C, d, 64), WAVEBOOST_WGMMA_REGS8(C, d, 72),     \
      WAVEBOOST_WGMMA_REGS8(C, d, 80), WAVEBOOST_WGMMA_REGS8(C, d, 88)
#define WAVEBOOST_WGMMA_D96                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "  \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"

// The four forms of a 16-bit product, fp16 or bf16 inputs (Element) with D accumulated or overwritten
// (kAccumulate): ISSUE(TYPES, C, SCALE_D) issues one, C and SCALE_D as for the operand lists above.
#define WAVEBOOST_WGMMA_16BIT_FORMS(ISSUE)   \
  if constexpr (std::is_same_v<Element, __half>) { \
    if constexpr (kAccumulate) {             \
      ISSUE("f16.f16", "+f", 1);             \
    } else {                                 \
      ISSUE("f16.f16", "=f", 0);             \
    }                                        \
  } else {                                   \
    if constexpr (kAccumulate) {             \
      ISSUE("bf16.bf16", "+f", 1);           \
    } else {                                 \
      ISSUE("bf16.bf16", "=f", 0);           \
    }                                        \
  }

// D (64 x 128, f32) {=, +=} A (64 x 16) B (16 x 128), A and B K-major in shared memory.
// kAccumulate == false: D = A B (scale-d false; D's old contents are not read).
template <typename Element, bool kAccumulate>
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>, "16-bit inputs");
#define WAVEBOOST_WGMMA_SS(TYPES, C, SCALE_D)                                                             \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " " WAVEBOOST_WGMMA_D64               \
               ", %64, %65, %66, 1, 1, 0, 0;\n"                                                          \
               : WAVEBOOST_WGMMA_REGS64(C, d)                                                             \
               : "l"(a_desc), "l"(b_desc), "n"(SCALE_D))
  WAVEBOOST_WGMMA_16BIT_FORMS(WAVEBOOST_WGMMA_SS)
#undef WAVEBOOST_WGMMA_SS
}

// D (64 x 192, f32) {=, +=} A (64 x 16) B (16 x 192), A and B K-major in shared memory.
template <typename Element, bool kAccumulate>
__device__ __forceinline__ void mma_m64n192k16_ss(float (&d)[96], uint64_t a_desc, uint64_t b_desc) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>, "16-bit inputs");
#define WAVEBOOST_WGMMA_SS96(TYPES, C, SCALE_D)                                                           \
  asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPES " " WAVEBOOST_WGMMA_D96               \
               ", %96, %97, %98, 1, 1, 0, 0;\n"                                                          \
               : WAVEBOOST_WGMMA_REGS96(C, d)                                                             \
               : "l"(a_desc), "l"(b_desc), "n"(SCALE_D))
  WAVEBOOST_WGMMA_16BIT_FORMS(WAVEBOOST_WGMMA_SS96)
#undef WAVEBOOST_WGMMA_SS96
}

// D (64 x 64, f32) {=, +=} A (64 x 16) B (16 x 64), both in shared memory: kTransposed false, both
// K-major; true, both MN-major (imm-trans-a = imm-trans-b = 1: A's M index and B's N index are the
// contiguous ones).
template <typename Element, bool kAccumulate, bool kTransposed = false>
__device__ __forceinline__ void mma_m64n64k16_ss_any(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>, "16-bit inputs");
#define WAVEBOOST_WGMMA_SS32(TYPES, C, SCALE_D)                                                           \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " WAVEBOOST_WGMMA_D32                \
               ", %32, %33, %34, 1, 1, %35, %35;\n"                                                      \
               : WAVEBOOST_WGMMA_REGS32(C, d)                                                             \
               : "l"(a_desc), "l"(b_desc), "n"(SCALE_D), "n"(kTransposed ? 1 : 0))
  WAVEBOOST_WGMMA_16BIT_FORMS(WAVEBOOST_WGMMA_SS32)
#undef WAVEBOOST_WGMMA_SS32
}
template <typename Element, bool kAccumulate>
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  mma_m64n64k16_ss_any<Element, kAccumulate, false>(d, a_desc, b_desc);
}
template <typename Element, bool kAccumulate>
__device__ __forceinline__ void mma_m64n64k16_ss_tt(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  mma_m64n64k16_ss_any<Element, kAccumulate, true>(d, a_desc, b_desc);
}

// D (64 x N, f32) += A (64 x 16, registers) B (16 x N), B MN-major in shared memory
// (imm-trans-b = 1: B's N index is the contiguous one). N = 64 or 128.
template <typename Element, int N>
__device__ __forceinline__ void mma_m64nNk16_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>, "16-bit inputs");
  static_assert(N == 64 || N == 128, "N = 64 or 128");
#define WAVEBOOST_WGMMA_RS64(TYPES)                                                                       \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " WAVEBOOST_WGMMA_D32                \
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                               \
               : WAVEBOOST_WGMMA_REGS32("+f", d)                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc))
#define WAVEBOOST_WGMMA_RS128(TYPES)                                                                      \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " " WAVEBOOST_WGMMA_D64               \
               ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                               \
               : WAVEBOOST_WGMMA_REGS64("+f", d)                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc))
  if constexpr (N == 64) {
    if constexpr (std::is_same_v<Element, __half>) {
      WAVEBOOST_WGMMA_RS64("f16.f16");
    } else {
      WAVEBOOST_WGMMA_RS64("bf16.bf16");
    }
  } else {
    if constexpr (std::is_same_v<Element, __half>) {
      WAVEBOOST_WGMMA_RS128("f16.f16");
    } else {
      WAVEBOOST_WGMMA_RS128("bf16.bf16");
    }
  }
#undef WAVEBOOST_WGMMA_RS64
#undef WAVEBOOST_WGMMA_RS128
}

// ---- 8-bit (e4m3) inputs: k32 slices; PTX allows no transposed operand for 8-bit types, so
// both operands in shared memory are K-major. The A fragment from registers (4 b32 registers of
// four bytes): a0 = A[16w + g][4t .. 4t+3], a1 = A[16w + g + 8][4t .. 4t+3],
// a2 = A[16w + g][16 + 4t .. 16 + 4t+3], a3 = A[16w + g + 8][16 + 4t .. 16 + 4t+3].

// D (64 x N, f32) {=, +=} A (64 x 32) B (32 x N), both e4m3 and K-major in shared memory; N = 128 or 192.
template <int N, bool kAccumulate>
__device__ __forceinline__ void mma_m64nNk32_ss_e4m3(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc) {
  static_assert(N == 128 || N == 192, "N = 128 or 192");
  // SHAPE, D's operand list and constraints, the two descriptors' operand numbers; scale-d 1 accumulates.
#define WAVEBOOST_WGMMA_SS8(SHAPE, DLIST, REGS, DESCS, C, SCALE_D)                                             \
  asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32.e4m3.e4m3 " DLIST ", " DESCS ", " #SCALE_D ", 1, 1;\n" \
               : REGS(C, d)                                                                                     \
               : "l"(a_desc), "l"(b_desc))
  if constexpr (N == 128 && kAccumulate) {
    WAVEBOOST_WGMMA_SS8("m64n128k32", WAVEBOOST_WGMMA_D64, WAVEBOOST_WGMMA_REGS64, "%64, %65", "+f", 1);
  } else if constexpr (N == 128) {
    WAVEBOOST_WGMMA_SS8("m64n128k32", WAVEBOOST_WGMMA_D64, WAVEBOOST_WGMMA_REGS64, "%64, %65", "=f", 0);
  } else if constexpr (kAccumulate) {
    WAVEBOOST_WGMMA_SS8("m64n192k32", WAVEBOOST_WGMMA_D96, WAVEBOOST_WGMMA_REGS96, "%96, %97", "+f", 1);
  } else {
    WAVEBOOST_WGMMA_SS8("m64n192k32", WAVEBOOST_WGMMA_D96, WAVEBOOST_WGMMA_REGS96, "%96, %97", "=f", 0);
  }
#undef WAVEBOOST_WGMMA_SS8
}

// D (64 x N, f32) += A (64 x 32, e4m3 registers) B (32 x N), B e4m3 and K-major in shared memory.
template <int N>
__device__ __forceinline__ void mma_m64nNk32_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc) {
  static_assert(N == 64 || N == 128, "N = 64 or 128");
  if constexpr (N == 64) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " WAVEBOOST_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
                 : WAVEBOOST_WGMMA_REGS32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WAVEBOOST_WGMMA_D64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
                 : WAVEBOOST_WGMMA_REGS64("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
  }
}

// Four floats rounded (to nearest, saturating at +-448) to e4m3, x0 in the lowest byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t bits;
  asm("{\n"
      ".reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n"
      "}\n"
      : "=r"(bits)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return bits;
}

#undef WAVEBOOST_WGMMA_REGS8
#undef WAVEBOOST_WGMMA_REGS32
#undef WAVEBOOST_WGMMA_REGS64
#undef WAVEBOOST_WGMMA_D32
#undef WAVEBOOST_WGMMA_D64
#undef WAVEBOOST_WGMMA_16BIT_FORMS

}  // namespace waveboost::cuda::wgmma
