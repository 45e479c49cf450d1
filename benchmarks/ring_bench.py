"""Context-parallel scaling: now part of the benchmark suite, `waveboost.bench.distributed`.

    python -m waveboost.bench --distributed 2 [--seqlens 65536,131072,262144] [--out DIR]
    torchrun --nproc-per-node 2 -m waveboost.bench.distributed [...]     (the same)
    torchrun --nproc-per-node 2 benchmarks/ring_bench.py [...]           (this file: forwards to it)

`python -m waveboost.bench --distributed 2 --help` lists the options and defines the columns.
"""

import sys

from waveboost.bench.distributed import main

if __name__ == "__main__":
    sys.exit(main())
