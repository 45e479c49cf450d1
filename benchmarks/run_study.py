"""Runs the committed study into benchmarks/results/<device>-<YYYYMMDD>/<run>/.

    python benchmarks/run_study.py            # every run of this machine's device
    python benchmarks/run_study.py fa2-float16 seed

On a GPU each run is one command of a few minutes (fa2 is split by dtype to stay under
~6 minutes on an H100); on a machine without one the study is the quick preset.
"""

from __future__ import annotations

import os
import sys
from datetime import date

from waveboost.bench import main, report
from waveboost.bench.cli import resolve_device

RUNS = {
    "cuda": {
        "fa2-float16": ["--preset", "fa2", "--dtypes", "float16"],
        "fa2-bfloat16": ["--preset", "fa2", "--dtypes", "bfloat16"],
        "fa2-float32": ["--preset", "fa2", "--dtypes", "float32", "--seqlens", "1024,4096"],  # ANCHORS.md's fp32 table
        "seed": ["--preset", "seed"],
        "models": ["--preset", "models"],
    },
    "cpu": {"quick": ["--quick"]},
}


def run_study(names: list[str]) -> int:
    device = resolve_device("auto")
    runs = RUNS[device]
    unknown = [n for n in names if n not in runs]
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown} for {device}; choose from {', '.join(runs)}")
    folder = f"{report.slug(report.environment(device)['name'])}-{date.today():%Y%m%d}"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", folder)
    status = 0
    for name in names or list(runs):
        status |= main(runs[name] + ["--device", device, "--out", os.path.join(root, name)])
    return status


if __name__ == "__main__":
    sys.exit(run_study(sys.argv[1:]))
