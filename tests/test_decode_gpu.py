"""The CUDA decode backend, merge_attention_states and kv_cache_append on CUDA, against float64
references (tests/reference.py): dense, paged (shuffled pages) and varlen caches, cache lengths of
0, 1 and odd, GQA ratios 1-64 and MQA, few causal queries per sequence, split-KV and unsplit
grids, NaN-poisoned outputs, CUDA-graph capture.

Half precision: max|out - ref| <= 2 * max|same-dtype naive - ref| + atol (FlashAttention's rule).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

import waveboost
from reference import attention_ref_torch, pytest_in_child

torch = pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ATOL = {"fp16": 2e-4, "bf16": 2e-3}


def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def randn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def per_sequence_reference(q, k, v, lengths_q, lengths_k, causal, scale, dtype=None):
    """Lists of per-sequence (out, lse): q[b][:lq], k[b][:lk] (tensors of (B, L, H, D) or lists)."""
    outs, lses = [], []
    for b in range(len(lengths_q)):
        lq, lk = int(lengths_q[b]), int(lengths_k[b])
        o, l = attention_ref_torch(q[b][None, :lq], k[b][None, :lk], v[b][None, :lk], causal, scale, dtype=dtype)
        outs.append(o[0])
        lses.append(l[0])
    return outs, lses


def check_rows(out_rows, lse_rows, ref, ref_lse, naive, dname):
    """out_rows (Lq, H, D), lse_rows (H, Lq) of one sequence against its float64 reference."""
    assert not torch.isnan(out_rows).any(), "unwritten (NaN-poisoned) or NaN output elements"
    err = (out_rows.double() - ref).abs().max().item() if out_rows.numel() else 0.0
    naive_err = (naive.double() - ref).abs().max().item() if naive.numel() else 0.0
    assert err <= 2 * naive_err + ATOL[dname], f"max error {err:.3g} vs same-dtype naive {naive_err:.3g}"
    if lse_rows is not None:
        assert not torch.isnan(lse_rows).any(), "unwritten or NaN lse elements"
        assert torch.equal(torch.isneginf(lse_rows), torch.isneginf(ref_lse)), "LSE -inf rows differ"
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse_rows.double()[finite], ref_lse[finite], rtol=1e-3, atol=1e-3)


def check_sequences(out, lse, q, k, v, lengths_q, lengths_k, causal, dname):
    """check_rows for every sequence of a batch (lse None: the output only), against the float64
    references of per_sequence_reference and the same-dtype naive one, scale 1 / sqrt(head_dim)."""
    scale = 1 / math.sqrt(q.shape[-1])
    refs, ref_lses = per_sequence_reference(q, k, v, lengths_q, lengths_k, causal, scale)
    naives, _ = per_sequence_reference(q, k, v, lengths_q, lengths_k, causal, scale, dtype=DTYPES[dname])
    for i in range(len(lengths_q)):
        check_rows(out[i], None if lse is None else lse[i], refs[i], None if lse is None else ref_lses[i],
                   naives[i], dname)


# ---------------------------------------------------------------------------
# Dense calls (backend "decode" through waveboost.attention)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dname", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,heads_kv", [(8, 8), (16, 4), (32, 8), (64, 1), (128, 2)])
@pytest.mark.parametrize("lq,lk,causal", [(1, 1, False), (1, 97, False), (1, 1025, True), (3, 257, True),
                                          (8, 4099, True), (5, 3, True), (2, 700, False)])
def test_dense_matches_reference(dname, d, heads, heads_kv, lq, lk, causal):
    g = gen(hash((dname, d, heads, heads_kv, lq, lk, causal)) % 2**31)
    dtype = DTYPES[dname]
    b = 3
    q, k, v = randn(g, b, lq, heads, d, dtype=dtype), randn(g, b, lk, heads_kv, d, dtype=dtype), \
        randn(g, b, lk, heads_kv, d, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(d)
    res, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="decode")
    assert res is out
    ref, ref_lse = attention_ref_torch(q, k, v, causal, scale)
    naive, _ = attention_ref_torch(q, k, v, causal, scale, dtype=dtype)
    for i in range(b):
        check_rows(out[i], lse[i], ref[i], ref_lse[i], naive[i], dname)


def check_decode_bf16(q, k, v):
    """The decode backend on bf16 q, k, v (one query per sequence, head dim 128, not causal) into a
    NaN-poisoned output, against the float64 reference per sequence."""
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention(q, k, v, out=out, return_lse=True, backend="decode")
    ref, ref_lse = attention_ref_torch(q, k, v, False, 1 / math.sqrt(128))
    naive, _ = attention_ref_torch(q, k, v, False, 1 / math.sqrt(128), dtype=torch.bfloat16)
    for i in range(q.shape[0]):
        check_rows(out[i], lse[i], ref[i], ref_lse[i], naive[i], "bf16")


@pytest.mark.parametrize("b,heads,heads_kv,lk", [(1, 32, 8, 32768), (1, 8, 1, 5000), (2, 64, 64, 3000),
                                                 (200, 8, 1, 300)])
def test_split_and_unsplit_grids(b, heads, heads_kv, lk):
    # Small grids cut the keys into pieces merged by the combine kernel; b x heads_kv >= SMs does not.
    g = gen(b * 1000 + lk)
    q, k, v = randn(g, b, 1, heads, 128, dtype=torch.bfloat16), randn(g, b, lk, heads_kv, 128, dtype=torch.bfloat16), \
        randn(g, b, lk, heads_kv, 128, dtype=torch.bfloat16)
    # One block per (sequence, kv head) here: the keys are split wherever those leave an SM idle.
    if 2 * b * heads_kv <= torch.cuda.get_device_properties(0).multi_processor_count:
        plan = waveboost.plan(q, k, v, backend="decode")
        # 16-row tiles (heads / heads_kv <= 16 here) merge in the kernel, or in a cluster (sm_90).
        assert plan["num_splits"] > 1 and plan["merge"] in ("in-kernel", "cluster"), plan
    check_decode_bf16(q, k, v)


# Clusters (sm_90, the TMA kernel): a split call whose 2-16 pieces per (sequence, kv head) fill one
# wave runs each (sequence, kv head)'s pieces as a thread block cluster that merges them through its
# shared memory; WAVEBOOST_DECODE_CLUSTER (read per call) 0 merges through global memory instead, 2
# takes clusters wherever they are resident, whatever the pieces' length. On an H200 the cases below take
# clusters of 8 (16 pieces recut into 8), 8 (likewise), 8 (pages of 16: two blocks per SM, pieces of 10
# tiles), 5, 2 and 2 blocks (the last two with one block per SM); pieces past a short sequence's tiles
# are empty, lengths 0 and 1 take one piece.
@pytest.mark.parametrize("b,heads,heads_kv,d,lq,causal,lengths,page_size", [
    (1, 32, 8, 128, 1, False, [2048], None),
    (2, 16, 4, 64, 4, True, [3001, 0], None),
    (4, 64, 8, 128, 1, False, [1, 5000, 64 * 3, 200], 16),
    (3, 8, 8, 64, 1, False, [7000, 129, 1], None),
    (8, 32, 8, 128, 1, False, [0, 1, 4000, 65, 64, 129, 4096, 3], 64),
    (8, 128, 8, 128, 1, False, [4096, 17, 4000, 2, 3000, 4096, 1000, 333], None),
])
def test_cluster_merge_matches_the_reference(b, heads, heads_kv, d, lq, causal, lengths, page_size, monkeypatch):
    g = gen(sum(lengths) + heads)
    dtype, max_len = torch.bfloat16, max(lengths) + 64
    k_cache, v_cache = randn(g, b, max_len, heads_kv, d, dtype=dtype), randn(g, b, max_len, heads_kv, d, dtype=dtype)
    q = randn(g, b, lq, heads, d, dtype=dtype)
    if page_size is not None:
        max_len = (max_len + page_size - 1) // page_size * page_size
        pad = max_len - k_cache.shape[1]
        k_cache, v_cache = (torch.cat([c, randn(g, b, pad, heads_kv, d, dtype=dtype)], 1) for c in (k_cache, v_cache))
    kc, vc, table = paged_copy(g, k_cache, v_cache, page_size)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = {}
    for setting in ("0", "1", "2"):
        monkeypatch.setenv("WAVEBOOST_DECODE_CLUSTER", setting)
        # plan() asks about dense caches: the paged case's pieces differ (two blocks per SM), so it is
        # checked by its results alone.
        plan = waveboost.plan(q, k_cache, v_cache, causal=causal, backend="decode")
        if "tma" in plan["kernel"] and sms >= 128 and page_size is None:
            assert (plan["merge"] == "cluster") == (setting != "0"), plan
        out = torch.full_like(q, float("nan"))
        _, lse = waveboost.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, causal=causal, out=out,
                                                  return_lse=True, backend="decode")
        check_sequences(out, lse, q, k_cache, v_cache, [lq] * b, lengths, causal, "bf16")
        results[setting] = (out, lse)
    for setting in ("1", "2"):
        torch.testing.assert_close(results[setting][0], results["0"][0], rtol=0, atol=2e-2)
        finite = torch.isfinite(results["0"][1])
        assert torch.equal(finite, torch.isfinite(results[setting][1]))
        torch.testing.assert_close(results[setting][1][finite], results["0"][1][finite], rtol=1e-5, atol=1e-5)


def test_grid_just_past_one_wave_splits_its_last_wave():
    # (SMs // 8 + 1) sequences x 8 kv heads: a grid a few blocks past one block per SM, whose second
    # wave of two blocks per SM would be nearly empty. Where the keys stream by TMA, the last-wave rule
    # cuts them into pieces (4 of 32-33 key tiles on 132 SMs); the result is the same either way.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    b, heads, heads_kv, lk = sms // 8 + 1, 32, 8, 64 * 128 + 3
    g = gen(77)
    q = randn(g, b, 1, heads, 128, dtype=torch.bfloat16)
    k, v = (randn(g, b, lk, heads_kv, 128, dtype=torch.bfloat16) for _ in range(2))
    plan = waveboost.plan(q, k, v, backend="decode")
    if "tma" in plan["kernel"]:
        assert plan["num_splits"] > 1 and plan["merge"] == "in-kernel", plan
    check_decode_bf16(q, k, v)


# Split pieces: 16-row tiles are merged inside the decode kernel (the last piece of a row tile to
# finish merges them), 32- and 64-row tiles by the combine kernel. On an H100 (132 SMs) one sequence of
# 16-row tiles splits into up to 132 / kv heads pieces (16 at 8 kv heads, the cap of 128 at 1); key
# tiles are 64 keys at head dim 128, 128 at 64. On sm_90 (the TMA kernel) calls of 9-16 pieces and at
# most 64 key tiles are recut into 8 pieces merged in a cluster (test_cluster_merge_matches_the_reference).
@pytest.mark.parametrize("heads,heads_kv,d,lq,lk,causal", [
    (32, 8, 128, 1, 64 * 16, False),      # as many tiles as pieces: every piece one tile
    (32, 8, 128, 1, 64 * 16 - 5, False),  # the same with a partial last tile
    (32, 8, 128, 1, 64 * 33, False),      # 33 tiles dealt over 16 pieces
    (32, 8, 128, 1, 64 * 2 + 1, False),   # 3 tiles: 3 pieces, the rest of the splits idle
    (8, 1, 64, 1, 128 * 128 + 1, False),  # 129 tiles over the 128 pieces of the cap
    (16, 4, 64, 4, 1000, True),           # 16 causal rows (4 queries x 4 heads) seeing different keys
    (64, 1, 128, 2, 3001, True),          # 128 rows: two 64-row tiles, each merged on its own
    (16, 1, 64, 3, 700, True),            # causal rows that see different numbers of keys
    (32, 1, 128, 1, 5000, False),         # MQA, 32 rows: one full 32-row tile
    (24, 1, 64, 1, 128 * 9 + 7, False),   # 24 rows: a partial 32-row tile
    (8, 1, 128, 3, 1001, True),           # 24 causal rows (3 queries x 8 heads) in a 32-row tile
    (16, 2, 128, 2, 64 * 40 + 3, True),   # 32 causal rows per kv head, 2 kv heads
    (32, 1, 128, 16, 3001, True),         # 16 causal queries at MQA: 512 rows (8 tiles of 64; 4 of 128 by TMA)
    (32, 1, 128, 5, 2000, True),          # 160 causal rows: by TMA a full and a partial 128-row tile
])
def test_every_split_piece_counts(heads, heads_kv, d, lq, lk, causal):
    g = gen(lk * 7 + heads)
    dtype = torch.bfloat16
    q, k, v = randn(g, 1, lq, heads, d, dtype=dtype), randn(g, 1, lk, heads_kv, d, dtype=dtype), \
        randn(g, 1, lk, heads_kv, d, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention(q, k, v, causal=causal, out=out, return_lse=True, backend="decode")
    scale = 1 / math.sqrt(d)
    ref, ref_lse = attention_ref_torch(q, k, v, causal, scale)
    naive, _ = attention_ref_torch(q, k, v, causal, scale, dtype=dtype)
    check_rows(out[0], lse[0], ref[0], ref_lse[0], naive[0], "bf16")


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("lq,causal", [(1, False), (4, True)])
def test_merge_with_mixed_cache_lengths(page_size, lq, causal):
    # Lengths 0 and 1 (one piece: written straight to out) beside long ones (many pieces merged)
    # and lengths of one, two and three key tiles, in one batch.
    g = gen(31 + (page_size or 0) + lq)
    dtype, heads, heads_kv, d, max_len = torch.float16, 32, 8, 128, 4096
    lengths = torch.tensor([0, 1, 4000, 65, 64, 129, 4096, 3], dtype=torch.int32)
    b = len(lengths)
    k_cache, v_cache = randn(g, b, max_len, heads_kv, d, dtype=dtype), randn(g, b, max_len, heads_kv, d, dtype=dtype)
    q = randn(g, b, lq, heads, d, dtype=dtype)
    kc, vc, table = paged_copy(g, k_cache, v_cache, page_size)
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention_with_kvcache(q, kc, vc, lengths.cuda(), block_table=table, causal=causal, out=out,
                                              return_lse=True, backend="decode")
    check_sequences(out, lse, q, k_cache, v_cache, [lq] * b, lengths, causal, "fp16")


def _split_call(seed, heads=32, heads_kv=8):
    """A decode step that splits into many pieces (1 sequence, 5000 keys): 16-row tiles at 32/8
    heads, one 64-row tile at 64/1."""
    g = gen(seed)
    dtype = torch.bfloat16
    q, k, v = randn(g, 1, 1, heads, 128, dtype=dtype), randn(g, 1, 5000, heads_kv, 128, dtype=dtype), \
        randn(g, 1, 5000, heads_kv, 128, dtype=dtype)
    out = torch.empty_like(q)
    call = lambda: waveboost.attention(q, k, v, out=out, return_lse=True, backend="decode")[1]  # noqa: E731
    return call, out


def test_repeated_calls_graph_replays_and_streams_agree():
    # The arrival counters must start every call at 0: repeated calls on one stream, replays of a
    # captured step and calls on two streams at once give bit-identical results.
    call, out = _split_call(41)
    eager_lse = call()
    eager = out.clone()
    for _ in range(4):
        out.fill_(float("nan"))
        lse = call()
        assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = call()
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    # Two streams, each with its own step and outputs, interleaved.
    other, out2 = _split_call(42)
    other()
    expect2 = out2.clone()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    for _ in range(8):
        for st, (fn, o) in zip(streams, ((call, out), (other, out2))):
            with torch.cuda.stream(st):
                fn()
                results.append((o.clone(), o is out))
    torch.cuda.synchronize()
    for got, first in results:
        assert torch.equal(got, eager if first else expect2)


@pytest.mark.parametrize("env,heads", [
    ({"WAVEBOOST_DECODE_COMBINE": "kernel"}, (32, 8)),
    ({"WAVEBOOST_DECODE_MAX_SPLITS": "3"}, (32, 8)),
    ({"WAVEBOOST_DECODE_BLOCKS_PER_SM": "2"}, (32, 8)),
    ({"WAVEBOOST_DECODE_COMBINE": "in-kernel"}, (64, 1)),
    ({"WAVEBOOST_DECODE_COMBINE": "in-kernel"}, (32, 1)),
], ids=["combine-kernel", "max-splits-3", "two-blocks-per-sm", "64-row-tile-in-kernel", "32-row-tile-in-kernel"])
def test_merge_switches_agree_with_the_default(env, heads, tmp_path):
    # The other merge (WAVEBOOST_DECODE_COMBINE) and other split counts give the default's results;
    # the variables are read once per process, hence a subprocess.
    script = f"""
import sys, torch
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_decode_gpu import _split_call
call, out = _split_call(43, *{heads!r})
lse = call()
torch.save((out.cpu(), lse.cpu()), {str(tmp_path / "out.pt")!r})
"""
    subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, check=True, timeout=120)
    theirs, theirs_lse = torch.load(tmp_path / "out.pt")
    call, out = _split_call(43, *heads)
    lse = call()
    assert not torch.isnan(theirs).any()
    torch.testing.assert_close(theirs.cuda().float(), out.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(theirs_lse.cuda(), lse, rtol=1e-5, atol=1e-5)


def test_auto_sends_few_queries_per_kv_head_to_decode():
    g = gen(7)
    q, k, v = randn(g, 4, 1, 32, 128, dtype=torch.float16), randn(g, 4, 512, 8, 128, dtype=torch.float16), \
        randn(g, 4, 512, 8, 128, dtype=torch.float16)
    assert waveboost.resolve_backend(q, k, v) == "decode"
    q8 = randn(g, 4, 8, 32, 128, dtype=torch.float16)  # 8 x 4 = 32 rows per kv head
    assert waveboost.resolve_backend(q8, k, v, causal=True) == "decode"
    big = randn(g, 4, 512, 32, 128, dtype=torch.float16)
    assert waveboost.resolve_backend(big, k, v) != "decode"
    # Up to 16 queries go to decode whatever the group (16 x 32 = 512 rows per kv head at MQA), 17 do not.
    k1, v1 = k[:, :, :1], v[:, :, :1]
    assert waveboost.resolve_backend(randn(g, 4, 16, 32, 128, dtype=torch.float16), k1, v1, causal=True) == "decode"
    assert waveboost.resolve_backend(randn(g, 4, 17, 32, 128, dtype=torch.float16), k1, v1, causal=True) != "decode"
    assert torch.equal(waveboost.attention(q, k, v), waveboost.attention(q, k, v, backend="decode"))


def test_refusals_name_the_reason():
    g = gen(8)
    q, k, v = randn(g, 1, 1, 4, 128), randn(g, 1, 16, 4, 128), randn(g, 1, 16, 4, 128)
    with pytest.raises(ValueError, match="backend 'decode' supports float16 and bfloat16; got float32"):
        waveboost.attention(q, k, v, backend="decode")
    q, k, v = (x.half()[..., :96] for x in (q, k, v))
    with pytest.raises(ValueError, match="backend 'decode' supports head_dim 64 and 128; got 96"):
        waveboost.attention(q.contiguous(), k.contiguous(), v.contiguous(), backend="decode")


def test_nan_propagates_and_masked_nan_does_not():
    g = gen(9)
    q, k, v = randn(g, 2, 2, 8, 64, dtype=torch.float16), randn(g, 2, 100, 2, 64, dtype=torch.float16), \
        randn(g, 2, 100, 2, 64, dtype=torch.float16)
    k[0, 99, 0, 3] = float("nan")  # the last key: seen by query 1 only under the causal mask
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="decode")
    assert torch.isnan(out[0, 1, :4]).all() and torch.isnan(lse[0, :4, 1]).all()  # kv head 0 = heads 0..3
    assert not torch.isnan(out[0, 0]).any() and not torch.isnan(out[0, 1, 4:]).any() and not torch.isnan(out[1]).any()


# ---------------------------------------------------------------------------
# KV caches: dense with lengths, paged with shuffled pages, append
# ---------------------------------------------------------------------------

def paged_copy(g, k_cache, v_cache, page_size, spare=3):
    """(k_pages, v_pages, block_table): contiguous caches (B, max_len, Hkv, D) cut into pages
    placed in shuffled order among `spare` pages of random values; page_size None: the contiguous
    caches themselves and no table."""
    if page_size is None:
        return k_cache, v_cache, None
    b, max_len, hkv, d = k_cache.shape
    per_seq = max_len // page_size
    num_pages = b * per_seq + spare
    ids = torch.randperm(num_pages, generator=torch.Generator().manual_seed(page_size))[: b * per_seq]
    table = ids.reshape(b, per_seq).to(torch.int32)
    paged = []
    for cache in (k_cache, v_cache):
        pages = randn(g, num_pages, page_size, hkv, d, dtype=cache.dtype)
        pages[table.reshape(-1).cuda().long()] = cache.reshape(b * per_seq, page_size, hkv, d)
        paged.append(pages)
    return paged[0], paged[1], table.cuda()


@pytest.mark.parametrize("dname", ["fp16", "bf16"])
@pytest.mark.parametrize("page_size", [None, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("heads,heads_kv,lq,causal", [(8, 8, 1, False), (32, 8, 1, True), (64, 1, 1, False),
                                                      (16, 2, 4, True), (8, 1, 8, True)])
def test_kvcache_matches_reference(dname, page_size, heads, heads_kv, lq, causal):
    dtype = DTYPES[dname]
    d = 128 if heads_kv != 1 else 64
    g = gen(hash((dname, page_size, heads, heads_kv, lq, causal)) % 2**31)
    b, max_len = 6, 512
    lengths = torch.tensor([0, 1, 37, 511, 512, 300], dtype=torch.int32)  # 0, 1, odd, full
    k_cache, v_cache = randn(g, b, max_len, heads_kv, d, dtype=dtype), randn(g, b, max_len, heads_kv, d, dtype=dtype)
    q = randn(g, b, lq, heads, d, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    kc, vc, table = paged_copy(g, k_cache, v_cache, page_size)
    _, lse = waveboost.attention_with_kvcache(q, kc, vc, lengths.cuda(), block_table=table, causal=causal, out=out,
                                              return_lse=True, backend="decode")
    check_sequences(out, lse, q, k_cache, v_cache, [lq] * b, lengths, causal, dname)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # an empty cache: zeros, lse -inf
    assert torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("page_size", [None, 16, 256])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads,heads_kv,lq", [(32, 8, 1), (32, 1, 1), (16, 2, 4)])  # 16-, 32- and 64-row tiles
def test_unused_cache_slots_never_reach_the_output(d, heads, heads_kv, lq, page_size):
    """A cache whose slots past each sequence's length hold NaN and inf (memory never written):
    the output matches the reference over the written prefix, with no NaN, whatever the key tiles
    past the length hold (lengths inside, at and just past a key tile's end, split or not), dense
    or paged (the pages past a sequence's length hold NaN too)."""
    g = gen(d * 100 + heads_kv * 10 + lq + (page_size or 0))
    dtype = torch.bfloat16
    b, max_len = 6, 1300 if page_size is None else 1536
    lengths = torch.tensor([1, 63, 64, 65, 1000, 1299], dtype=torch.int32)
    k_cache, v_cache = randn(g, b, max_len, heads_kv, d, dtype=dtype), randn(g, b, max_len, heads_kv, d, dtype=dtype)
    for i, n in enumerate(lengths.tolist()):
        k_cache[i, n:] = float("nan")
        v_cache[i, n:] = float("nan")
        v_cache[i, n::2] = float("inf")
    q = randn(g, b, lq, heads, d, dtype=dtype)
    kc, vc, table = paged_copy(g, k_cache, v_cache, page_size)
    out, lse = waveboost.attention_with_kvcache(q, kc, vc, lengths.cuda(), block_table=table, causal=True,
                                                return_lse=True, backend="decode")
    check_sequences(out, lse, q, k_cache, v_cache, [lq] * b, lengths, True, "bf16")


def test_cp_async_pipeline():
    """On sm_90 dense and paged caches stream by TMA; the cp.async kernel that
    other devices run is checked here by the dense and paged tests again in a child process with
    WAVEBOOST_DECODE_PIPELINE=cp.async (read once per process)."""
    pytest_in_child(__file__,
                    "(dense_matches_reference and bf16) or split_and_unsplit or every_split_piece or unused_cache_slots or "
                    "kvcache_matches_reference or merge_with_mixed_cache_lengths or append_then_attend or "
                    "decode_step_in_a_cuda_graph",
                    {"WAVEBOOST_DECODE_PIPELINE": "cp.async"})


@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_append_then_attend(page_size):
    g = gen(11 + (page_size or 0))
    b, max_len, heads, heads_kv, d, new = 4, 512, 16, 4, 128, 3
    dtype = torch.bfloat16
    k_cache, v_cache = randn(g, b, max_len, heads_kv, d, dtype=dtype), randn(g, b, max_len, heads_kv, d, dtype=dtype)
    lengths = torch.tensor([0, 5, 100, 509], dtype=torch.int32, device="cuda")
    k_new, v_new = randn(g, b, new, heads_kv, d, dtype=dtype), randn(g, b, new, heads_kv, d, dtype=dtype)
    q = randn(g, b, new, heads, d, dtype=dtype)
    kc, vc, table = paged_copy(g, k_cache.clone(), v_cache.clone(), page_size)
    kc_before, vc_before = kc.clone(), vc.clone()
    out = waveboost.attention_with_kvcache(q, kc, vc, lengths, block_table=table, k_new=k_new, v_new=v_new,
                                           causal=True, backend="decode")
    # The cache now holds k_new at each sequence's end and is unchanged elsewhere.
    expect_k, expect_v = kc_before.clone(), vc_before.clone()
    for i in range(b):
        for j in range(new):
            pos = int(lengths[i]) + j
            if page_size is None:
                expect_k[i, pos], expect_v[i, pos] = k_new[i, j], v_new[i, j]
                k_cache[i, pos], v_cache[i, pos] = k_new[i, j], v_new[i, j]
            else:
                page, row = table[i, pos // page_size], pos % page_size
                expect_k[page, row], expect_v[page, row] = k_new[i, j], v_new[i, j]
                k_cache[i, pos], v_cache[i, pos] = k_new[i, j], v_new[i, j]
    assert torch.equal(kc, expect_k) and torch.equal(vc, expect_v)
    check_sequences(out, None, q, k_cache, v_cache, [new] * b, (lengths + new).cpu(), True, "bf16")


def test_varlen_small_queries_on_decode():
    g = gen(12)
    dtype, heads, heads_kv, d = torch.float16, 16, 4, 64
    lq = [1, 0, 4, 2, 8]
    lk = [7, 3, 0, 1025, 97]
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device="cuda")
    q = randn(g, sum(lq), heads, d, dtype=dtype)
    k, v = randn(g, sum(lk), heads_kv, d, dtype=dtype), randn(g, sum(lk), heads_kv, d, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    _, lse = waveboost.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max(lq), max_seqlen_k=max(lk), causal=True,
                                        out=out, return_lse=True, backend="decode")
    scale = 1 / math.sqrt(d)
    for i in range(len(lq)):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qs, ks, vs = q[q0:q0 + lq[i]][None], k[k0:k0 + lk[i]][None], v[k0:k0 + lk[i]][None]
        ref, ref_lse = attention_ref_torch(qs, ks, vs, True, scale)
        naive, _ = attention_ref_torch(qs, ks, vs, True, scale, dtype=dtype)
        check_rows(out[q0:q0 + lq[i]], lse[:, q0:q0 + lq[i]], ref[0], ref_lse[0], naive[0], "fp16")


def test_decode_step_in_a_cuda_graph():
    g = gen(13)
    b, heads, heads_kv, d, page_size, max_pages = 8, 32, 8, 128, 16, 64
    dtype = torch.bfloat16
    num_pages = b * max_pages
    kc, vc = randn(g, num_pages, page_size, heads_kv, d, dtype=dtype), randn(g, num_pages, page_size, heads_kv, d,
                                                                             dtype=dtype)
    table = torch.randperm(num_pages, device="cuda").reshape(b, max_pages).to(torch.int32)
    lengths = torch.randint(0, max_pages * page_size - 1, (b,), device="cuda", dtype=torch.int32)
    q = randn(g, b, 1, heads, d, dtype=dtype)
    k_new, v_new = randn(g, b, 1, heads_kv, d, dtype=dtype), randn(g, b, 1, heads_kv, d, dtype=dtype)
    out = torch.empty_like(q)
    step = lambda: waveboost.attention_with_kvcache(q, kc, vc, lengths, block_table=table,  # noqa: E731
                                                    k_new=k_new, v_new=v_new, out=out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    eager = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.fill_(float("nan"))
    q.copy_(randn(g, b, 1, heads, d, dtype=dtype))
    graph.replay()
    torch.cuda.synchronize()
    again = waveboost.attention_with_kvcache(q, kc, vc, lengths, block_table=table, k_new=k_new, v_new=v_new)
    assert not torch.isnan(out).any() and not torch.equal(out, eager)
    assert torch.equal(out, again)


# ---------------------------------------------------------------------------
# merge_attention_states on CUDA
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("parts_dtype,out_dtype", [(torch.float32, torch.bfloat16), (torch.float16, torch.float16),
                                                   (torch.float32, torch.float32)])
@pytest.mark.parametrize("d", [64, 128, 37])
def test_merge_equals_one_shot(parts_dtype, out_dtype, d):
    g = gen(d)
    b, lq, heads, cuts = 2, 5, 4, [0, 40, 41, 41, 300]  # an empty part among them
    q, k, v = randn(g, b, lq, heads, d), randn(g, b, 300, heads, d), randn(g, b, 300, heads, d)
    scale = 1 / math.sqrt(d)
    outs, lses = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        o, l = attention_ref_torch(q, k[:, lo:hi], v[:, lo:hi], False, scale)
        outs.append(o.to(parts_dtype))
        lses.append(l.float())
    out = torch.full((b, lq, heads, d), float("nan"), device="cuda", dtype=out_dtype)
    res, lse = waveboost.merge_attention_states(outs, lses, out=out)
    assert res is out
    ref, ref_lse = attention_ref_torch(q, k, v, False, scale)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[out_dtype]
    tol = max(tol, {torch.float32: 1e-5, torch.float16: 2e-3}[parts_dtype])
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_merge_neg_inf_parts_and_nan():
    g = gen(21)
    outs = randn(g, 3, 1, 4, 2, 64)
    lses = randn(g, 3, 1, 2, 4)
    lses[:, 0, 0, 0] = float("-inf")  # every part empty: zeros, lse -inf
    lses[1, 0, 1, 1] = float("-inf")  # one empty part: it contributes nothing, whatever its O holds
    outs[1, 0, 1, 1] = float("nan")
    lses[2, 0, 0, 2] = float("nan")  # NaN propagates
    out, lse = waveboost.merge_attention_states(outs, lses)
    assert torch.equal(out[0, 0, 0], torch.zeros(64, device="cuda")) and torch.isneginf(lse[0, 0, 0])
    w = torch.softmax(lses[[0, 2], 0, 1, 1], 0)
    torch.testing.assert_close(out[0, 1, 1], w[0] * outs[0, 0, 1, 1] + w[1] * outs[2, 0, 1, 1])
    assert torch.isnan(out[0, 2, 0]).all() and torch.isnan(lse[0, 0, 2])
    assert not torch.isnan(out[0, 3]).any()
