"""The wgmma forward's two load pipelines: TMA producer (default) and cp.async.

The pipeline is chosen once per process (WAVEBOOST_WGMMA_PIPELINE), so the cp.async kernel's
unsplit blocks are checked by running the wgmma reference tests of test_gpu.py again in a
child process with WAVEBOOST_WGMMA_PIPELINE=cp.async; the default (TMA) runs in this one.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))


def test_cp_async_pipeline_matches_reference():
    from reference import pytest_in_child

    pytest_in_child(os.path.join(HERE, "test_gpu.py"), "wgmma and matches_reference and not split",
                    {"WAVEBOOST_WGMMA_PIPELINE": "cp.async"})


def test_tma_pipeline_on_views_of_a_bigger_buffer():
    """K and V as strided views (row stride > head_dim, head stride from a wider buffer): the
    tensor map's strides, not a packed layout, must address them."""
    torch = pytest.importorskip("torch")
    import waveboost
    from reference import attention_ref_torch as reference

    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            big = torch.randn(2, 300, 6, d + 64, generator=g, device="cuda").to(dtype)
            q = torch.randn(2, 200, 4, d, generator=g, device="cuda").to(dtype)
            k = big[:, :, 1:3, 32:32 + d]
            v = big[:, :, 3:5, 16:16 + d]
            for causal in (False, True):
                out, lse = waveboost.attention(q, k, v, causal=causal, backend="wgmma", return_lse=True)
                ref, ref_lse = reference(q, k, v, causal, d ** -0.5)
                err = (out.double() - ref).abs().max().item()
                assert err < 2e-2, (dtype, d, causal, err)
                finite = torch.isfinite(ref_lse)
                assert (lse.double() - ref_lse)[finite].abs().max().item() < 1e-3


def persistent_grid(d, lq, lk, causal, heads):
    """Whether a dense 16-bit call of `heads` batch x heads runs the TMA kernel's persistent grid: calls of
    the block shapes that have one (head dim 128's 128 x 128 blocks; head dim 64's 64-row blocks, under 2048
    query rows non-causal, up to 4096 causal), every one where WAVEBOOST_WGMMA_PERSISTENT=1, none where 0,
    else non-causal ones of at most 8192 keys (head dim 128) or 2048 (head dim 64), causal head dim 128 ones
    from 8192 query rows or whose 128-row query blocks fill a wave (one block per SM), and causal head dim 64
    ones under 2048 query rows whose pairs of 64-row query blocks fill a wave of three blocks per SM."""
    import torch

    forced = os.environ.get("WAVEBOOST_WGMMA_PERSISTENT")
    if d == 64 and lq >= (4097 if causal else 2048):
        return False
    if forced is not None:
        return forced == "1"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if not causal:
        return lk <= (8192 if d == 128 else 2048)
    if d == 128:
        return lq >= 8192 or (lq + 127) // 128 * heads >= sms
    return lq < 2048 and ((lq + 63) // 64 + 1) // 2 * heads >= 3 * sms


def _check_block_heights(d, cases, varlen, seed):
    """The TMA kernel at head dim d against the float64 reference on dense `cases` (batch, heads,
    heads_kv, seqlen_q, seqlen_k, causal, scale) and on `varlen` batches (query lengths, key
    lengths, causal), fp16 and bf16 (varlen bf16)."""
    torch = pytest.importorskip("torch")
    import waveboost
    from reference import attention_ref_torch as reference

    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    for dtype in (torch.float16, torch.bfloat16):
        for b, h, hkv, lq, lk, causal, scale in cases:
            q = torch.randn(b, lq, h, d, generator=g, device="cuda").to(dtype)
            k = torch.randn(b, lk, hkv, d, generator=g, device="cuda").to(dtype)
            v = torch.randn(b, lk, hkv, d, generator=g, device="cuda").to(dtype)
            s = d ** -0.5 if scale is None else scale
            where = (dtype, b, h, hkv, lq, lk, causal, s)
            plan = waveboost.plan(q, k, v, causal=causal, backend="wgmma")
            assert plan["kernel"].startswith(f"wgmma_tma_hdim{d}"), where
            assert plan["persistent"] == persistent_grid(d, lq, lk, causal, b * h), where
            out, lse = waveboost.attention(q, k, v, causal=causal, softmax_scale=s, backend="wgmma",
                                           return_lse=True)
            ref, ref_lse = reference(q, k, v, causal, s)
            assert torch.isfinite(out).all(), where
            assert (out.double() - ref).abs().max().item() < 2e-2, where
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse), finite), where
            assert (lse.double() - ref_lse)[finite].abs().max().item() < 1e-3, where
            if causal and lq > lk:
                assert out[:, : lq - lk].abs().max().item() == 0, where

    for lens_q, lens_k, causal in varlen:
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
        q = torch.randn(sum(lens_q), 4, d, generator=g, device="cuda").to(torch.bfloat16)
        k = torch.randn(sum(lens_k), 2, d, generator=g, device="cuda").to(torch.bfloat16)
        v = torch.randn(sum(lens_k), 2, d, generator=g, device="cuda").to(torch.bfloat16)
        out = waveboost.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                         causal=causal, backend="wgmma")
        for i in range(len(lens_q)):
            if lens_q[i] == 0:
                continue
            qs = q[cu_q[i]:cu_q[i + 1]][None]
            ks, vs = k[cu_k[i]:cu_k[i + 1]][None], v[cu_k[i]:cu_k[i + 1]][None]
            got = out[cu_q[i]:cu_q[i + 1]].double()
            if lens_k[i] == 0:
                assert got.abs().max().item() == 0, (i, causal)
                continue
            ref, _ = reference(qs, ks, vs, causal, d ** -0.5)
            assert (got - ref[0]).abs().max().item() < 2e-2, (i, causal)


def test_tma_pipeline_head_dim_64_blocks_of_192_rows():
    """At head dim 64 the TMA kernel runs blocks of 192 query rows (three consumer warpgroups) from
    2048 query rows on (causal: 4097), blocks of 64 rows below (16-bit causal calls, and non-causal ones
    under 1024 rows, over 64-key tiles, three blocks per SM): both sides of the thresholds,
    query lengths that leave a partial last block, causal with more and with fewer queries than keys
    (rows that see no key: zeros, LSE -inf), GQA, a negative scale, and varlen batches whose longest
    sequence crosses the threshold."""
    cases = [  # batch, heads, heads_kv, seqlen_q, seqlen_k, causal, scale
        (1, 4, 2, 2047, 600, False, None),  # 64-row blocks
        (4, 8, 2, 1023, 2300, False, 0.4),  # 64-row blocks over 64-key tiles, one block per query block
        (4, 8, 2, 1024, 2300, False, None),  # 64-row blocks over 128-key tiles, one block per query block
        (3, 4, 2, 700, 1500, True, -0.4),  # 64-row blocks, causal
        (1, 8, 2, 2048, 2048, True, None),  # 64-row blocks (causal up to 4096)
        (2, 3, 1, 2700, 2400, True, None),  # 64-row blocks, 300 rows see no key
        (1, 4, 2, 4096, 4096, True, None),  # 64-row blocks, the last causal height under the threshold
        (1, 4, 2, 4097, 4097, True, None),  # 192-row blocks
        (1, 3, 1, 4500, 4200, True, -0.2),  # 192-row blocks, 300 rows see no key
        (2, 2, 1, 2305, 257, False, 0.3),
    ]  # grids of at least half the SMs' worth of 128-row blocks on an H100: no split-KV
    # Varlen: packed sequences of 2700, 0, 37 and 2049 query rows (max 2700: the 192-row kernel), and
    # of 1000, 1, 0 and 517 (max 1000: 64-row blocks).
    varlen = [([2700, 0, 37, 2049], [2600, 5, 0, 1500], c) for c in (False, True)] + [
        ([1000, 1, 0, 517], [1300, 200, 9, 0], c) for c in (False, True)]
    _check_block_heights(64, cases, varlen, seed=19)


def test_tma_pipeline_head_dim_128_short_causal_blocks():
    """At head dim 128 causal calls under 1280 query rows that do not run the persistent grid (a grid of
    fewer 128-row query blocks than SMs, a sequence layout, or WAVEBOOST_WGMMA_PERSISTENT=0 in the child
    process of test_persistent_and_one_block_per_item_forms_forced) run blocks of 64 rows over 64-key tiles
    (two per SM), the rest blocks of 128 rows over 128-key tiles: both sides of the threshold, partial last
    blocks and key tiles, causal with more and with fewer queries than keys, GQA, a negative scale,
    a single row and key, and varlen batches on either side."""
    cases = [  # batch, heads, heads_kv, seqlen_q, seqlen_k, causal, scale
        (2, 16, 4, 1279, 1279, True, None),  # 64 x 64 blocks (persistent 128 x 128 unless forced off)
        (4, 4, 2, 1000, 1100, True, 0.3),  # 128 query blocks of 128 rows, fewer than the SMs: 64 x 64 blocks
        (1, 16, 8, 1280, 1400, True, -0.3),  # 128 x 128 blocks
        (4, 16, 4, 300, 200, True, None),  # 100 rows see no key
        (8, 16, 2, 97, 1025, True, 0.2),  # fewer queries than keys
        (70, 2, 1, 1, 1, True, None),
        (4, 16, 4, 700, 700, False, None),  # non-causal: 128 x 128 blocks
    ]  # grids of at least half the SMs' worth of 128-row blocks on an H100: no split-KV
    varlen = [([1000, 1, 0, 517], [1300, 200, 9, 0], True), ([1500, 3, 1200], [1500, 70, 1300], True),
              ([1000, 1, 0, 517], [1300, 200, 9, 0], False)]
    _check_block_heights(128, cases, varlen, seed=23)


def test_persistent_kernel_blocks_take_several_items():
    """Non-causal head dim 128 calls of at most 8192 keys run the persistent TMA kernel (at most one
    wave of blocks, each taking every gridDim.x-th query block; WAVEBOOST_WGMMA_PERSISTENT=1 runs it
    for every non-causal head dim 128 call, the child process below; past 8192 keys, unforced, 16-bit calls run
    one block per query block on tiles of 192 keys): grids of 2-8 query blocks per
    block, partial last query blocks and key tiles, GQA and MQA, and negative scales (Q negated in
    shared memory after its TMA load). So do head dim 64's non-causal calls under 2048 query rows
    (64-row blocks, two per SM) of at most 2048 keys. Causal head dim 128 calls run it too: from 8192 query
    rows the heaviest query blocks of every head first, below that (grids that fill a wave) the grid's order
    dealt back and forth to the blocks; and causal head dim 64 calls under 2048 query rows (64-row blocks,
    three per SM) a head's query blocks in pairs of equal work, an odd count's middle block alone."""
    d128 = [  # batch, heads, heads_kv, seqlen_q, seqlen_k, causal, scale
        (4, 16, 4, 1000, 1000, False, None),  # 512 query blocks
        (3, 20, 5, 777, 1024, False, -0.3),
        (8, 16, 2, 300, 97, False, 0.2),
        (2, 32, 1, 2500, 3100, False, 0.7),
        (2, 16, 2, 600, 8500, False, -0.7),  # persistent only when forced, else 192-key tiles
        (2, 8, 2, 1100, 9000, False, 0.3),  # 192-key tiles unless forced persistent: a last tile of 168 keys
        (4, 16, 4, 1000, 600, True, -0.3),  # rows 0-399 see no key
        (2, 16, 4, 1500, 1300, True, None),  # 128 x 128 causal blocks, rows 0-199 see no key
        (1, 32, 8, 2100, 2600, True, 0.4),  # more keys than queries
        (1, 3, 1, 8250, 8200, True, None),  # persistent unforced: 195 query blocks, rows 0-49 see no key
    ]
    d64 = [(2, 16, 2, 1500, 1500, False, -0.5), (3, 12, 3, 2900, 2500, True, None),
           (4, 16, 4, 1000, 1000, True, None),  # 8 pairs of query blocks per head
           (3, 24, 4, 650, 700, True, -0.3),  # 11 query blocks: 5 pairs and the middle block alone
           (4, 16, 4, 900, 600, True, 0.5),  # rows 0-299 see no key
           (6, 20, 4, 333, 129, False, 0.3), (1, 64, 8, 1000, 1000, False, None),
           (2, 24, 4, 700, 2100, False, None)]  # persistent only when forced
    _check_block_heights(128, d128, [], seed=29)
    _check_block_heights(64, d64, [], seed=31)


def test_persistent_and_one_block_per_item_forms_forced():
    """The two forms of the TMA kernel, each forced for every call it can take in a child process
    (WAVEBOOST_WGMMA_PERSISTENT is read once per process): 0, the one-block-per-query-block form
    (which varlen batches always run), on the dense wgmma reference tests and the
    block-shape tests; 1, the persistent form, on the block-shape tests."""
    from reference import pytest_in_child

    pytest_in_child(os.path.join(HERE, "test_gpu.py"), "wgmma and matches_reference and not split",
                    {"WAVEBOOST_WGMMA_PERSISTENT": "0"})
    for forced in ("0", "1"):
        pytest_in_child(__file__, "blocks_of_192 or short_causal or several_items or bigger_buffer",
                        {"WAVEBOOST_WGMMA_PERSISTENT": forced})
