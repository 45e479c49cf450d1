"""Command line: ``python -m waveboost info``, ``python -m waveboost capabilities`` and
``python -m waveboost --cmake-dir``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmake_dir() -> Path:
    """The folder holding waveboostConfig.cmake: put it on CMAKE_PREFIX_PATH (or set waveboost_DIR)."""
    here = Path(__file__).resolve().parent
    for candidate in sorted(here.glob("lib*/cmake/waveboost")):
        if (candidate / "waveboostConfig.cmake").is_file():
            return candidate
    raise FileNotFoundError(
        f"no waveboostConfig.cmake under {here}; this installation carries no C++ package "
        "(an editable or in-tree build?). Reinstall with `pip install .`."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m waveboost", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["info", "capabilities"],
                        help="info: version, CUDA build and devices; capabilities: what each backend can run here")
    parser.add_argument("--cmake-dir", action="store_true", help="print the CMake package folder and exit")
    args = parser.parse_args(argv)
    if args.cmake_dir:
        try:
            print(cmake_dir())
        except FileNotFoundError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    if args.command == "info":
        from . import info

        facts = info()
        print(f"waveboost {facts['version']}")
        archs = facts["cuda_architectures"] or "-"
        print(f"CUDA compiled in: {'yes' if facts['cuda_compiled'] else 'no'} (architectures: {archs})")
        print(f"GPUs: {', '.join(facts['gpus']) if facts['gpus'] else 'none visible'}")
        print(f"backends this machine can run: {', '.join(facts['backends'])}")
        print(f"CPU path: {facts['cpu_isa']}, {facts['cpu_threads']} threads")
        return 0
    if args.command == "capabilities":
        from . import capabilities

        for r in capabilities():
            if not r["available"]:
                print(f"{r['backend']} ({r['device']}): not available here: {r['reason']}")
                continue
            dims = "any" if r["any_head_dim"] else ",".join(map(str, r["head_dims"]))
            flags = [f for f in ("causal", "gqa", "varlen", "seqused", "paged", "deterministic_backward") if r[f]]
            print(f"{r['backend']} ({r['device']}): forward {','.join(r['forward_dtypes'])}; "
                  f"backward {','.join(r['backward_dtypes']) or '-'}; head dims {dims}; {' '.join(flags)}")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
