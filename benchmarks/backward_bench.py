"""Backward and forward+backward on the FlashAttention-2 grid: a preset of the benchmark suite.

    python benchmarks/backward_bench.py [suite flags, e.g. --dtypes fp16 --seqlens 1024,4096,16384 --out DIR]

Runs `python -m waveboost.bench --preset fa2 --pass bwd,fwdbwd` on bf16, L = 1k and 4k, with waveboost's
backward backends (naive, mma; auto with and without deterministic=True) beside SDPA flash, cuDNN and
efficient, JAX cuDNN and FlashAttention-3 (flash_attn3_jax) where installed; every gradient is
checked against a float64 backward before it is timed. FLOPs: forward 4*B*H*L^2*D, backward 2.5x,
forward + backward 3.5x, halved for causal. Flags given here replace these defaults.
"""

import sys

from waveboost.bench import main

DEFAULTS = ["--preset", "fa2", "--pass", "bwd,fwdbwd", "--dtypes", "bf16", "--seqlens", "1024,4096",
            "--impls", "waveboost_*,sdpa_flash,sdpa_cudnn,sdpa_eff,jax_cudnn,fa3"]

if __name__ == "__main__":
    sys.exit(main(DEFAULTS + sys.argv[1:]))
