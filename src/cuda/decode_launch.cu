// Backend "decode": can_implement, the number of split-KV pieces, the workspace, and the
// launch of the decode kernel (include/waveboost/cuda/decode.cuh) through the kernel registry;
// the kernel merges the split pieces of 16-row tiles itself (through global memory, or on sm_90 through
// a thread block cluster's shared memory), those of 32- and 64-row tiles go to the combine of
// include/waveboost/cuda/core/combine.cuh. On sm_90, dense and paged caches stream by TMA
// (decode_variant).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_paths.h"
#include "kernel_registry.h"
#include "workspace.h"
#include "waveboost/cuda/common.cuh"
#include "waveboost/cuda/core/combine.cuh"
#include "waveboost/cuda/decode.cuh"

namespace waveboost::cuda {
namespace {

// Blocks of the decode kernel one SM holds at once: its shared memory (100-112 KB) allows two
// on sm_90 (228 KB per SM).
constexpr int kDecodeBlocksPerSM = 2;

// How split-KV runs, by tile (measured in benchmarks/NOTES.md, "Decode", "Decode on the H200",
// "Decode: L2 promotion of the TMA boxes", and benchmarks/results/*-20261123/decode-fused/,
// *-20261127/decode-blocks-per-sm/, nvidia-h200-20261127/decode-l2-promotion/). 16-row tiles
// (seqlen_q x group <= 16) merge their pieces inside the decode kernel (one launch fewer, which
// batch-1 steps feel); 32- and 64-row tiles merge 17-64 rows per block, where the combine kernel is
// faster. The keys are cut so that the pieces fill one wave of blocks:
//  - 16-row tiles: one block per SM, which streams an H100's memory best. With 16 B cp.async, two
//    where each SM must take more bytes per second than one block of three stages keeps in flight
//    (an H200: 37 GB/s per SM; 1.12-1.15x there) and every piece keeps kMinTilesPerPiece key tiles
//    (with fewer, the pipeline's start dominates); with TMA boxes of whole key tiles (dense caches,
//    pages of at least a tile) one there too. TMA boxes of smaller pages (a box per page) follow
//    cp.async: one loading thread per block issues them, and two blocks per SM issue twice as many
//    (H200, pages of 16: 1.50x over one block per SM at batch 16 x 8k, 1.12x at batch 1 x 32k).
//  - 32- and 64-row tiles: two blocks per SM (measured on 64-row tiles; 32-row tiles follow them),
//    but one for the TMA variant of whole-tile boxes on such fast-memory devices (32-row tiles, MQA:
//    1.06x on an H200), and one for the TMA variant's 64-row tiles anywhere (two do not fit an SM; that
//    variant takes 64-row tiles only with whole-tile boxes, decode_tma_takes).
// On those devices the TMA variant's K/V boxes also bring only their own 128 B rows into L2
// (decode_l2_promotion): there the L2, not the DRAM, is the limit, and the 256 B promotion that
// suits an H100 costs 3-6%.
//
// To measure these choices (read once per process): WAVEBOOST_DECODE_COMBINE=kernel or in-kernel
// picks the merge for every tile; WAVEBOOST_DECODE_BLOCKS_PER_SM=1 or 2 the wave that the split
// count fills; WAVEBOOST_DECODE_MAX_SPLITS=N (1..kDecodeMaxSplits) caps the pieces per (sequence,
// kv head); WAVEBOOST_DECODE_L2_PROMOTION=128 or 256 the TMA boxes' L2 promotion;
// WAVEBOOST_DECODE_PIPELINE (decode_variant) the loads; WAVEBOOST_DECODE_CLUSTER (decode_cluster) the
// cluster merge.
constexpr int kFastMemoryMBps = 30000;  // DRAM MB/s per SM from which the rules above change (an H200)
constexpr int64_t kMinTilesPerPiece = 4;

int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n >= lo && n <= hi ? n : fallback;
}
bool merge_in_kernel(const AttentionParams& p) {
  static const int forced = [] {  // -1: by tile, 0: the combine kernel, 1: in the kernel
    const char* v = std::getenv("WAVEBOOST_DECODE_COMBINE");
    if (v != nullptr && std::strcmp(v, "kernel") == 0) return 0;
    if (v != nullptr && std::strcmp(v, "in-kernel") == 0) return 1;
    return -1;
  }();
  return forced >= 0 ? forced == 1 : decode_block_m(p) == 16;
}
int forced_blocks_per_sm() {
  static const int forced = env_int("WAVEBOOST_DECODE_BLOCKS_PER_SM", 1, kDecodeBlocksPerSM, 0);
  return forced;
}
int max_splits() {
  static const int cap = env_int("WAVEBOOST_DECODE_MAX_SPLITS", 1, kDecodeMaxSplits, kDecodeMaxSplits);
  return cap;
}

// Row tiles per (sequence, kv head); tma: of the TMA variant, whose tiles past 128 rows are 128 rows
// (decode_tma_block_m). The cp.async count is never smaller: the arrival counters and the grid
// limit take it, so that a call whose tensor maps are refused (it then runs the cp.async kernel)
// stays inside them.
int64_t decode_row_tiles(const AttentionParams& p, bool tma = false) {
  const int64_t block_m = tma ? decode_tma_block_m(p) : decode_block_m(p);
  return (p.seqlen_q * (p.heads / p.heads_kv) + block_m - 1) / block_m;
}
int64_t decode_key_tiles(const AttentionParams& p) {
  return (p.seqlen_k + decode_block_n(p.head_dim) - 1) / decode_block_n(p.head_dim);
}

// Pieces to cut each block's keys into so that the grid fills one wave of blocks_per_sm blocks per
// SM. The grid without splits has batch x kv heads x row tiles blocks; when that is under a wave,
// the keys are cut so that the pieces fill it, each piece at least one key tile of the longest
// sequence. A grid of a full wave or more is left whole: merging pieces would only add work.
int splits_for_wave(const AttentionParams& p, int multiprocessors, int blocks_per_sm, bool tma) {
  const int64_t blocks = p.batch * p.heads_kv * decode_row_tiles(p, tma);
  const int64_t slots = int64_t{blocks_per_sm} * multiprocessors;
  if (blocks <= 0 || blocks >= slots) return 1;
  const int64_t key_tiles = decode_key_tiles(p);
  int64_t splits = slots / blocks;
  splits = splits < key_tiles ? splits : key_tiles;
  splits = splits < max_splits() ? splits : max_splits();
  return splits > 1 ? static_cast<int>(splits) : 1;
}

// Grids of one block per SM or more (16-row tiles). Two blocks fit on an SM, so such a grid runs
// in waves of 2 x SMs blocks, and a last wave that is mostly empty leaves the memory idle; the keys
// are then cut into pieces (benchmarks/NOTES.md, "Decode: the last wave"):
//  - K/V by 16 B cp.async or by TMA boxes of a page (pages under a key tile): FlashAttention's
//    split heuristic over those waves. s pieces per block fill waves / ceil(waves) of the slots;
//    the smallest s (1-4, pieces of at least 16 key tiles) within 85% of the best fill is taken
//    (H100, pages of 16 keys, batch 34 x 4k keys at 32/8 heads, 272 blocks on 132 SMs: 55% of
//    peak unsplit, 70% in 3 pieces; 1.07-1.32x on seven grids of 1-4.4 blocks per SM).
//  - TMA boxes of whole key tiles: a block left alone on an SM by the tail streams faster, so only
//    grids of 1-1.5 or 2-2.5 blocks per SM are cut, into pieces that fill two waves (4 x SMs pieces),
//    up to 4 per block of at least 32 key tiles (pieces of 16 tiles cost 4-5% there; H100 / H200,
//    batch 20 x 8k, 160 blocks: 82% / 77% of peak unsplit, 1.06x / 1.08x in 4 pieces).
// Past three waves the last one is at most a quarter of the step.
int splits_for_last_wave(const AttentionParams& p, int multiprocessors, bool tile_boxes) {
  const int64_t blocks = p.batch * p.heads_kv * decode_row_tiles(p);
  const int64_t sms = multiprocessors;
  const int64_t slots = kDecodeBlocksPerSM * sms;
  if (blocks < sms || blocks >= 3 * slots) return 1;
  int64_t most = decode_key_tiles(p) / (tile_boxes ? 32 : 16);
  most = most < 4 ? most : 4;
  most = most < max_splits() ? most : max_splits();
  if (tile_boxes) {
    const bool thin_tail = (blocks > sms && 2 * blocks <= 3 * sms) || (blocks > 2 * sms && 2 * blocks <= 5 * sms);
    const int64_t splits = thin_tail ? (4 * sms + blocks - 1) / blocks : 1;
    return static_cast<int>(splits < most ? splits : (most > 1 ? most : 1));
  }
  const auto fill = [&](int64_t splits) {
    const double waves = static_cast<double>(blocks * splits) / static_cast<double>(slots);
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int64_t s = 1; s <= most; ++s) best = fill(s) > best ? fill(s) : best;
  for (int64_t s = 1; s <= most; ++s)
    if (fill(s) >= 0.85 * best) return static_cast<int>(s);
  return 1;
}

// The wave the split count fills (see above), then the pieces for it; tma: the launch takes the
// TMA variant (decode_variant).
int decode_splits(const AttentionParams& p, int multiprocessors, int bandwidth_per_sm, bool tma) {
  if (const int forced = forced_blocks_per_sm(); forced > 0) return splits_for_wave(p, multiprocessors, forced, tma);
  const bool fast_memory = bandwidth_per_sm >= kFastMemoryMBps;
  const bool tile_boxes = tma && decode_tma_tile_boxes(p);
  if (decode_block_m(p) != 16) {
    const int fit = tma ? decode_tma_blocks_per_sm(p) : kDecodeBlocksPerSM;
    return splits_for_wave(p, multiprocessors, tile_boxes && fast_memory ? 1 : fit, tma);
  }
  int splits = splits_for_wave(p, multiprocessors, 1, tma);
  if (!tile_boxes && fast_memory) {
    const int two = splits_for_wave(p, multiprocessors, 2, tma);
    if (decode_key_tiles(p) >= kMinTilesPerPiece * two) splits = two;
  }
  return splits == 1 ? splits_for_last_wave(p, multiprocessors, tile_boxes) : splits;
}

// Clusters (DecodeSplit::cluster): a split call on the TMA kernel with 2-8 pieces per (sequence, kv
// head) of 16-row tiles merges them through each cluster's shared memory where every cluster of the
// grid is resident at once (clusters_resident: the grids of one wave above); else through global
// memory as above (benchmarks/NOTES.md, "Decode: the pieces of one wave merged through a thread block
// cluster"). The hardware may place two blocks of a cluster on one SM, which then streams twice the
// keys: where the clusters are resident with one block per SM, the launch asks for that much shared
// memory (kOneBlockPerSMBytes); else only pieces of at most kClusterSharedSMTiles key tiles take
// clusters (an H200 at batch 1 x 32k, 16 pieces of 32 tiles in clusters of 16: 0.89x the global merge;
// 1.02-1.28x at 2-16 tiles). Calls cut into 9-16 pieces whose keys fit 8 pieces of at most
// kClusterRecutTiles tiles take 8 in clusters of 8 instead (H200, batch 1 x 2k at 32/8 heads: 1.20x the
// 16 pieces merged through global memory, 1.10x in clusters of 16; 1.00 at 1 x 8k, 16 tiles a piece).
// Clusters stay within the portable 8 blocks: compute-sanitizer's synccheck reported the clusters of
// 16 (a missing wait at the first arrival on a stage's barrier), those of 2-8 not.
// WAVEBOOST_DECODE_CLUSTER (read per call, to measure it): 0 never, 2 on the kernel's own shared
// memory wherever resident, whatever the pieces' length.
constexpr int kMaxClusterPieces = decode::kMaxClusterPieces;
constexpr int kOneBlockPerSMBytes = 120 * 1024;
constexpr int64_t kClusterSharedSMTiles = 16;
constexpr int64_t kClusterRecutTiles = 8;

int cluster_setting() {
  const char* v = std::getenv("WAVEBOOST_DECODE_CLUSTER");
  if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
  if (v != nullptr && std::strcmp(v, "2") == 0) return 2;
  return 1;
}

// Threads of the TMA decode kernel's 16-row blocks (the ones that run in clusters), either head dim.
constexpr int kClusterBlockThreads = DecodeTraits<__half, 128, 16, true>::kThreads;
static_assert(kClusterBlockThreads == DecodeTraits<__half, 64, 16, true>::kThreads, "one block shape");

// A kernel of the TMA decode kernel's launch shape, for the occupancy of its clusters.
__global__ void __launch_bounds__(kClusterBlockThreads) decode_cluster_shape() {}

// Whether `clusters` clusters of `size` blocks of kClusterBlockThreads threads and `smem` bytes of
// shared memory each are resident at once on the current device (cudaOccupancyMaxActiveClusters,
// once per device and shape).
bool clusters_resident(int device_id, int size, int smem, int64_t clusters) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;
  const auto key = std::make_tuple(device_id, size, smem);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return clusters <= it->second;
  }
  int active = 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(size));
  config.blockDim = dim3(kClusterBlockThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(size);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cudaFuncSetAttribute(decode_cluster_shape, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&active, decode_cluster_shape, &config) != cudaSuccess) {
    active = 0;
    (void)cudaGetLastError();  // no clusters: the global-memory merge runs instead
  }
  std::lock_guard<std::mutex> lock(mutex);
  known[key] = active;
  return clusters <= active;
}

// Whether p's `splits` pieces merge in clusters, and the dynamic shared memory the kernel then takes
// beyond its own (*extra_smem).
bool decode_cluster(const AttentionParams& p, const char* variant, int* splits_inout, int* extra_smem) {
  *extra_smem = 0;
  const int setting = cluster_setting();
  int splits = *splits_inout;
  if (splits > kMaxClusterPieces && splits <= 2 * kMaxClusterPieces &&
      decode_key_tiles(p) <= kMaxClusterPieces * kClusterRecutTiles)
    splits = kMaxClusterPieces;
  if (setting == 0 || variant[0] == '\0' || decode_block_m(p) != 16 || !merge_in_kernel(p) || splits < 2 ||
      splits > kMaxClusterPieces)
    return false;
  if (decode_row_tiles(p) != 1) return false;  // one cluster per (sequence, kv head)
  const int64_t groups = p.batch * p.heads_kv;
  const int smem = p.head_dim == 64 ? DecodeTraits<__half, 64, 16, true>::kSmemBytes
                                    : DecodeTraits<__half, 128, 16, true>::kSmemBytes;
  if (setting == 1 && smem < kOneBlockPerSMBytes && clusters_resident(p.device_id, splits, kOneBlockPerSMBytes, groups)) {
    *extra_smem = kOneBlockPerSMBytes - smem;
    *splits_inout = splits;
    return true;
  }
  const int64_t piece_tiles = (decode_key_tiles(p) + splits - 1) / splits;
  if (setting == 1 && piece_tiles > kClusterSharedSMTiles) return false;
  if (!clusters_resident(p.device_id, splits, smem, groups)) return false;
  *splits_inout = splits;
  return true;
}

// The device's DRAM bandwidth per SM in MB/s; 0 where it cannot be read (the rules then take an
// H100's choices).
int bandwidth_per_sm(int device_id) {
  int bandwidth = 0;
  if (!memory_bandwidth_per_sm(device_id, &bandwidth).ok()) {
    bandwidth = 0;
    (void)cudaGetLastError();  // the failed query is not this call's error
  }
  return bandwidth;
}

// The kernel table's variant for p: "tma" (K/V tiles by TMA, decode_tma_applies) on a compute
// capability 9.0 device of a build with sm_90a objects, for dense and paged caches: pages of at
// least a key tile stream at the contiguous cache's speed, pages of 16 at 1.01-1.15x cp.async with
// the split rule above on an H200 and 1.00-1.28x on an H100, where pages of 256 gain 1.02-1.30x
// (benchmarks/NOTES.md, "Decode: paged caches by TMA", "Decode: small pages by TMA, two blocks per
// SM", "Decode: paged caches by TMA on the H100"); else "" (16 B cp.async from every thread).
// WAVEBOOST_DECODE_PIPELINE=cp.async (read once per process) never takes TMA.
const char* decode_variant(const AttentionParams& p) {
#ifdef WAVEBOOST_WITH_SM90A
  static const bool cp_async = [] {
    const char* v = std::getenv("WAVEBOOST_DECODE_PIPELINE");
    return v != nullptr && std::strcmp(v, "cp.async") == 0;
  }();
  int cc = 0;
  if (cp_async || !compute_capability(p.device_id, &cc).ok() || cc != 90 || !decode_tma_applies(p)) return "";
  return "tma";
#else
  (void)p;
  return "";
#endif
}

// decode_splits for p's device and variant (decode_variant).
Status device_splits(const AttentionParams& p, const char* variant, int* splits) {
  int multiprocessors = 0;
  if (Status st = multiprocessor_count(p.device_id, &multiprocessors); !st.ok()) return st;
  *splits = decode_splits(p, multiprocessors, bandwidth_per_sm(p.device_id), variant[0] != '\0');
  return Status::Ok();
}

Status launch(const AttentionParams& p, const char* variant, const DecodeSplit& split, cudaStream_t s) {
  ForwardLaunch launch;
  launch.stream = s;
  launch.decode = &split;
  if (variant[0] != '\0') {
    const Status tma = run_forward(Backend::kDecode, variant, p, launch);
    // NotSupported: the driver refused the tensor maps; a cluster's caller then merges otherwise.
    if (tma.code() != StatusCode::kNotSupported || split.cluster) return tma;
  }
  return run_forward(Backend::kDecode, "", p, launch);
}

// core::combine over the pieces of `split` into p.out and p.lse.
Status combine_pieces(const AttentionParams& p, const DecodeSplit& split, cudaStream_t s) {
  const core::CombineParams c = core::split_pieces(p, split.o_accum, split.lse_accum, split.num_splits,
                                                    p.heads * p.head_dim, p.head_dim);
  return core::launch_combine(c, DType::kFloat32, p.dtype, s);
}

}  // namespace

tma::L2Promotion decode_l2_promotion(int device_id) {
  static const int forced = env_int("WAVEBOOST_DECODE_L2_PROMOTION", 128, 256, 0);
  if (forced == 128 || forced == 256) return forced == 128 ? tma::L2Promotion::k128B : tma::L2Promotion::k256B;
  return bandwidth_per_sm(device_id) >= kFastMemoryMBps ? tma::L2Promotion::k128B : tma::L2Promotion::k256B;
}

Status decode_can_implement(const AttentionParams& p) {
  const KernelRecord* kernel = nullptr;
  if (Status s = check_kernel(p, Backend::kDecode, &kernel); !s.ok()) return s;
  if (p.heads_kv > 0) {
    const int64_t blocks = p.batch * p.heads_kv * decode_row_tiles(p);
    if (blocks > INT32_MAX)
      return Status::NotSupported("backend 'decode' runs up to 2147483647 blocks (query row tiles x batch x heads_kv); "
                                  "got " + std::to_string(blocks));
  }
  // The tile height, and so the shared memory, depends on the query rows per kv head.
  int smem_optin = 0;
  if (Status s = max_shared_memory_per_block(p.device_id, &smem_optin); !s.ok()) return s;
  const int smem_needed = p.heads_kv > 0 ? decode_smem_bytes(p) : 0;
  if (smem_needed > smem_optin)
    return Status::NotSupported("backend 'decode' needs " + std::to_string(smem_needed) +
                                " bytes of shared memory per block for head_dim " + std::to_string(p.head_dim) +
                                "; device " + std::to_string(p.device_id) + " allows " + std::to_string(smem_optin));
  return Status::Ok();
}

Status decode_plan(const AttentionParams& p, ForwardPlan* plan) {
  const char* variant = decode_variant(p);
  if (Status st = device_splits(p, variant, &plan->num_splits); !st.ok()) return st;
  plan->merge = plan->num_splits == 1 ? "" : (merge_in_kernel(p) ? "in-kernel" : "combine-kernel");
  if (plan->num_splits > 1) {
    DeviceGuard guard(p.device_id);
    if (!guard.status().ok()) return guard.status();
    int extra_smem = 0;
    if (decode_cluster(p, variant, &plan->num_splits, &extra_smem)) plan->merge = "cluster";
  }
  return plan_kernel(Backend::kDecode, variant, p, plan);
}

Status decode_forward(const AttentionParams& p, void* stream) {
  DeviceGuard guard(p.device_id);
  if (!guard.status().ok()) return guard.status();
  const auto s = static_cast<cudaStream_t>(stream);
  DecodeSplit split;
  const char* variant = decode_variant(p);
  if (Status st = device_splits(p, variant, &split.num_splits); !st.ok()) return st;
  if (split.num_splits == 1) return launch(p, variant, split, s);
  const int unclustered = split.num_splits;
  if (decode_cluster(p, variant, &split.num_splits, &split.extra_smem)) {
    split.cluster = true;
    const Status clustered = launch(p, variant, split, s);
    if (clustered.code() != StatusCode::kNotSupported) return clustered;
    split.cluster = false;  // the tensor maps were refused: the pieces go through global memory
    split.extra_smem = 0;
    split.num_splits = unclustered;
  }

  // Pieces: O (fp32) [split][b][i][h][d] and LSE [split][b][h][i]. Under a wave, splits x blocks
  // <= 2 x SMs, so at most 2 x SMs x 64 rows (8.7 MB at head dim 128 on an H100); past it (16-row
  // tiles, splits_for_last_wave) at most 4 x 6 x SMs pieces of 16 rows (26 MB there), kept by the pool. Then,
  // for the merge in the kernel, an arrival counter per row tile of each (sequence, kv head).
  const bool in_kernel = merge_in_kernel(p);
  const size_t floats = static_cast<size_t>(split.num_splits) * p.batch * p.seqlen_q * p.heads;
  const size_t counters = in_kernel ? static_cast<size_t>(p.batch * p.heads_kv * decode_row_tiles(p)) : 0;
  PoolWorkspace workspace(p.device_id, floats * (p.head_dim + 1) * sizeof(float) + counters * sizeof(int), s,
                          "decode split-KV workspace");
  if (!workspace.status().ok()) return workspace.status();
  split.o_accum = static_cast<float*>(workspace.get());
  split.lse_accum = split.o_accum + floats * p.head_dim;
  Status status = Status::Ok();
  if (in_kernel) {
    // The counters start at 0: cleared in this stream, right before the kernel (by a kernel whose
    // run the TMA decode kernel's setup overlaps). They live in this
    // call's workspace, which no other launch touches between its stream-ordered allocation and
    // free (a concurrent call on another stream, or another graph, gets other memory), so calls on
    // any streams and replays of captured graphs never share counters.
    split.arrivals = reinterpret_cast<int*>(split.lse_accum + floats);
    status = zero_decode_arrivals(split.arrivals, static_cast<int64_t>(counters), s);
  }
  if (status.ok()) status = launch(p, variant, split, s);
  if (status.ok() && !in_kernel) status = combine_pieces(p, split, s);
  const Status freed = workspace.release();
  return status.ok() ? freed : status;
}

}  // namespace waveboost::cuda
