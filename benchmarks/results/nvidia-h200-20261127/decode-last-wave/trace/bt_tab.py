# Table of a block trace: per call (warm-up calls 0-1 dropped), span, per-SM busy fractions, tail.
import sys, collections, statistics as st
calls = {}; blocks = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    if not w: continue
    if w[0] == "CALL": calls[f"{float(w[1]):.6f}"] = (w[2], int(w[3]))
    elif w[0] == "BT": blocks[f"{float(w[5]):.6f}"].append((int(w[1]), int(w[2]), int(w[3]), int(w[4]), int(w[6])))
rows = collections.defaultdict(list)
for key, bl in blocks.items():
    if key not in calls or calls[key][1] < 2: continue
    shape = calls[key][0]
    t0 = min(b[2] for b in bl); t1 = max(b[3] for b in bl); span = t1 - t0
    sms = collections.defaultdict(list)
    for b in bl: sms[b[1]].append((b[2], b[3]))
    nsm = 132
    # time-weighted concurrency per SM
    conc = collections.Counter()
    for sm, iv in sms.items():
        ev = sorted([(a, 1) for a, _ in iv] + [(e, -1) for _, e in iv])
        c = 0; last = t0
        for t, d in ev:
            conc[c] += t - last; last = t; c += d
        conc[c] += t1 - last
    conc[0] += (nsm - len(sms)) * span
    tot = nsm * span
    dur = [b[3] - b[2] for b in bl]
    ends = sorted(b[3] for b in bl)
    grid = bl[0][4]
    # tail: from the moment fewer than 90% of the SMs have a block running to the end
    starts_ends = sorted([(b[2], 1) for b in bl] + [(b[3], -1) for b in bl])
    running = 0; tail_from = t1
    sm_ev = sorted([(t, d, b[1]) for b in bl for t, d in ((b[2], 1), (b[3], -1))])
    per_sm = collections.Counter(); busy_sms = 0; last_full = t0
    for t, d, sm in sm_ev:
        before = per_sm[sm] > 0
        per_sm[sm] += d
        after = per_sm[sm] > 0
        busy_sms += (after - before)
        if busy_sms >= 0.9 * nsm: last_full = t
    rows[shape].append((span / 1e3, conc[0] / tot, conc[1] / tot, conc[2] / tot, st.median(dur) / 1e3,
                        min(dur) / 1e3, max(dur) / 1e3, (t1 - last_full) / 1e3, grid, len(bl), len(sms)))
def gbs(shape, us):
    B, L, H, HKV = (int(x) for x in shape.split("x"))
    return 2 * B * L * HKV * 128 * 2 / (us * 1e-6) / 1e9
print("shape | grid blocks(run) SMs | span us | SM idle / 1 block / 2 blocks (time frac) | block us med [min,max] | tail us (<90% SMs busy) | KV bytes / span")
for shape, rs in rows.items():
    m = lambda i: st.median(r[i] for r in rs)
    print(f"{shape} | {rs[0][8]} ({rs[0][9]}) {rs[0][10]} | {m(0):.1f} | {m(1):.3f} / {m(2):.3f} / {m(3):.3f} | "
          f"{m(4):.1f} [{m(5):.1f}, {m(6):.1f}] | {m(7):.1f} | {gbs(shape, m(0)):.0f} GB/s  (n={len(rs)})")
