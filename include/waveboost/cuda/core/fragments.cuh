// The accumulator layouts of the tensor-core paths, seen as rows and columns, so that the
// mask, the online softmax and the epilogue are written once for all of them.
//
// mma.sync (m16n8k*) and wgmma (m64nNk16) hand thread (g, t) = (lane / 4, lane % 4) the same
// pieces of a score or output tile: in each 16-row slab of its warp, rows g (elements 0, 1 of
// each n8 column group) and g + 8 (elements 2, 3), columns 8 nt + 2 t + {0, 1} of column group
// nt. A thread's row r (r = 0 .. kRows - 1) is row 8 r + g of its warp's rows; a row is spread
// over the 4 threads of a quad. The layouts differ only in how the registers are numbered:
//   mma.sync: float[kMTiles][kNTiles][4], row r = (m16 tile r / 2, half r % 2);
//   wgmma:    float[4 * kNTiles], one m64 slab per warpgroup, a warp's 16 rows in it.
// Both pack P into A fragments of the P V product the same way: column groups 2 ks and
// 2 ks + 1 are k16 slice ks, registers a{0,1} for the first 8 keys, a{2,3} for the next;
// a{0,2} row g, a{1,3} row g + 8.
#pragma once

#include <cstdint>

namespace waveboost::cuda {

/// \brief mma.sync C fragments of kMTiles m16 tiles x kNTiles n8 tiles per warp.
template <int kMTiles_, int kNTiles_>
struct MmaFragments {
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kNTiles = kNTiles_;
  static constexpr int kRows = 2 * kMTiles;  // rows per thread
  using Array = float[kMTiles][kNTiles][4];
  using Operand = uint32_t[kMTiles][kNTiles / 2][4];  // P as A fragments of k16 slices

  // Element e (column 2 t + e) of column group nt in this thread's row r.
  __device__ __forceinline__ static float& at(Array& a, int r, int nt, int e) { return a[r / 2][nt][2 * (r % 2) + e]; }
  __device__ __forceinline__ static float at(const Array& a, int r, int nt, int e) {
    return a[r / 2][nt][2 * (r % 2) + e];
  }
  // A-fragment register holding columns 2 t, 2 t + 1 of group nt in row r.
  __device__ __forceinline__ static uint32_t& operand(Operand& p, int r, int nt) {
    return p[r / 2][nt / 2][2 * (nt % 2) + r % 2];
  }
};

/// \brief Zeroes kTiles n8 tiles of mma.sync C fragments (float[kTiles][4]).
template <int kTiles>
__device__ __forceinline__ void zero_fill(float (&acc)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  }
}

/// \brief wgmma accumulators of one warp's 16 rows of an m64 x (8 kNTiles) product.
template <int kNTiles_>
struct WgmmaFragments {
  static constexpr int kNTiles = kNTiles_;
  static constexpr int kRows = 2;
  using Array = float[4 * kNTiles];
  using Operand = uint32_t[kNTiles / 2][4];

  __device__ __forceinline__ static float& at(Array& a, int r, int nt, int e) { return a[4 * nt + 2 * r + e]; }
  __device__ __forceinline__ static float at(const Array& a, int r, int nt, int e) { return a[4 * nt + 2 * r + e]; }
  __device__ __forceinline__ static uint32_t& operand(Operand& p, int r, int nt) {
    return p[nt / 2][2 * (nt % 2) + r];
  }
};

}  // namespace waveboost::cuda
