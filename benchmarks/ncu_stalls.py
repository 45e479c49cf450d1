"""Summarize the per-instruction page of an Nsight Compute report (`ncu --import R --page source
--print-source sass --csv > R.csv`): warp stall samples by reason and by opcode, then the instructions
with the most samples, each with its two main stall reasons and its shared-memory bank conflicts.

    ncu --set full --import-source no -k regex:flash_bwd_wgmma_ws --launch-skip 1 --launch-count 1 -o R \
        python benchmarks/ab_time.py x --pass bwd --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 4096 \
        --causal 0 --repeats 1
    ncu --import R.ncu-rep --page source --print-source sass --csv > R.csv
    python benchmarks/ncu_stalls.py R.csv [TOP]

The samples count every warp of the kernel, so in a warp-specialized kernel the producer's and the
writer's waits appear beside the consumers' stalls.
"""
import collections
import csv
import sys


def main(argv):
    rows = list(csv.reader(open(argv[0])))
    top = int(argv[1]) if len(argv) > 1 else 30
    header = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    ix = {h: i for i, h in enumerate(rows[header])}
    data = rows[header + 1:]

    def samples(r):
        return int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)

    total = sum(samples(r) for r in data) or 1
    reasons = [h for h in rows[header] if h.startswith("stall_") and "Not Issued" not in h]
    by_reason = collections.Counter()
    by_opcode = collections.Counter()
    for r in data:
        for h in reasons:
            by_reason[h[6:]] += int(r[ix[h]] or 0)
        words = [w for w in r[ix["Source"]].split() if not w.startswith("@")]
        by_opcode[words[0].split(".")[0] if words else "?"] += samples(r)
    print(f"samples {total}, instructions {len(data)}")
    print("by reason: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10)))
    print("by opcode: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_opcode.most_common(15)))
    for r in sorted(data, key=samples, reverse=True)[:top]:
        main_reasons = sorted(((int(r[ix[h]] or 0), h[6:]) for h in reasons), reverse=True)[:2]
        print(f"{r[ix['Address']][-5:]} {100 * samples(r) / total:5.2f}% {r[ix['Source']].strip()[:58]:58s} "
              f"{' '.join(f'{n}:{c}' for c, n in main_reasons)}  conflicts {r[ix['L1 Conflicts Shared N-Way']]} "
              f"excess wavefronts {r[ix['L1 Wavefronts Shared Excessive']]}")


if __name__ == "__main__":
    main(sys.argv[1:])
