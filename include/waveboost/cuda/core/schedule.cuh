// The launch order of the flash kernels' blocks: which (tile, head) a block takes from its place
// in the grid. Grids put a head's tiles (query blocks in the forward, key blocks in the backward)
// along x and the heads over y and z, and the hardware hands out blocks x fastest.
//
// Under a causal mask the tiles of a head differ in work (the heaviest tile is taken first: the
// forward's last query block sees every key, the backward's first key block every query). Head
// by head, the heaviest tiles of the last heads start within the grid's last wave and finish
// long after the rest (3-10% of a causal call at 1k-8k keys in a model of the block dispatch,
// benchmarks/NOTES.md, "Causal launch order"). So the grid's last heads, as many as fill
// kTailWaves waves of blocks, are taken tile by tile (tile 0 of each of them, then tile 1, ...):
// their heavy tiles start first. The other heads stay head by head, where the blocks in flight
// read the same K/V (forward) or Q/dO (backward) tiles at about the same time; taking every head
// tile by tile (chunks of heads sized to L2) lost that sharing: 5-14% slower at 1k keys.
#pragma once

#include <cstdint>

namespace waveboost::cuda {

/// Waves of blocks (one block per SM) that the tail taken tile by tile fills.
inline constexpr int kTailWaves = 2;

struct GridTile {
  int64_t tile;  // in launch order (0 first)
  int64_t head;  // the grid's head index: blockIdx.z * gridDim.y + blockIdx.y before reordering
};

/// \brief The (tile, head) of launch position (tile_index, head) in a grid of `tiles` tiles per
/// head and `heads` heads. heavy_first == false: the grid's own order, head by head. Otherwise the
/// last heads, enough for kTailWaves blocks per SM, tile by tile (see above). A bijection over the
/// grid either way.
__device__ __forceinline__ GridTile grid_tile_at(int64_t tile_index, int64_t head, int64_t heads, int64_t tiles,
                                                 bool heavy_first) {
  if (!heavy_first || tiles <= 1) return {tile_index, head};
  uint32_t sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  const int64_t tail = min(heads, (int64_t{kTailWaves} * sms + tiles - 1) / tiles);
  const int64_t first = heads - tail;  // the tail's first head
  if (head < first) return {tile_index, head};
  const int64_t rest = (head - first) * tiles + tile_index;  // position within the tail
  return {rest / tail, first + rest % tail};
}

/// \brief grid_tile_at for this block: tile_index along x, heads folded over gridDim.y and gridDim.z.
__device__ __forceinline__ GridTile grid_tile(int64_t tile_index, int64_t tiles, bool heavy_first) {
  const int64_t head = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  return grid_tile_at(tile_index, head, static_cast<int64_t>(gridDim.y) * gridDim.z, tiles, heavy_first);
}

/// \brief A block's walk over the work items of a persistent grid (at most one block per slot) that
/// replaces the one-block-per-item grid of `tiles` tiles of each of `heads` heads:
///
///   for (auto it = PersistentWalk<kHeavyFirst>::start(); it.item < items; it.next()) ... it.at(tiles, heads)
///
/// at() is the item's launch position in that grid. kHeavyFirst == false: items blockIdx.x, blockIdx.x +
/// gridDim.x, ... in that grid's order (a head's tiles one after another, head after head), where
/// neighbouring blocks read the same K/V tiles.
template <bool kHeavyFirst>
struct PersistentWalk {
  int64_t item;
  __device__ __forceinline__ static PersistentWalk start() { return {static_cast<int64_t>(blockIdx.x)}; }
  __device__ __forceinline__ void next() { item += gridDim.x; }
  __device__ __forceinline__ GridTile at(int64_t tiles, int64_t) const { return {item % tiles, item / tiles}; }
};

/// kHeavyFirst: tile 0 of every head, then tile 1 of every head, ... (the heaviest first), dealt to the
/// blocks back and forth (round k in block order on even k, in reverse on odd k), so that the blocks'
/// items sum to about the same work and the lightest finish last (in the order above the causal
/// forward lost 0.67-0.92x, benchmarks/NOTES.md). In 32 bits: the launcher keeps the items plus
/// gridDim.x below 2^32.
template <>
struct PersistentWalk<true> {
  uint32_t round;
  uint32_t item;
  __device__ __forceinline__ static uint32_t dealt(uint32_t k) {
    const uint32_t grid = gridDim.x;
    return k * grid + ((k & 1u) ? grid - 1u - blockIdx.x : blockIdx.x);
  }
  __device__ __forceinline__ static PersistentWalk start() { return {0u, dealt(0u)}; }
  __device__ __forceinline__ void next() { item = dealt(++round); }
  __device__ __forceinline__ GridTile at(int64_t, int64_t heads) const {
    return {item / static_cast<uint32_t>(heads), item % static_cast<uint32_t>(heads)};
  }
};

}  // namespace waveboost::cuda
