"""A small, representative set of waveboost calls for compute-sanitizer (tests/sanitize/run_sanitizer.sh).

Every CUDA path (naive, simt, wmma, mma) with each dtype it supports, head dims 64 and 128 (and a
non-specialized one on naive), causal and not, sequence tails on both sides, GQA/MQA, rows that see no
key, seqlen_k = 0, BHSD storage seen through transposes, and unaligned views (data pointer not 16-byte
aligned, odd strides) on the paths that take them. wgmma runs its TMA-pipeline kernel unless
WAVEBOOST_WGMMA_PIPELINE=cp.async is set (run_sanitizer.sh runs memcheck and racecheck both ways). mma's float32 kernel (3xTF32) and wgmma (compute
capability 9.0 only: skipped elsewhere) get a few calls each covering the same features, and wgmma's
split-KV route (small grid, long keys) two more; the serving calls include mma and wgmma on varlen
and paged inputs. Shapes are tiny
so racecheck and initcheck finish.

Outputs come from torch.empty (uninitialized) and are read afterwards, so an element a kernel fails to
write shows up as an initcheck error; the script also fails on a NaN in out or lse (inputs are finite).
It checks no numerics beyond that: tests/ does. Exit status 0 and a last line "run_cases: N calls OK".

    python tests/sanitize/run_cases.py [--list] [--forward-only] [--backward-only] [--serving-only] [--fp8-only]
                                       [--wgmma-only]
"""

from __future__ import annotations

import os
import sys

import torch

import waveboost

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}
PATH_DTYPES = {"naive": ["fp16", "bf16", "fp32"], "simt": ["fp16", "bf16", "fp32"], "wmma": ["fp16", "bf16"],
               "mma": ["fp16", "bf16"]}
# (batch, seqlen_q, seqlen_k, heads, heads_kv): tails everywhere; B has seqlen_q > seqlen_k, so causal
# leaves rows 0..60 with no visible key.
SHAPE_A = (2, 97, 131, 4, 2)
SHAPE_B = (1, 131, 70, 4, 1)
# Paths that refuse unaligned data (16-byte pieces) instead of launching.
VECTOR_PATHS = ("mma", "wgmma")


def cases():
    """(name, path, dtype name, shape, head_dim, causal, layout)."""
    out = []
    for path, dnames in PATH_DTYPES.items():
        for dname in dnames:
            for d, causal, shape in ((64, True, SHAPE_A), (64, False, SHAPE_B), (128, True, SHAPE_B),
                                     (128, False, SHAPE_A)):
                out.append((path, dname, shape, d, causal, "contiguous"))
    out.append(("naive", "fp16", SHAPE_A, 80, True, "contiguous"))
    for path in PATH_DTYPES:
        out.append((path, "fp16", SHAPE_A, 128, True, "bhsd"))
        out.append((path, "bf16", (2, 33, 0, 4, 2), 64, False, "contiguous"))  # seqlen_k = 0
        out.append((path, "fp16", (1, 150, 150, 8, 1), 64, True, "contiguous"))  # MQA, 8 query heads
        out.append((path, "fp16", SHAPE_B, 64, True, "unaligned"))
    # Both head dims, causal and not, GQA and MQA-like 4:1, tails on both sides, rows that see no key.
    out += [("mma", "fp32", SHAPE_A, 64, True, "contiguous"), ("mma", "fp32", SHAPE_B, 128, True, "bhsd"),
            ("mma", "fp32", SHAPE_A, 128, False, "unaligned")]
    out += [("wgmma", "fp16", SHAPE_A, 128, True, "contiguous"), ("wgmma", "bf16", SHAPE_B, 64, True, "contiguous"),
            ("wgmma", "fp16", SHAPE_A, 64, False, "bhsd")]
    # wgmma, unsplit, over enough key tiles (5) that the TMA ring's 2 stages wrap twice; a grid of 128
    # blocks, so no split-KV.
    out += [("wgmma", "bf16", (4, 256, 601, 16, 4), 64, True, "contiguous"),
            ("wgmma", "fp16", (4, 256, 601, 16, 4), 128, False, "contiguous")]
    # Head dim 64 from 2048 query rows (causal: past 4096): the TMA kernel's blocks of 192 rows (three
    # consumer warpgroups), a partial last block, causal rows that see no key.
    out += [("wgmma", "fp16", (1, 2600, 2400, 6, 2), 64, False, "contiguous"),
            ("wgmma", "fp16", (1, 4300, 4100, 2, 1), 64, True, "contiguous")]
    # Head dim 64 under 2048 query rows: blocks of 64 rows, two per SM (causal, and non-causal under 1024
    # rows: three, over 64-key tiles); a tail block and a ring that wraps (the causal grid too small for the
    # persistent pairs walk; the non-causal ones past the persistent grid's 2048 keys).
    out += [("wgmma", "bf16", (4, 200, 2601, 16, 4), 64, False, "contiguous"),  # 128 blocks of 128 rows: no split-KV
            ("wgmma", "fp16", (2, 1100, 2300, 16, 4), 64, False, "contiguous"),
            ("wgmma", "fp16", (1, 1000, 900, 4, 2), 64, True, "contiguous")]
    # Head dim 128, causal, under 1280 query rows and fewer 128-row query blocks than SMs: blocks of 64 rows
    # and tiles of 64 keys, two per SM; a tail block and a ring that wraps.
    out += [("wgmma", "bf16", (4, 200, 601, 16, 4), 128, True, "contiguous")]
    # The persistent form (non-causal: head dim 128 up to 8192 keys, head dim 64's 64-row blocks up to
    # 2048): 512 and 1024 query blocks, several per block of one wave, tails (head dim 64: three blocks per SM
    # under 1024 rows, two from there).
    out += [("wgmma", "bf16", (4, 1000, 700, 16, 4), 128, False, "contiguous"),
            ("wgmma", "fp16", (4, 1000, 300, 16, 4), 64, False, "contiguous"),
            ("wgmma", "bf16", (2, 1500, 900, 8, 2), 64, False, "contiguous")]
    # Head dim 128, causal, from 8192 query rows: the persistent 128 x 128 blocks (heaviest first, several
    # items per block, rows that see no key); below it the grid's order dealt back and forth (512 query
    # blocks, rows 0-299 see no key); head dim 64's causal 64-row blocks in pairs of equal work (8 pairs
    # per head; 11 query blocks: 5 pairs and the middle one).
    out += [("wgmma", "bf16", (1, 8250, 8200, 3, 1), 128, True, "contiguous"),
            ("wgmma", "fp16", (2, 1100, 9000, 8, 2), 128, False, "contiguous"),  # 192-key tiles
            ("wgmma", "fp16", (4, 1000, 700, 16, 4), 128, True, "contiguous"),
            ("wgmma", "fp16", (4, 1000, 900, 16, 4), 64, True, "contiguous"),
            ("wgmma", "bf16", (3, 650, 700, 24, 4), 64, True, "contiguous")]
    # wgmma's e4m3 kernel (head dim 128, TMA, V transposed in shared memory): tails, rows with no key, a
    # BHSD view, no keys at all, and enough key tiles that the rings wrap.
    out += [("wgmma", "e4m3", SHAPE_A, 128, True, "contiguous"), ("wgmma", "e4m3", SHAPE_B, 128, True, "bhsd"),
            ("wgmma", "e4m3", (4, 256, 601, 16, 4), 128, False, "contiguous"),
            ("wgmma", "e4m3", (2, 33, 0, 4, 2), 128, False, "contiguous"),
            ("wgmma", "e4m3", (4, 1000, 700, 16, 4), 128, True, "contiguous"),  # several items per persistent block
            ("wgmma", "e4m3", (4, 1000, 700, 16, 4), 128, False, "contiguous"),
            ("wgmma", "e4m3", (1, 200, 8300, 2, 1), 128, False, "contiguous"),  # 192-key tiles, a tail of 44 keys
            ("wgmma", "e4m3", (1, 8200, 8250, 1, 1), 128, True, "bhsd")]
    # wgmma's split-KV (small grids, long keys): pieces with tails and empty causal rows, and the merge.
    out += [("wgmma", "fp16", (1, 200, 700, 2, 1), 128, True, "contiguous"),
            ("wgmma", "bf16", (2, 37, 653, 4, 2), 64, False, "bhsd")]
    return out


# Backward passes (naive, mma, wgmma): (path, dtype name, shape, head_dim, causal, layout, deterministic, dlse).
BACKWARD_PATH_DTYPES = {"naive": ["fp16", "bf16", "fp32"], "mma": ["fp16", "bf16", "fp32"]}


def backward_cases():
    out = []
    for path, dnames in BACKWARD_PATH_DTYPES.items():
        for dname in dnames:
            out.append((path, dname, SHAPE_A, 64, True, "contiguous", False, False))
            out.append((path, dname, SHAPE_B, 128, True, "contiguous", False, True))  # rows with no key, dlse
        out.append((path, "fp16", SHAPE_A, 128, False, "bhsd", False, True))
        out.append((path, "bf16", SHAPE_B, 64, False, "contiguous", True, False))
        out.append((path, "fp16", SHAPE_A, 64, True, "contiguous", True, False))
        out.append((path, "bf16", (2, 33, 0, 4, 2), 64, False, "contiguous", False, False))  # seqlen_k = 0
        out.append((path, "fp16", (2, 0, 40, 4, 2), 64, True, "contiguous", False, False))  # seqlen_q = 0
    # mma's fp32 (3xTF32) kernel: a BHSD view, deterministic, dlse; and more steps than its two buffers.
    out.append(("mma", "fp32", SHAPE_A, 128, False, "bhsd", True, True))
    out.append(("mma", "fp32", (1, 150, 200, 4, 2), 64, True, "contiguous", True, False))
    out.append(("naive", "fp16", SHAPE_A, 80, True, "contiguous", False, True))
    out.append(("naive", "fp16", SHAPE_B, 64, False, "unaligned", False, False))
    # wgmma (compute capability 9.0 only: skipped elsewhere): both head dims, causal and not, tails,
    # GQA/MQA, rows that see no key, dlse, a BHSD view, more steps per key block than the load ring
    # has stages, and deterministic (the writer warp's turns) causal and not.
    out += [("wgmma", "fp16", SHAPE_A, 64, True, "contiguous", False, False),
            ("wgmma", "bf16", SHAPE_B, 128, True, "contiguous", False, True),
            ("wgmma", "fp16", SHAPE_A, 128, False, "bhsd", False, True),
            ("wgmma", "bf16", SHAPE_B, 64, False, "contiguous", False, False),
            ("wgmma", "bf16", (2, 300, 260, 4, 2), 128, True, "contiguous", False, False),
            ("wgmma", "fp16", (1, 300, 300, 8, 1), 64, False, "contiguous", False, True),
            ("wgmma", "bf16", (2, 300, 400, 4, 2), 128, True, "contiguous", True, False),
            ("wgmma", "fp16", (1, 200, 520, 4, 1), 64, False, "bhsd", True, True)]
    return out


def make(shape, dtype, layout, g):
    b, l, h, d = shape
    if layout == "bhsd":
        return torch.randn(b, h, l, d, generator=g, device="cuda").to(dtype).transpose(1, 2)
    if layout == "unaligned":  # skip the first element of every row: pointer + 2 bytes, row stride d + 1
        return torch.randn(b, l, h, d + 1, generator=g, device="cuda").to(dtype)[..., 1:]
    return torch.randn(b, l, h, d, generator=g, device="cuda").to(dtype)


def run(case, g):
    path, dname, (b, lq, lk, h, hkv), d, causal, layout = case
    dtype = DTYPES[dname]
    q = make((b, lq, h, d), dtype, layout, g)
    k = make((b, lk, hkv, d), dtype, layout, g)
    v = make((b, lk, hkv, d), dtype, layout, g)
    out = torch.empty(b, lq, h, d, device="cuda", dtype=torch.bfloat16 if dname == "e4m3" else dtype)
    if layout == "unaligned" and path in VECTOR_PATHS:  # the documented refusal: nothing is launched
        try:
            waveboost.attention(q, k, v, causal=causal, out=out, backend=path)
        except ValueError as e:
            assert "16-byte aligned" in str(e), e
            return 0
        raise AssertionError(f"{path} accepted unaligned data")
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend=path)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any().item(), f"NaN in out: {case}"
    assert not torch.isnan(lse).any().item(), f"NaN in lse: {case}"
    return 1


def run_backward(case, g):
    """One attention_backward call on uninitialized dq/dk/dv; fails on a NaN in them."""
    path, dname, (b, lq, lk, h, hkv), d, causal, layout, deterministic, with_dlse = case
    dtype = DTYPES[dname]
    q = make((b, lq, h, d), dtype, layout, g)
    k = make((b, lk, hkv, d), dtype, layout, g)
    v = make((b, lk, hkv, d), dtype, layout, g)
    dout = make((b, lq, h, d), dtype, layout, g)
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="naive")
    dlse = torch.randn(b, h, lq, generator=g, device="cuda") if with_dlse else None
    dq, dk, dv = (torch.empty(x.shape, device="cuda", dtype=dtype) for x in (q, k, v))
    if deterministic and path == "wgmma" and os.environ.get("WAVEBOOST_WGMMA_BACKWARD") == "cp.async":
        # The documented refusal: the cp.async kernel adds dQ with atomics. Nothing is launched.
        try:
            waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True, backend=path)
        except ValueError as e:
            assert "deterministic" in str(e), e
            return 0
        raise AssertionError("wgmma's cp.async backward accepted deterministic=True")
    waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, dlse=dlse, dq=dq, dk=dk, dv=dv,
                                 deterministic=deterministic, backend=path)
    torch.cuda.synchronize()
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not torch.isnan(x).any().item(), f"NaN in {name}: {case}"
    return 1
def serving_calls(g):
    """Decode (dense split and unsplit, GQA/MQA, causal few-query rows), a paged cache with append,
    varlen, and merge_attention_states: (name, thunk returning the tensors to check) pairs."""
    bf, fp = torch.bfloat16, torch.float16
    mk = lambda *s, dtype=bf: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    calls = []
    for b, lq, lk, h, hkv, d, causal in ((1, 1, 700, 8, 2, 128, False), (2, 3, 131, 8, 1, 64, True),
                                         (1, 2, 5, 64, 1, 128, True), (3, 1, 97, 4, 4, 64, False),
                                         (2, 1, 1500, 32, 1, 128, False),
                                         (1, 1, 3000, 64, 1, 128, False),  # one 64-row tile, 47 pieces
                                         (1, 8, 3000, 32, 1, 128, True),  # sm_90: two 128-row tiles, split
                                         (1, 1, 2048, 32, 8, 128, False)):  # sm_90: 8 pieces, one cluster each
        q, k, v = mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)
        calls.append((f"decode dense {(b, lq, lk, h, hkv, d, causal)}",
                      lambda q=q, k=k, v=v, c=causal: waveboost.attention(q, k, v, causal=c, return_lse=True,
                                                                          out=torch.empty_like(q), backend="decode")))
    ps, pages, hkv, d = 16, 24, 2, 128
    kc, vc = mk(pages, ps, hkv, d), mk(pages, ps, hkv, d)
    table = torch.randperm(pages, device="cuda", generator=g).reshape(3, 8).to(torch.int32)
    lengths = torch.tensor([0, 17, 125], dtype=torch.int32, device="cuda")
    q, kn, vn = mk(3, 2, 8, d), mk(3, 2, hkv, d), mk(3, 2, hkv, d)
    # Pieces merged inside the decode kernel: cache lengths of 0 and 1 (one piece, written to out)
    # beside ones of several key tiles (2 to 5 pieces merged by the last to finish).
    kd, vd = mk(4, 320, 8, 128), mk(4, 320, 8, 128)
    lengths_mixed = torch.tensor([0, 1, 319, 65], dtype=torch.int32, device="cuda")
    qd = mk(4, 1, 32, 128)
    calls.append(("decode merged pieces, mixed lengths", lambda: waveboost.attention_with_kvcache(
        qd, kd, vd, lengths_mixed, return_lse=True, out=torch.empty_like(qd), backend="decode")))
    calls.append(("decode paged + append", lambda: waveboost.attention_with_kvcache(
        q, kc, vc, lengths, block_table=table, k_new=kn, v_new=vn, causal=True, return_lse=True,
        out=torch.empty_like(q))))
    cu_q = torch.tensor([0, 1, 1, 4], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 9, 12, 12], dtype=torch.int32, device="cuda")
    qv, kv_, vv = mk(4, 4, 64, dtype=fp), mk(12, 2, 64, dtype=fp), mk(12, 2, 64, dtype=fp)
    calls.append(("decode varlen", lambda: waveboost.attention_varlen(
        qv, kv_, vv, cu_q, cu_k, max_seqlen_q=3, max_seqlen_k=9, causal=True, return_lse=True,
        out=torch.empty_like(qv), backend="decode")))
    # The tensor-core flash paths on sequence layouts: varlen with empty, one-row and tail sequences
    # (causal rows with no key), and a paged cache with shuffled pages of 16 (chunked prefill).
    cu_q2 = torch.tensor([0, 0, 1, 131, 200], dtype=torch.int32, device="cuda")
    cu_k2 = torch.tensor([0, 70, 70, 300, 333], dtype=torch.int32, device="cuda")
    tc = ["mma"] + (["wgmma"] if torch.cuda.get_device_capability() == (9, 0) else [])
    for path in tc:
        for d, causal in ((64, True), (128, False)):
            q2, k2, v2 = mk(200, 4, d, dtype=fp), mk(333, 2, d, dtype=fp), mk(333, 2, d, dtype=fp)
            calls.append((f"{path} varlen d={d} causal={causal}", lambda q2=q2, k2=k2, v2=v2, c=causal, p=path:
                          waveboost.attention_varlen(q2, k2, v2, cu_q2, cu_k2, max_seqlen_q=130, max_seqlen_k=230,
                                                     causal=c, return_lse=True, out=torch.empty_like(q2),
                                                     backend=p)))
        qp = mk(3, 70, 8, d)
        calls.append((f"{path} paged chunked prefill", lambda qp=qp, p=path: waveboost.attention_with_kvcache(
            qp, kc, vc, lengths, block_table=table, causal=True, return_lse=True, out=torch.empty_like(qp),
            backend=p)))
    outs, lses = mk(3, 2, 5, 4, 64, dtype=torch.float32), mk(3, 2, 4, 5, dtype=torch.float32)
    lses[0] = float("-inf")
    calls.append(("merge_attention_states", lambda: waveboost.merge_attention_states(
        outs, lses, out=torch.empty(2, 5, 4, 64, device="cuda", dtype=bf))))
    # 6 bf16 parts at head dim 160: every part's two slices loaded with the LSEs (core::combine_few_kernel),
    # the second slice by a quarter of the lanes; a -inf part and a row of only -inf parts.
    outs6, lses6 = mk(6, 2, 3, 5, 160, dtype=bf), mk(6, 2, 5, 3, dtype=torch.float32)
    lses6[2] = float("-inf")
    lses6[:, 0, 1, 2] = float("-inf")
    calls.append(("merge_attention_states, 6 parts d160", lambda: waveboost.merge_attention_states(
        outs6, lses6, out=torch.empty(2, 3, 5, 160, device="cuda", dtype=bf))))
    # 40 parts: four warps share each row (core::combine_many_kernel); a row of only -inf parts.
    outs40, lses40 = mk(40, 2, 3, 5, 128, dtype=torch.float32), mk(40, 2, 5, 3, dtype=torch.float32)
    lses40[::3] = float("-inf")
    lses40[:, 1, 4, 2] = float("-inf")
    calls.append(("merge_attention_states, 40 parts", lambda: waveboost.merge_attention_states(
        outs40, lses40, out=torch.empty(2, 3, 5, 128, device="cuda", dtype=bf))))
    return calls


def main():
    all_cases = cases()
    if "--list" in sys.argv:
        for c in all_cases + backward_cases():
            print(c)
        return
    info = waveboost.info()
    print(f"waveboost {info['version']} on {info['gpu']} (archs {info['cuda_architectures']})", flush=True)
    if torch.cuda.get_device_capability() != (9, 0):
        print("wgmma cases skipped: backend 'wgmma' needs compute capability 9.0", flush=True)
        all_cases = [c for c in all_cases if c[0] != "wgmma"]
    g = torch.Generator(device="cuda").manual_seed(0)
    fwd_cases, bwd_cases, with_serving = all_cases, backward_cases(), torch.cuda.get_device_capability() >= (8, 0)
    if torch.cuda.get_device_capability() != (9, 0):
        bwd_cases = [c for c in bwd_cases if c[0] != "wgmma"]
    if "--forward-only" in sys.argv:  # the forward calls alone (no backward, no serving calls)
        bwd_cases, with_serving = [], False
    if "--backward-only" in sys.argv:  # the attention_backward calls alone
        fwd_cases = []
    if "--serving-only" in sys.argv:  # the serving calls (decode, kv cache, varlen, merge) alone
        fwd_cases, bwd_cases = [], []
    if "--fp8-only" in sys.argv:  # the float8_e4m3fn forward calls alone
        fwd_cases, bwd_cases, with_serving = [c for c in fwd_cases if c[1] == "e4m3"], [], False
    if "--wgmma-only" in sys.argv:  # of the calls picked above, those on the wgmma backend (no serving calls)
        fwd_cases, bwd_cases = [c for c in fwd_cases if c[0] == "wgmma"], [c for c in bwd_cases if c[0] == "wgmma"]
        with_serving = False
    launched = 0
    for case in fwd_cases:
        launched += run(case, g)
    for case in bwd_cases:
        launched += run_backward(case, g)
    all_cases = fwd_cases + bwd_cases
    serving = serving_calls(g) if with_serving else []
    for name, call in serving:
        result = call()
        torch.cuda.synchronize()
        for x in result:
            assert not torch.isnan(x).any().item(), f"NaN in {name}"
    launched += len(serving)
    total = len(all_cases) + len(serving)
    print(f"run_cases: {total} calls OK ({launched} launched, {total - launched} refused as documented)")


if __name__ == "__main__":
    main()
