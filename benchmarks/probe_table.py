"""Tables of decode_probe.py runs: the JSON lines of several trees or settings (and a peer) as one markdown
table of medians and ratios.

    python benchmarks/probe_table.py PROBE.jsonl --base A --new B [--impl wb_blhd] [--peer sdpa_cudnn]

Lines with the waveboost impl are tagged `NAME-ROUND-SET` (decode_probe.py --tag; NAME is a tree or a setting,
e.g. `main-1-d128`), peer lines `PEERNAME-SET` (e.g. `cudnn-d128`). Per set and shape: the medians over rounds
of NAME = A and B, B's % of peak and pieces, A / B (> 1: B faster), and, where the peer ran on that set and
shape, its median and peer / B.
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", help="decode_probe.py output (JSON lines; other lines are skipped)")
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--impl", default="wb_blhd")
    ap.add_argument("--peer", default="sdpa_cudnn")
    args = ap.parse_args(argv)
    with open(args.probe) as f:
        lines = [json.loads(x) for x in f if x.startswith("{")]
    print(table(lines, args.base, args.new, args.impl, args.peer))


if __name__ == "__main__":
    main()
