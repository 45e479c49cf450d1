// Runs waveboost's CPU path through the public C++ API and checks it against a
// float64 reference written here; also checks that bad params get a clear status.
#include <waveboost/attention.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdio>
#include <random>
#include <vector>

namespace {

// softmax(scale * q k^T) v for one (batch, head, query row), causal bottom-right.
void reference_row(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                   const waveboost::AttentionParams& p, int64_t b, int64_t h, int64_t i, double* out) {
  const int64_t hk = h / (p.heads / p.heads_kv);
  const int64_t visible = p.is_causal ? std::min(p.seqlen_k, std::max<int64_t>(0, i + 1 + p.seqlen_k - p.seqlen_q))
                                      : p.seqlen_k;
  std::vector<double> s(visible);
  double row_max = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d)
      dot += double(q[b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride + d]) *
             k[b * p.k_batch_stride + j * p.k_row_stride + hk * p.k_head_stride + d];
    s[j] = dot * p.softmax_scale;
    row_max = std::max(row_max, s[j]);
  }
  double row_sum = 0;
  for (double& x : s) row_sum += (x = std::exp(x - row_max));
  for (int64_t d = 0; d < p.head_dim; ++d) {
    double acc = 0;
    for (int64_t j = 0; j < visible; ++j) acc += s[j] * v[b * p.v_batch_stride + j * p.v_row_stride + hk * p.v_head_stride + d];
    out[d] = visible ? acc / row_sum : 0.0;
  }
}

}  // namespace

int main() {
  const int64_t B = 2, Lq = 37, Lk = 53, H = 4, Hkv = 2, D = 64;
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal;
  std::vector<float> q(B * Lq * H * D), k(B * Lk * Hkv * D), v(B * Lk * Hkv * D), out(q.size(), NAN);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(gen);

  waveboost::AttentionParams p;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
  p.q_batch_stride = Lq * H * D, p.q_row_stride = H * D, p.q_head_stride = D;
  p.k_batch_stride = Lk * Hkv * D, p.k_row_stride = Hkv * D, p.k_head_stride = D;
  p.v_batch_stride = p.k_batch_stride, p.v_row_stride = p.k_row_stride, p.v_head_stride = p.k_head_stride;
  p.o_batch_stride = p.q_batch_stride, p.o_row_stride = p.q_row_stride, p.o_head_stride = p.q_head_stride;
  p.batch = B, p.seqlen_q = Lq, p.seqlen_k = Lk, p.heads = H, p.heads_kv = Hkv, p.head_dim = D;
  p.softmax_scale = 1.0 / std::sqrt(double(D));
  p.dtype = waveboost::DType::kFloat32;
  p.device_type = waveboost::DeviceType::kCPU;

  int failures = 0, checks = 3;
  for (bool causal : {false, true}) {
    p.is_causal = causal;
    const waveboost::Status s = waveboost::attention_forward(p, waveboost::Backend::kAuto, nullptr);
    if (!s.ok()) {
      std::printf("attention_forward failed: %s\n", s.message().c_str());
      return 1;
    }
    double max_err = 0;
    std::vector<double> ref(D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          reference_row(q, k, v, p, b, h, i, ref.data());
          for (int64_t d = 0; d < D; ++d) {
            const double got = out[b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride + d];
            max_err = std::isnan(got) ? INFINITY : std::max(max_err, std::abs(got - ref[d]));
          }
        }
    std::printf("causal=%d max|out - ref| = %.3g\n", causal, max_err);
    failures += !(max_err < 1e-5);
  }

  waveboost::AttentionParams bad = p;
  bad.heads_kv = 3;
  const waveboost::Status s = waveboost::attention_forward(bad, waveboost::Backend::kCPU, nullptr);
  std::printf("heads_kv=3 -> %s\n", s.message().c_str());
  failures += s.code() != waveboost::StatusCode::kInvalidArgument;

  // softmax_scale left at its default (kDefaultSoftmaxScale) means 1 / sqrt(head_dim): the same bits
  // as passing that scale explicitly.
  {
    waveboost::AttentionParams defaulted = p;
    defaulted.softmax_scale = waveboost::AttentionParams{}.softmax_scale;
    std::vector<float> out_default(out.size(), NAN);
    defaulted.out = out_default.data();
    const waveboost::Status sd = waveboost::attention_forward(defaulted, waveboost::Backend::kCPU, nullptr);
    const bool same = sd.ok() && std::isnan(defaulted.softmax_scale) &&
                      std::equal(out.begin(), out.end(), out_default.begin());  // p ran last with is_causal = true
    std::printf("default softmax_scale -> %s\n", same ? "1/sqrt(head_dim), bitwise" : "MISMATCH");
    failures += !same;
    ++checks;
  }

  // Impossible layouts get kInvalidArgument naming the stride; broadcasts (stride 0) of inputs are fine.
  auto expect_invalid = [&](const char* what, waveboost::AttentionParams params, const char* field) {
    const waveboost::Status st = waveboost::attention_forward(params, waveboost::Backend::kAuto, nullptr);
    const bool ok = st.code() == waveboost::StatusCode::kInvalidArgument && st.message().find(field) != std::string::npos;
    std::printf("%s -> %s\n", what, st.message().c_str());
    failures += !ok;
    ++checks;
  };
  {
    waveboost::AttentionParams bad_stride = p;
    bad_stride.q_row_stride = 1;
    expect_invalid("q_row_stride=1", bad_stride, "q_row_stride is 1 but head_dim is 64");
    bad_stride = p;
    bad_stride.k_head_stride = D / 2;
    expect_invalid("k_head_stride=head_dim/2", bad_stride, "k_head_stride");
    bad_stride = p;
    bad_stride.o_batch_stride = 0;
    expect_invalid("o_batch_stride=0", bad_stride, "o_batch_stride");
    bad_stride = p;
    bad_stride.o_head_stride = Lq * D, bad_stride.o_row_stride = D;  // rows and heads interleaved: (H, Lq, D) view
    bad_stride.o_batch_stride = H * D;  // ...but batches step only one row of heads: they overlap
    expect_invalid("out batches overlapping rows", bad_stride, "must not overlap itself");
  }
  {
    waveboost::AttentionParams broadcast = p;
    broadcast.is_causal = false;
    broadcast.k_batch_stride = 0, broadcast.v_batch_stride = 0;  // every batch reads batch 0's keys
    const waveboost::Status sb = waveboost::attention_forward(broadcast, waveboost::Backend::kAuto, nullptr);
    std::printf("k, v batch-broadcast -> %s\n", sb.ok() ? "ok" : sb.message().c_str());
    failures += !sb.ok();
    ++checks;
  }

  // A paged decode step: append every key of the dense batch into a paged cache (shuffled pages),
  // then attend with the last query row of each sequence; it must match that row of the dense call.
  {
    const int64_t page_size = 8, max_pages = 8, num_pages = B * max_pages + 1;
    std::vector<float> k_pages(num_pages * page_size * Hkv * D, NAN), v_pages(k_pages.size(), NAN);
    std::vector<int32_t> block_table(B * max_pages), cache_seqlens(B, 0), seqused(B, -1);
    for (int64_t i = 0; i < B * max_pages; ++i) block_table[i] = static_cast<int32_t>((i * 5 + 3) % num_pages);
    waveboost::KVCacheAppendParams a;
    a.k_cache = k_pages.data(), a.v_cache = v_pages.data();
    a.kc_batch_stride = page_size * Hkv * D, a.kc_row_stride = Hkv * D, a.kc_head_stride = D;
    a.vc_batch_stride = a.kc_batch_stride, a.vc_row_stride = a.kc_row_stride, a.vc_head_stride = a.kc_head_stride;
    a.k_new = k.data(), a.v_new = v.data();
    a.kn_batch_stride = p.k_batch_stride, a.kn_row_stride = p.k_row_stride, a.kn_head_stride = p.k_head_stride;
    a.vn_batch_stride = p.v_batch_stride, a.vn_row_stride = p.v_row_stride, a.vn_head_stride = p.v_head_stride;
    a.cache_seqlens = cache_seqlens.data(), a.seqused_out = seqused.data();
    a.block_table = block_table.data(), a.block_table_batch_stride = max_pages;
    a.page_size = page_size, a.num_pages = num_pages, a.capacity = max_pages * page_size;
    a.batch = B, a.seqlen_new = Lk, a.heads_kv = Hkv, a.head_dim = D;
    a.dtype = waveboost::DType::kFloat32, a.device_type = waveboost::DeviceType::kCPU;
    waveboost::Status st = waveboost::kv_cache_append(a, nullptr);

    std::vector<float> decode_out(B * H * D, NAN);
    waveboost::AttentionParams d = p;
    d.is_causal = false;
    d.q = q.data() + (Lq - 1) * p.q_row_stride;  // the last query row of each sequence
    d.out = decode_out.data();
    d.o_batch_stride = H * D, d.o_row_stride = H * D, d.o_head_stride = D;
    d.seqlen_q = 1;
    d.k = k_pages.data(), d.v = v_pages.data();
    d.k_batch_stride = a.kc_batch_stride, d.k_row_stride = a.kc_row_stride, d.k_head_stride = a.kc_head_stride;
    d.v_batch_stride = d.k_batch_stride, d.v_row_stride = d.k_row_stride, d.v_head_stride = d.k_head_stride;
    d.seqlen_k = max_pages * page_size;
    d.block_table = block_table.data(), d.block_table_batch_stride = max_pages;
    d.page_size = page_size, d.num_pages = num_pages;
    d.seqused_k = seqused.data();
    if (st.ok()) st = waveboost::attention_forward(d, waveboost::Backend::kAuto, nullptr);
    double max_err = st.ok() ? 0 : INFINITY;
    std::vector<double> ref(D);
    p.is_causal = false;
    for (int64_t b = 0; b < B && st.ok(); ++b)
      for (int64_t h = 0; h < H; ++h) {
        reference_row(q, k, v, p, b, h, Lq - 1, ref.data());
        for (int64_t e = 0; e < D; ++e) {
          const double got = decode_out[b * H * D + h * D + e];
          max_err = std::isnan(got) ? INFINITY : std::max(max_err, std::abs(got - ref[e]));
        }
      }
    std::printf("paged decode (%s) max|out - ref| = %.3g, seqused = %d\n", st.ok() ? "ok" : st.message().c_str(),
                max_err, seqused[0]);
    failures += !(max_err < 1e-5 && seqused[0] == Lk && seqused[B - 1] == Lk);
    ++checks;
  }

  {  // What a call would launch, and the kernel table (empty without CUDA; names unique).
    waveboost::ForwardPlan plan;
    p.is_causal = true;
    const waveboost::Status st = waveboost::plan_forward(p, waveboost::Backend::kAuto, &plan);
    const std::vector<waveboost::KernelInfo> table = waveboost::kernel_table();
    bool unique = true;
    for (size_t i = 0; i < table.size(); ++i)
      for (size_t j = i + 1; j < table.size(); ++j) unique = unique && table[i].name != table[j].name;
    std::printf("plan -> %s, %s, %d piece(s); %zu compiled CUDA kernels\n", st.ok() ? "ok" : st.message().c_str(),
                plan.kernel.c_str(), plan.num_splits, table.size());
    failures += !(st.ok() && plan.backend == waveboost::Backend::kCPU && plan.kernel == "cpu" && plan.num_splits == 1 &&
                  unique && table.empty() == !waveboost::cuda_compiled());
    ++checks;
  }

  std::printf("waveboost %s, CUDA compiled: %s\n", waveboost::version(), waveboost::cuda_compiled() ? "yes" : "no");
  std::printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
