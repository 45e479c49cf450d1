// The backward pass on the host (backend "cpu"): the reference backward and the CPU user's
// training path, fp32 and fp64, any head dim.
//
// With S = scale * Q K^T (causal: bottom-right mask), P = softmax(S) row by row, O = P V:
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D + dlse)  with D_i = rowsum(dO_i * O_i),
//   dQ = scale * dS K,   dK = scale * dS^T Q.
// (dlse, the gradient flowing into lse = log rowsum(exp S), adds dlse_i * P_ij to dS.)
//
// Nothing of size seqlen_q x seqlen_k is stored: P is recomputed tile by tile, twice.
//  1. One task per (batch, head, block of kBlockM query rows) computes its rows' statistics
//     (lse, D) into two (batch, heads, seqlen_q) buffers, then dQ for those rows.
//  2. One task per (batch, kv head, block of kBlockN keys) computes dK and dV for those keys,
//     summing over every query head of the kv head's group (GQA) and every query row.
// Each element of dq, dk and dv is written by one task, and each task's arithmetic follows a
// fixed order that depends only on its index: the gradients are bitwise reproducible whatever
// the thread count (deterministic by construction; the `deterministic` flag changes nothing).
//
// P is exp(S - lse) with the caller's lse, as on every backend: a caller may pass an lse over
// more keys than this call sees (ring attention passes the merged lse of every KV shard, with the
// merged out), and D then uses that out. The lse is float32, though, which would cap float64
// gradients at float32 accuracy; so each row's logsumexp over this call's keys is recomputed in
// the working precision, and it replaces the given one when the two agree to within float32
// rounding (the given one is then that value rounded, and the recomputed one the same number
// more precisely).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "cpu_attention.h"
#include "thread_pool.h"

// The per-task functions are always inlined into the wrappers below, which are compiled for
// AVX-512, AVX2+FMA or the baseline instruction set and picked at run time (as the forward's
// kernels are): the axpy loops then vectorize at the host's full width.
#define CPU_BWD_INLINE inline __attribute__((always_inline))

namespace waveboost::cpu {
namespace {

constexpr int64_t kBlockM = 64;  // query rows per tile
constexpr int64_t kBlockN = 64;  // keys per tile

// Where one (batch, head) of each tensor starts, and the causal bounds.
template <typename T>
struct Problem {
  const AttentionBackwardParams& p;
  T scale;
  int64_t causal_offset;  // query i sees key j iff j <= i + causal_offset (causal only)

  explicit Problem(const AttentionBackwardParams& params)
      : p(params), scale(static_cast<T>(params.softmax_scale)), causal_offset(params.seqlen_k - params.seqlen_q) {}

  int64_t group() const { return p.heads / p.heads_kv; }

  const T* q_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
  }
  const T* k_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<const T*>(p.k) + b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride;
  }
  const T* v_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<const T*>(p.v) + b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride;
  }
  const T* o_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
  }
  const T* do_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(p.dout) + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
  }
  T* dq_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<T*>(p.dq) + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride;
  }
  T* dk_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<T*>(p.dk) + b * p.dk_batch_stride + j * p.dk_row_stride + hk * p.dk_head_stride;
  }
  T* dv_row(int64_t b, int64_t hk, int64_t j) const {
    return static_cast<T*>(p.dv) + b * p.dv_batch_stride + j * p.dv_row_stride + hk * p.dv_head_stride;
  }
  T dlse(int64_t b, int64_t h, int64_t i) const {
    if (p.dlse == nullptr) return T(0);
    return static_cast<T>(p.dlse[b * p.dlse_batch_stride + h * p.dlse_head_stride + i]);
  }

  float lse(int64_t b, int64_t h, int64_t i) const {
    return p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i];
  }

  // Keys [0, visible_keys(i)) are those query i sees.
  int64_t visible_keys(int64_t i) const {
    if (!p.is_causal) return p.seqlen_k;
    return std::clamp<int64_t>(i + causal_offset + 1, 0, p.seqlen_k);
  }
  // Queries [first_query(j), seqlen_q) are those that see key j.
  int64_t first_query(int64_t j) const {
    if (!p.is_causal) return 0;
    return std::clamp<int64_t>(j - causal_offset, 0, p.seqlen_q);
  }
};

// The lse a row's P uses: the caller's float32 `given`, or `local` (this call's keys, in the
// working precision) where `given` is `local` rounded to float32 (two float32 ulps allow for
// the rounding of the forward's own arithmetic).
template <typename T>
CPU_BWD_INLINE T refined_lse(float given, T local) {
  if (!std::isfinite(given) || !std::isfinite(local)) return static_cast<T>(given);
  const float magnitude = std::fabs(given);
  const T ulp = static_cast<T>(std::nextafter(magnitude, std::numeric_limits<float>::infinity()) - magnitude);
  return std::fabs(static_cast<T>(given) - local) <= 2 * ulp ? local : static_cast<T>(given);
}

// Keys [j0, j0 + n) of one kv head packed transposed: kt[d * kBlockN + j] = k[j0 + j][d], so
// score rows are built from contiguous axpy steps (vectorizable without reassociation).
template <typename T>
CPU_BWD_INLINE void pack_transposed(const Problem<T>& pr, bool values, int64_t b, int64_t hk, int64_t j0, int64_t n, T* out) {
  const int64_t d_count = pr.p.head_dim;
  for (int64_t j = 0; j < n; ++j) {
    const T* row = values ? pr.v_row(b, hk, j0 + j) : pr.k_row(b, hk, j0 + j);
    for (int64_t d = 0; d < d_count; ++d) out[d * kBlockN + j] = row[d];
  }
}

// dst[0, n) = sum_d x[d] * packed[d][0, n), in order of d.
template <typename T>
CPU_BWD_INLINE void row_times_packed(const T* x, const T* packed, int64_t head_dim, int64_t n, T* dst) {
  std::fill(dst, dst + n, T(0));
  for (int64_t d = 0; d < head_dim; ++d) {
    const T xd = x[d];
    const T* col = packed + d * kBlockN;
    for (int64_t j = 0; j < n; ++j) dst[j] += xd * col[j];
  }
}

// acc[0, head_dim) += a * x[0, head_dim)
template <typename T>
CPU_BWD_INLINE void axpy(T a, const T* x, int64_t head_dim, T* acc) {
  for (int64_t d = 0; d < head_dim; ++d) acc[d] += a * x[d];
}

// Task of phase 1: statistics and dQ of query rows [i0, i0 + m) of head h.
template <typename T>
CPU_BWD_INLINE void query_block(const Problem<T>& pr, int64_t b, int64_t h, int64_t i0, int64_t m, T* lse_buf, T* delta_buf) {
  const AttentionBackwardParams& p = pr.p;
  const int64_t head_dim = p.head_dim, hk = h / pr.group();
  const int64_t stat = (b * p.heads + h) * p.seqlen_q;  // this head's offset in the statistics buffers
  const int64_t keys_needed = pr.visible_keys(i0 + m - 1);  // the block's last row sees the most keys
  std::vector<T> kt(static_cast<size_t>(head_dim * kBlockN)), vt(kt.size());
  std::vector<T> s(kBlockN), dp(kBlockN);

  // Sweep 1: each row's running max and sum (online softmax) over its visible keys, then lse;
  // and D = dO . O.
  std::vector<T> row_max(m, -std::numeric_limits<T>::infinity()), row_sum(m, T(0));
  for (int64_t j0 = 0; j0 < keys_needed; j0 += kBlockN) {
    const int64_t n = std::min(kBlockN, keys_needed - j0);
    pack_transposed(pr, false, b, hk, j0, n, kt.data());
    for (int64_t r = 0; r < m; ++r) {
      const int64_t visible = std::min(n, pr.visible_keys(i0 + r) - j0);
      if (visible <= 0) continue;
      row_times_packed(pr.q_row(b, h, i0 + r), kt.data(), head_dim, visible, s.data());
      T tile_max = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < visible; ++j) tile_max = std::max(tile_max, s[j] * pr.scale);
      const T new_max = std::max(row_max[r], tile_max);
      T sum = row_sum[r] * std::exp(row_max[r] - new_max);
      for (int64_t j = 0; j < visible; ++j) sum += std::exp(s[j] * pr.scale - new_max);
      row_max[r] = new_max, row_sum[r] = sum;
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = i0 + r;
    const T local = row_sum[r] > T(0) ? row_max[r] + std::log(row_sum[r]) : -std::numeric_limits<T>::infinity();
    lse_buf[stat + i] = refined_lse(pr.lse(b, h, i), local);
    const T* o = pr.o_row(b, h, i);
    const T* dout = pr.do_row(b, h, i);
    T dot = 0;
    for (int64_t d = 0; d < head_dim; ++d) dot += dout[d] * o[d];
    delta_buf[stat + i] = dot;
  }

  // Sweep 2: dQ.
  std::vector<T> acc(static_cast<size_t>(m * head_dim), T(0));  // dQ / scale of the block
  for (int64_t j0 = 0; j0 < keys_needed; j0 += kBlockN) {
    const int64_t n = std::min(kBlockN, keys_needed - j0);
    pack_transposed(pr, false, b, hk, j0, n, kt.data());
    pack_transposed(pr, true, b, hk, j0, n, vt.data());
    for (int64_t r = 0; r < m; ++r) {
      const int64_t i = i0 + r;
      const T lse = lse_buf[stat + i];
      const int64_t visible = std::min(n, pr.visible_keys(i) - j0);
      if (visible <= 0 || std::isinf(lse)) continue;
      row_times_packed(pr.q_row(b, h, i), kt.data(), head_dim, visible, s.data());
      row_times_packed(pr.do_row(b, h, i), vt.data(), head_dim, visible, dp.data());
      const T shift = delta_buf[stat + i] - pr.dlse(b, h, i);
      T* acc_row = acc.data() + r * head_dim;
      for (int64_t j = 0; j < visible; ++j) {
        const T prob = std::exp(s[j] * pr.scale - lse);
        const T ds = prob * (dp[j] - shift);
        if (ds != T(0)) axpy(ds, pr.k_row(b, hk, j0 + j), head_dim, acc_row);
      }
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    T* dq = pr.dq_row(b, h, i0 + r);
    const T* a = acc.data() + r * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) dq[d] = a[d] * pr.scale;
  }
}

// Task of phase 2: dK and dV of keys [j0, j0 + n) of kv head hk, over its query heads.
template <typename T>
CPU_BWD_INLINE void key_block(const Problem<T>& pr, int64_t b, int64_t hk, int64_t j0, int64_t n, const T* lse_buf,
               const T* delta_buf) {
  const AttentionBackwardParams& p = pr.p;
  const int64_t head_dim = p.head_dim;
  std::vector<T> kt(static_cast<size_t>(head_dim * kBlockN)), vt(kt.size());
  pack_transposed(pr, false, b, hk, j0, n, kt.data());
  pack_transposed(pr, true, b, hk, j0, n, vt.data());
  std::vector<T> dk_acc(static_cast<size_t>(n * head_dim), T(0));  // dK / scale of the block
  std::vector<T> dv_acc(dk_acc.size(), T(0));
  std::vector<T> s(kBlockN), dp(kBlockN);
  const int64_t first = pr.first_query(j0);  // the block's first key is seen by the most rows
  for (int64_t h = hk * pr.group(); h < (hk + 1) * pr.group(); ++h) {
    const int64_t stat = (b * p.heads + h) * p.seqlen_q;
    for (int64_t i = first; i < p.seqlen_q; ++i) {
      const T lse = lse_buf[stat + i];
      const int64_t visible = std::min(n, pr.visible_keys(i) - j0);
      if (visible <= 0 || std::isinf(lse)) continue;
      const T* q = pr.q_row(b, h, i);
      const T* dout = pr.do_row(b, h, i);
      row_times_packed(q, kt.data(), head_dim, visible, s.data());
      row_times_packed(dout, vt.data(), head_dim, visible, dp.data());
      const T shift = delta_buf[stat + i] - pr.dlse(b, h, i);
      for (int64_t j = 0; j < visible; ++j) {
        const T prob = std::exp(s[j] * pr.scale - lse);
        if (prob == T(0)) continue;
        axpy(prob, dout, head_dim, dv_acc.data() + j * head_dim);
        axpy(prob * (dp[j] - shift), q, head_dim, dk_acc.data() + j * head_dim);
      }
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    T* dk = pr.dk_row(b, hk, j0 + j);
    T* dv = pr.dv_row(b, hk, j0 + j);
    for (int64_t d = 0; d < head_dim; ++d) {
      dk[d] = dk_acc[j * head_dim + d] * pr.scale;
      dv[d] = dv_acc[j * head_dim + d];
    }
  }
}

template <typename T>
struct Tasks {
  using QueryBlock = void (*)(const Problem<T>&, int64_t, int64_t, int64_t, int64_t, T*, T*);
  using KeyBlock = void (*)(const Problem<T>&, int64_t, int64_t, int64_t, int64_t, const T*, const T*);
  QueryBlock query;
  KeyBlock key;
};

template <typename T>
void query_block_baseline(const Problem<T>& pr, int64_t b, int64_t h, int64_t i0, int64_t m, T* lse, T* delta) {
  query_block(pr, b, h, i0, m, lse, delta);
}
template <typename T>
void key_block_baseline(const Problem<T>& pr, int64_t b, int64_t hk, int64_t j0, int64_t n, const T* lse,
                        const T* delta) {
  key_block(pr, b, hk, j0, n, lse, delta);
}

#if defined(__x86_64__) || defined(__i386__)
#define WAVEBOOST_CPU_BWD_X86 1
template <typename T>
__attribute__((target("avx2,fma"))) void query_block_avx2(const Problem<T>& pr, int64_t b, int64_t h, int64_t i0,
                                                           int64_t m, T* lse, T* delta) {
  query_block(pr, b, h, i0, m, lse, delta);
}
template <typename T>
__attribute__((target("avx2,fma"))) void key_block_avx2(const Problem<T>& pr, int64_t b, int64_t hk, int64_t j0,
                                                         int64_t n, const T* lse, const T* delta) {
  key_block(pr, b, hk, j0, n, lse, delta);
}
template <typename T>
__attribute__((target("avx512f,avx2,fma"))) void query_block_avx512(const Problem<T>& pr, int64_t b, int64_t h,
                                                                    int64_t i0, int64_t m, T* lse, T* delta) {
  query_block(pr, b, h, i0, m, lse, delta);
}
template <typename T>
__attribute__((target("avx512f,avx2,fma"))) void key_block_avx512(const Problem<T>& pr, int64_t b, int64_t hk,
                                                                  int64_t j0, int64_t n, const T* lse,
                                                                  const T* delta) {
  key_block(pr, b, hk, j0, n, lse, delta);
}
#endif

// The widest instruction set the host has; WAVEBOOST_CPU_ISA=avx2|baseline caps it, as for the forward.
template <typename T>
Tasks<T> select_tasks() {
#ifdef WAVEBOOST_CPU_BWD_X86
  __builtin_cpu_init();
  const char* cap = std::getenv("WAVEBOOST_CPU_ISA");
  const bool baseline_only = cap != nullptr && std::strcmp(cap, "baseline") == 0;
  const bool avx2_cap = cap != nullptr && std::strcmp(cap, "avx2") == 0;
  const bool avx2 = !baseline_only && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && !avx2_cap && __builtin_cpu_supports("avx512f")) return {query_block_avx512<T>, key_block_avx512<T>};
  if (avx2) return {query_block_avx2<T>, key_block_avx2<T>};
#endif
  return {query_block_baseline<T>, key_block_baseline<T>};
}

template <typename T>
Status run_backward(const AttentionBackwardParams& p) {
  static const Tasks<T> tasks = select_tasks<T>();
  const Problem<T> pr(p);
  std::vector<T> lse_buf, delta_buf;
  try {
    lse_buf.resize(static_cast<size_t>(p.batch * p.heads * p.seqlen_q));
    delta_buf.resize(lse_buf.size());
  } catch (const std::exception&) {
    return Status::Internal("backend 'cpu': out of memory for the backward's row statistics");
  }
  std::atomic<bool> failed{false};
  ThreadPool& pool = global_thread_pool();

  const int64_t q_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  pool.parallel_for(p.batch * p.heads * q_blocks, [&](int64_t task) {
    // Causal: the last blocks see the most keys; hand them out first.
    const int64_t block = q_blocks - 1 - task % q_blocks;
    const int64_t bh = task / q_blocks;
    const int64_t i0 = block * kBlockM;
    try {
      tasks.query(pr, bh / p.heads, bh % p.heads, i0, std::min(kBlockM, p.seqlen_q - i0), lse_buf.data(),
                  delta_buf.data());
    } catch (const std::exception&) {
      failed.store(true);
    }
  });
  if (failed.load()) return Status::Internal("backend 'cpu': out of memory for the backward's scratch");

  const int64_t k_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  pool.parallel_for(p.batch * p.heads_kv * k_blocks, [&](int64_t task) {
    // Causal: the first blocks are seen by the most rows; hand them out first.
    const int64_t block = task % k_blocks;
    const int64_t bh = task / k_blocks;
    const int64_t j0 = block * kBlockN;
    try {
      tasks.key(pr, bh / p.heads_kv, bh % p.heads_kv, j0, std::min(kBlockN, p.seqlen_k - j0), lse_buf.data(),
                delta_buf.data());
    } catch (const std::exception&) {
      failed.store(true);
    }
  });
  if (failed.load()) return Status::Internal("backend 'cpu': out of memory for the backward's scratch");
  return Status::Ok();
}

}  // namespace

Status can_implement_backward(const AttentionBackwardParams& params) {
  if (params.device_type != DeviceType::kCPU)
    return Status::NotSupported("backend 'cpu' runs on host memory; got tensors on a CUDA device");
  if (params.dtype != DType::kFloat32 && params.dtype != DType::kFloat64)
    return Status::NotSupported(std::string("backend 'cpu' computes the backward pass in float32 and float64; got ") +
                                dtype_name(params.dtype) + " (use a CUDA backend for half precision, or upcast)");
  return Status::Ok();
}

Status attention_backward(const AttentionBackwardParams& params) {
  if (Status s = can_implement_backward(params); !s.ok()) return s;
  if (params.batch == 0 || params.heads == 0) return Status::Ok();
  return params.dtype == DType::kFloat32 ? run_backward<float>(params) : run_backward<double>(params);
}

}  // namespace waveboost::cpu
