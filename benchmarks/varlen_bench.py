"""Varlen prefill benchmark: waveboost.attention_varlen against the dense call on the same tokens, bf16.

Each row times one prefill-shaped workload two ways on the same backend: as a dense batch
(B, L, H, D) and packed (sum L_i, H, D) through attention_varlen (cu_seqlens, max_seqlen given, so
nothing is read on the host). With equal lengths the two do the same work, so the ratio
varlen / dense is the cost of the sequence layout. Uneven lengths (the same total tokens, one
long sequence among short ones) have no dense twin doing the same FLOPs: their TFLOP/s (the
per-sequence FLOPs, halved for causal as a square mask would) is set beside the dense call's.
Paged rows run the same equal-length prefill with K/V in a shuffled paged cache (seqused_k)
against the packed varlen call.

Times: CUDA events around `inner` back-to-back calls after warm-up, median of `reps`.

With --dense-only, only the dense calls are timed (dense.csv), e.g. with an older build on
PYTHONPATH, to compare the dense path before and after a change on the same machine in one run.

    python benchmarks/varlen_bench.py --out DIR [--dense-only]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics

import torch

import waveboost


def time_ms(fn, reps=15, inner=5, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def flops(lengths_q, lengths_k, heads, d, causal):
    total = sum(4.0 * lq * lk * heads * d for lq, lk in zip(lengths_q, lengths_k))
    return total / 2 if causal else total


def cu(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    dt = torch.bfloat16
    info = waveboost.info()
    backends = [b for b in ("mma", "wgmma") if b in info["backends"]]
    heads = 16
    batch, seqlen = 8, 2048
    uneven = [6144, 512, 1024, 2048, 256, 3072, 1536, 1792]  # 16384 tokens, as 8 x 2048
    assert sum(uneven) == batch * seqlen
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            q4 = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=dt)
            k4 = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=dt)
            v4 = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=dt)
            q3, k3, v3 = (x.reshape(batch * seqlen, heads, d) for x in (q4, k4, v4))
            cu_eq, cu_un = cu([seqlen] * batch), cu(uneven)
            out3 = torch.empty_like(q3)
            # A paged copy of K/V: pages of `ps` keys, shuffled, each sequence's pages in its table row.
            paged = {}
            for ps in (16, 256):
                per_seq = seqlen // ps
                perm = torch.randperm(batch * per_seq, device="cuda")
                table = perm.reshape(batch, per_seq).to(torch.int32)
                kp = torch.empty(batch * per_seq, ps, heads, d, device="cuda", dtype=dt)
                vp = torch.empty_like(kp)
                kp[perm] = k4.reshape(batch * per_seq, ps, heads, d)
                vp[perm] = v4.reshape(batch * per_seq, ps, heads, d)
                paged[ps] = (kp, vp, table)
            used = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
            for backend in backends + ["auto"]:
                dense = time_ms(lambda: waveboost.attention(q4, k4, v4, causal=causal, backend=backend))
                if args.dense_only:
                    rows.append({"backend": backend, "head_dim": d, "causal": int(causal), "heads": heads,
                                 "dense_8x2048_ms": round(dense, 4)})
                    print(rows[-1], flush=True)
                    continue
                eq = time_ms(lambda: waveboost.attention_varlen(q3, k3, v3, cu_eq, cu_eq, max_seqlen_q=seqlen,
                                                                max_seqlen_k=seqlen, causal=causal, out=out3,
                                                                backend=backend))
                un = time_ms(lambda: waveboost.attention_varlen(q3, k3, v3, cu_un, cu_un, max_seqlen_q=max(uneven),
                                                                max_seqlen_k=max(uneven), causal=causal, out=out3,
                                                                backend=backend))
                f_eq = flops([seqlen] * batch, [seqlen] * batch, heads, d, causal)
                f_un = flops(uneven, uneven, heads, d, causal)
                row = {"backend": backend, "head_dim": d, "causal": int(causal), "heads": heads,
                       "dense_8x2048_ms": round(dense, 4), "varlen_8x2048_ms": round(eq, 4),
                       "varlen_over_dense": round(eq / dense, 4),
                       "dense_tflops": round(f_eq / dense / 1e9, 1), "varlen_tflops": round(f_eq / eq / 1e9, 1),
                       "uneven_ms": round(un, 4), "uneven_tflops": round(f_un / un / 1e9, 1)}
                for ps, (kp, vp, table) in paged.items():
                    t = time_ms(lambda: waveboost.attention_varlen(q3, kp, vp, cu_eq, None, max_seqlen_q=seqlen,
                                                                   block_table=table, seqused_k=used, causal=causal,
                                                                   out=out3, backend=backend))
                    row[f"paged{ps}_ms"] = round(t, 4)
                    row[f"paged{ps}_over_varlen"] = round(t / eq, 4)
                rows.append(row)
                print(row, flush=True)
    with open(os.path.join(args.out, "dense.csv" if args.dense_only else "varlen.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.dense_only:
        return
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(f"device: {info.get('gpu')}; waveboost {info['version']}; bf16, {heads} heads (MHA), "
                f"8 x 2048 tokens; uneven lengths {uneven}\n\n")
        f.write("| backend | D | causal | dense ms | varlen ms | varlen/dense | dense TFLOP/s | varlen TFLOP/s "
                "| uneven ms | uneven TFLOP/s | paged16 ms (/varlen) | paged256 ms (/varlen) |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['backend']} | {r['head_dim']} | {r['causal']} | {r['dense_8x2048_ms']:.3f} | "
                    f"{r['varlen_8x2048_ms']:.3f} | {r['varlen_over_dense']:.3f} | {r['dense_tflops']} | "
                    f"{r['varlen_tflops']} | {r['uneven_ms']:.3f} | {r['uneven_tflops']} | "
                    f"{r['paged16_ms']:.3f} ({r['paged16_over_varlen']:.3f}) | "
                    f"{r['paged256_ms']:.3f} ({r['paged256_over_varlen']:.3f}) |\n")


if __name__ == "__main__":
    main()
