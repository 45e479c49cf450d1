"""Tables of decode_probe.py runs: the JSON lines of several trees or settings (and a peer) as one markdown
table of medians and ratios.

    python benchmarks/probe_table.py PROBE.jsonl --base A --new B [--impl wb_blhd] [--peer sdpa_cudnn]
    python benchmarks/probe_table.py PROBE.jsonl --base A --new B --kernels
    python benchmarks/probe_table.py MERGE.jsonl --base A --new B --merge

Lines with the waveboost impl are tagged `NAME-ROUND-SET` (decode_probe.py --tag; NAME is a tree or a setting,
e.g. `main-1-d128`), peer lines `PEERNAME-SET` (e.g. `cudnn-d128`). Per set and shape: the medians over rounds
of NAME = A and B, B's % of peak and pieces, A / B (> 1: B faster), and, where the peer ran on that set and
shape, its median and peer / B. --kernels: from the same lines (decode_probe.py --kernels), the medians of each
kind of kernel's device time per step (decode kernels, combine kernels), A / B. --merge: merge_probe.py lines,
tagged `NAME-ROUND`: per shape and part dtype the medians of A and B, their % of peak, A / B.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics


def table(lines, base, new, impl="wb_blhd", peer="sdpa_cudnn"):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))  # (set, shape) -> name -> rows
    for r in lines:
        tag = r.get("tag", "").split("-")
        key = "x".join(map(str, r["shape"]))
        if impl in r and len(tag) >= 3:
            runs[(tag[2], key)][tag[0]].append(r)
        elif peer in r and len(tag) >= 2:
            runs[(tag[1], key)]["peer"].append(r)
    out = [f"| set | shape | {base} us | {new} us (% of peak, pieces) | {base} / {new} | {peer} us (% of peak) "
           f"| {peer} / {new} |", "|---|---|---|---|---|---|---|"]
    for (name, shape), by in runs.items():
        if base not in by or new not in by:
            continue
        a = statistics.median(r[impl] for r in by[base])
        b = statistics.median(r[impl] for r in by[new])
        last = by[new][-1]
        cells = [name, shape, f"{a:.2f}", f"{b:.2f} ({last.get(impl + '_pct')}, {last.get('splits', '-')})",
                 f"{a / b:.3f}", "", ""]
        if by.get("peer"):
            c = statistics.median(r[peer] for r in by["peer"])
            cells[5:] = [f"{c:.2f} ({by['peer'][-1].get(peer + '_pct')})", f"{c / b:.3f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _kernel_kind(name):
    return "combine" if "combine" in name else "decode" if "decode" in name else "other"


def kernel_table(lines, base, new, impl="wb_blhd"):
    """Per set and shape, the medians over rounds of each kind of kernel's device time per step."""
    runs = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for r in lines:
        tag = r.get("tag", "").split("-")
        if impl + "_kernels" not in r or len(tag) < 3:
            continue
        per_kind = collections.defaultdict(float)
        for name, us in r[impl + "_kernels"].items():
            per_kind[_kernel_kind(name)] += us
        for kind, us in per_kind.items():
            runs[(tag[2], "x".join(map(str, r["shape"])))][tag[0]][kind].append(us)
    out = [f"| set | shape | decode kernel {base} / {new} us | combine {base} / {new} us |", "|---|---|---|---|"]
    for (name, shape), by in runs.items():
        if base not in by or new not in by:
            continue
        cells = [name, shape]
        for kind in ("decode", "combine"):
            a, b = by[base].get(kind), by[new].get(kind)
            cells.append(f"{statistics.median(a):.2f} / {statistics.median(b):.2f}" if a and b else
                         f"{statistics.median(a):.2f} / -" if a else f"- / {statistics.median(b):.2f}" if b else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def merge_table(lines, base, new):
    """merge_probe.py lines: per shape and part dtype, the medians of A and B and A / B."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in lines:
        if "waveboost" in r:
            runs[("x".join(map(str, r["shape"])), r["parts_dtype"])][r.get("tag", "").split("-")[0]].append(r)
    out = [f"| shape (parts x batch x L x heads x head dim) | parts | {base} us (% of peak) | {new} us (% of peak) "
           f"| {base} / {new} |", "|---|---|---|---|---|"]
    for (shape, dtype), by in sorted(runs.items()):
        if base not in by or new not in by:
            continue
        a, b = (statistics.median(r["waveboost"] for r in by[n]) for n in (base, new))
        out.append(f"| {shape} | {dtype} | {a:.2f} ({by[base][-1].get('waveboost_pct')}) | {b:.2f} "
                   f"({by[new][-1].get('waveboost_pct')}) | {a / b:.3f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", help="decode_probe.py output (JSON lines; other lines are skipped)")
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--impl", default="wb_blhd")
    ap.add_argument("--peer", default="sdpa_cudnn")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--kernels", action="store_true", help="each kind of kernel's device time per step")
    what.add_argument("--merge", action="store_true", help="merge_probe.py lines")
    args = ap.parse_args(argv)
    with open(args.probe) as f:
        lines = [json.loads(x) for x in f if x.startswith("{")]
    if args.kernels:
        print(kernel_table(lines, args.base, args.new, args.impl))
    elif args.merge:
        print(merge_table(lines, args.base, args.new))
    else:
        print(table(lines, args.base, args.new, args.impl, args.peer))


if __name__ == "__main__":
    main()
