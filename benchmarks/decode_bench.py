"""Decode, paged decode and variable-length decode: the serving presets of the benchmark suite.

    python benchmarks/decode_bench.py --out DIR [suite flags, e.g. --peak-gbs 3350 --impls 'waveboost_*,fa3*']

Runs `python -m waveboost.bench --preset P --cuda-graphs` for P = decode, paged and varlen into DIR/P:
one query per sequence (four, causal, for speculative verify) against KV caches of 2k-32k keys, bf16,
waveboost (auto and the decode backend) beside SDPA cuDNN / flash / efficient on dense caches, JAX cuDNN
and FlashAttention-3's kv-cache kernel (flash_attn3_jax.flash_mha_with_kvcache, the fastest of 1, 8 and
32 splits) where installed. waveboost and SDPA are timed by replaying a CUDA graph of one step (GPU time,
no host launch cost); JAX peers by a jitted loop of steps over enough cache copies to miss L2. GB/s counts
the K/V cache bytes read plus q and out; % of peak uses the device's HBM bandwidth (a table by GPU name,
else the driver's memory clock x bus width; --peak-gbs to give it). Flags given here replace the defaults.
"""

import os
import sys

from waveboost.bench import main


def run(argv: list[str]) -> int:
    out = "bench-results/decode"
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    status = 0
    for preset in ("decode", "paged", "varlen"):
        status = max(status, main(["--preset", preset, "--cuda-graphs", "--out", os.path.join(out, preset)] + argv))
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
