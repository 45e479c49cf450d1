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

/// \brief The orders in which the blocks of a persistent grid (at most one block per slot) take the work
/// items of the one-block-per-item grid it replaces (`tiles` tiles of each of `heads` heads, launch
/// positions as above: under a causal mask tile 0 is a head's heaviest). G is the grid's size.
///
///   kGrid           block x takes items x, x + G, x + 2 G, ... in that grid's order (a head's tiles one
///                   after another, head after head), where neighbouring blocks read the same K/V tiles;
///                   for items of equal work (non-causal).
///   kGridDealt      that grid's order in rounds of G items, dealt to the blocks back and forth (round k
///                   in block order on even k, in reverse on odd k). The blocks in flight read the K/V of
///                   the few heads a round spans; causal heads of a few tiles (head dim 128 under 8192
///                   query rows: 1.09-1.20x over the heaviest-first order at 512-2k, benchmarks/NOTES.md,
///                   "Causal persistent walks"). With tiles close to G the rounds' sums drift apart
///                   (0.67x at 16k).
///   kHeaviestFirst  tile 0 of every head, then tile 1 of every head, ..., dealt back and forth: the
///                   blocks' items sum to about the same work and the lightest finish last; causal heads
///                   of many tiles (in the kGrid order the causal forward lost 0.67-0.92x there).
///   kPairs          a head's tiles in pairs of equal summed work (tile j with tile tiles - 1 - j; of an
///                   odd count the middle one alone), the pairs taken as kGrid takes items: every block the
///                   same work up to the last round, without the grid's size dividing the tile count
///                   (head dim 64's causal 64-row blocks, three per SM).
///
/// Each walk: `for (auto it = PersistentWalk<kOrder>::start(tiles, heads); it.more(); it.next()) ...
/// it.at()`, at() the item's launch position. Every walk counts in 32 bits: the launcher
/// keeps the items plus the grid's size below 2^32.
enum class WalkOrder { kGrid, kGridDealt, kHeaviestFirst, kPairs };

/// \brief The blocks a persistent grid of `order` gives work to at most: its items, or pairs.
__host__ __device__ constexpr int64_t persistent_walk_units(WalkOrder order, int64_t tiles, int64_t heads) {
  return (order == WalkOrder::kPairs ? (tiles + 1) / 2 : tiles) * heads;
}

/// \brief Round k's item of this block in a walk dealt back and forth.
__device__ __forceinline__ uint32_t dealt_item(uint32_t k) {
  const uint32_t grid = gridDim.x;
  return k * grid + ((k & 1u) ? grid - 1u - blockIdx.x : blockIdx.x);
}

/// The two walks dealt back and forth: position `item` of the walk's order is the grid's item (kGridDealt, per =
/// tiles) or tile item / heads of head item % heads (kHeaviestFirst, per = heads).
template <WalkOrder kOrder>
struct PersistentWalk {
  static_assert(kOrder == WalkOrder::kGridDealt || kOrder == WalkOrder::kHeaviestFirst, "a dealt walk");
  static constexpr bool kGridOrder = kOrder == WalkOrder::kGridDealt;
  uint32_t round, item, items, per;
  __device__ __forceinline__ static PersistentWalk start(int64_t tiles, int64_t heads) {
    const int64_t per = kGridOrder ? tiles : heads;
    return {0u, dealt_item(0u), static_cast<uint32_t>(tiles * heads), static_cast<uint32_t>(per)};
  }
  __device__ __forceinline__ bool more() const { return item < items; }
  __device__ __forceinline__ void next() { item = dealt_item(++round); }
  __device__ __forceinline__ GridTile at() const {
    return kGridOrder ? GridTile{item % per, item / per} : GridTile{item / per, item % per};
  }
};

template <>
struct PersistentWalk<WalkOrder::kGrid> {
  uint32_t item, items, tiles;
  __device__ __forceinline__ static PersistentWalk start(int64_t tiles, int64_t heads) {
    return {blockIdx.x, static_cast<uint32_t>(tiles * heads), static_cast<uint32_t>(tiles)};
  }
  __device__ __forceinline__ bool more() const { return item < items; }
  __device__ __forceinline__ void next() { item += gridDim.x; }
  __device__ __forceinline__ GridTile at() const { return {item % tiles, item / tiles}; }
};

template <>
struct PersistentWalk<WalkOrder::kPairs> {
  uint32_t unit, units, tiles;
  bool second;  // the pair's lighter tile
  __device__ __forceinline__ static PersistentWalk start(int64_t tiles, int64_t heads) {
    return {blockIdx.x, static_cast<uint32_t>(persistent_walk_units(WalkOrder::kPairs, tiles, heads)),
            static_cast<uint32_t>(tiles), false};
  }
  __device__ __forceinline__ uint32_t pairs() const { return (tiles + 1u) / 2u; }
  __device__ __forceinline__ bool more() const { return unit < units; }
  __device__ __forceinline__ void next() {
    const uint32_t j = unit % pairs();
    if (!second && tiles - 1u - j != j) {
      second = true;
    } else {
      second = false;
      unit += gridDim.x;
    }
  }
  __device__ __forceinline__ GridTile at() const {
    const uint32_t j = unit % pairs();
    return {second ? tiles - 1u - j : j, unit / pairs()};
  }
};

}  // namespace waveboost::cuda
