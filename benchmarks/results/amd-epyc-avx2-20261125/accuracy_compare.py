"""accuracy_compare.py A.npz B.npz: per case, whether A and B are bitwise equal, and each one's error
against the float64 reference (tests/reference.py): max |out - ref| / max |ref| and max |lse - ref_lse|.
A NaN key makes waveboost's rows NaN (the reference's 0): NaN rows must match A's, -inf LSE the reference's.
"""
import os
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "tests"))
sys.path.insert(0, here)
from accuracy_run import SHAPES, cases, inputs  # noqa: E402
from reference import attention_ref  # noqa: E402

a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
worst = {}
for si, dtype, causal, key in cases():
    q, k, v = inputs(si, dtype)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    same = all(np.array_equal(a[key + s], b[key + s], equal_nan=True) for s in ("_o", "_lse"))
    errs = []
    for run in (a, b):
        o, lse = run[key + "_o"], run[key + "_lse"]
        fin = np.isfinite(ref) & ~np.isnan(o)  # a NaN key: waveboost's rows are NaN, the reference's 0
        e = np.abs(o - ref)[fin].max() / max(np.abs(ref[fin]).max(), 1e-300) if fin.any() else 0.0
        lfin = np.isfinite(ref_lse)
        lfin &= ~np.isnan(lse)
        el = np.abs(lse - ref_lse)[lfin].max() if lfin.any() else 0.0
        nan_ok = (np.array_equal(np.isnan(o), np.isnan(a[key + "_o"])) and
                  np.array_equal(np.isnan(lse), np.isnan(a[key + "_lse"])) and
                  np.array_equal(np.isneginf(lse), np.isneginf(ref_lse) & ~np.isnan(lse)))
        errs.append((e, el, nan_ok))
    name = np.dtype(dtype).name
    for i in range(2):
        w = worst.setdefault((name, i), [0, 0, True])
        w[0], w[1], w[2] = max(w[0], errs[i][0]), max(w[1], errs[i][1]), w[2] and errs[i][2]
    print(f"{key:14s} {str(SHAPES[si]):28s} bitwise={'yes' if same else 'no ':3s} "
          f"A: out {errs[0][0]:.2e} lse {errs[0][1]:.2e}  B: out {errs[1][0]:.2e} lse {errs[1][1]:.2e} "
          f"NaN rows as A, -inf LSE as ref {errs[0][2]}/{errs[1][2]}")
for (name, i), w in sorted(worst.items()):
    print(f"worst {name} {'AB'[i]}: out rel {w[0]:.2e}, lse abs {w[1]:.2e}, NaN rows as A and -inf LSE as ref: {w[2]}")
