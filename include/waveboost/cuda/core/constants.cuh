// Named numbers shared by the CUDA paths: the log-domain constants of the softmax, the
// threshold of its exact-exponent fallback, and hardware limits of a launch.
#pragma once

#include <cstdint>

namespace waveboost::cuda {

// log2(e): exp(x) == exp2(x * kLog2e); kernels fold it into the softmax scale.
constexpr float kLog2e = 1.4426950408889634f;
// ln(2): the kernels keep the row max in log2 units; LSE = max * kLn2 + log(sum).
constexpr float kLn2 = 0.6931471805599453f;
// |c max(S)| (scaled log2 units) from which the online softmax rounds c S before subtracting
// the max (core/softmax.cuh): 2^24, where ulp(m) exceeds 1.
constexpr float kExactExponentFrom = 16777216.f;
// The smallest normal float (FLT_MIN): a softmax scale of 0 becomes this, so that every c S
// rounds exp2 to exactly 1 as c = 0 would while masked -inf scores stay -inf (not 0 * -inf).
constexpr float kSmallestNormalFloat = 1.17549435e-38f;
// The sign bits of two packed 16-bit floats: XOR negates both exactly.
constexpr uint32_t kSignBitsHalf2 = 0x80008000u;
// Every lane of a warp, for the *_sync warp intrinsics.
constexpr unsigned kFullWarpMask = 0xffffffffu;
// Dynamic shared memory a kernel gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr int kSharedMemoryWithoutOptIn = 48 * 1024;
// Largest gridDim.y and gridDim.z of a launch.
constexpr int64_t kMaxGridYZ = 65535;

// Block shapes the host side needs without including a kernel header (the wgmma kernels
// compile for sm_90a only): the traits are defined from these, and static_asserts keep them equal.
// wgmma: two warpgroups of wgmma's M = 64 rows per block, 128-key tiles.
constexpr int kWgmmaBlockM = 128;
constexpr int kWgmmaBlockN = 128;

}  // namespace waveboost::cuda
