"""How fast can a kernel read HBM on this GPU? The ceiling that decode's "% of peak" should be read against.

    python benchmarks/hbm_read_ceiling.py [--gib 4] [--repeats 20] [--peak-gbs G]

Decode streams the KV cache once, so its speed is a fraction of the bandwidth a plain read reaches. This
times kernels that do nothing but read a buffer far larger than L2 (random contents), in two forms:
  v4    every thread loads 16 B at a time (ld.global.nc), U loads in flight per thread, grid-stride;
  bulk  one thread per block streams chunks into shared memory by cp.async.bulk (the 1-D TMA copy the
        decode kernel's boxes use) through a ring of S stages behind mbarriers (sm_90+);
over a sweep of launch shapes, and prints GB/s and % of the device's peak per shape, then the best of each
form. Timed with CUDA events, the median of --repeats launches after 3 warm-up launches. Needs CuPy.
"""
from __future__ import annotations

import argparse
import statistics

import cupy as cp

V4 = r"""
extern "C" __global__ void read_v4(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
  unsigned acc = 0;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * U;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x * U + threadIdx.x;
       i + (U - 1) * (unsigned long long)blockDim.x < n; i += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; practically never taken
}
"""

BULK = r"""
__device__ __forceinline__ void wait_parity(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}

extern "C" __global__ void read_bulk(const char* __restrict__ p, unsigned long long chunks, unsigned chunk_bytes,
                                     unsigned* out) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long bars[S];
  if (threadIdx.x != 0) return;
  const unsigned ring_base = (unsigned)__cvta_generic_to_shared(ring);
  const unsigned bar_base = (unsigned)__cvta_generic_to_shared(bars);
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_base + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  unsigned long long it = 0;
  for (unsigned long long c = blockIdx.x; c < chunks; c += gridDim.x, ++it) {
    const int s = (int)(it % S);
    const unsigned use = (unsigned)(it / S);
    const unsigned bar = bar_base + 8 * s;
    if (use > 0) wait_parity(bar, (use - 1) & 1);  // this stage's previous copy landed
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(chunk_bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(ring_base + s * chunk_bytes), "l"(p + c * chunk_bytes), "r"(chunk_bytes), "r"(bar)
                 : "memory");
  }
  for (int s = 0; s < S; ++s) {  // the last copy of each stage
    if ((unsigned long long)s < it) {
      const unsigned long long last = it - 1 - ((it - 1 - s) % S);  // last iteration that used stage s
      wait_parity(bar_base + 8 * s, (unsigned)((last / S) & 1));
    }
  }
  if (*(volatile const unsigned*)ring == 0x9e3779b9u && blockIdx.x == 0x7fffffff) out[0] = 1;
}
"""


def time_ms(launch, repeats: int) -> float:
    for _ in range(3):
        launch()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--peak-gbs", type=float, default=None, help="default: waveboost.bench's table for the device")
    args = ap.parse_args()

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode()
    sms = props["multiProcessorCount"]
    peak = args.peak_gbs
    if peak is None:
        try:
            from waveboost.bench.hardware import peak_bandwidth

            peak = peak_bandwidth("cuda", name, ordinal=dev.id)[0]
        except ImportError:  # the table is waveboost's; without it, no percentages
            peak = None
    nbytes = int(args.gib * 2**30) // (1 << 20) * (1 << 20)
    buf = cp.random.randint(1, 2**31 - 1, size=nbytes // 4, dtype=cp.int32)
    out = cp.zeros(1, dtype=cp.uint32)
    print(f"{name}, {sms} SMs, {nbytes / 2**30:.2f} GiB read per launch, peak {peak} GB/s")

    rows = []

    def record(form, shape, ms):
        gbs = nbytes / ms / 1e6
        pct = f"{100 * gbs / peak:.1f}%" if peak else "-"
        rows.append((form, shape, gbs))
        print(f"{form:5s} {shape:42s} {ms:8.3f} ms {gbs:8.0f} GB/s {pct}")

    n16 = nbytes // 16
    for unroll in (4, 8, 16):
        kern = cp.RawKernel(V4, "read_v4", options=(f"-DU={unroll}",))
        for threads in (256, 512, 1024):
            for per_sm in (1, 2, 4, 8):
                if threads * per_sm > 2048:
                    continue
                grid = sms * per_sm
                ms = time_ms(lambda: kern((grid,), (threads,), (buf, cp.uint64(n16), out)), args.repeats)
                record("v4", f"U={unroll} threads={threads} blocks/SM={per_sm}", ms)

    for stages in (2, 4, 8):
        kern = cp.RawKernel(BULK, "read_bulk", options=(f"-DS={stages}",))
        for chunk_kib in (8, 16, 32):
            chunk = chunk_kib << 10
            smem = stages * chunk
            for per_sm in (1, 2, 4):
                if smem * per_sm > 220 * 1024 or smem > 227 * 1024:
                    continue
                kern.max_dynamic_shared_size_bytes = smem
                grid = sms * per_sm
                chunks = nbytes // chunk
                ms = time_ms(lambda: kern((grid,), (32,), (buf, cp.uint64(chunks), cp.uint32(chunk), out),
                                          shared_mem=smem), args.repeats)
                record("bulk", f"stages={stages} chunk={chunk_kib}KiB blocks/SM={per_sm}", ms)

    print()
    for form in ("v4", "bulk"):
        best = max((r for r in rows if r[0] == form), key=lambda r: r[2])
        pct = f" ({100 * best[2] / peak:.1f}% of {peak:.0f})" if peak else ""
        print(f"best {form}: {best[2]:.0f} GB/s{pct} at {best[1]}")


if __name__ == "__main__":
    main()
