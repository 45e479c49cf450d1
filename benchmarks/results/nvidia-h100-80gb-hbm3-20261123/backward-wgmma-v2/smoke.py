# Gradient errors of the wgmma backward's three main kernels (WAVEBOOST_WGMMA_BACKWARD) against the
# naive backward in fp32 (max error / max |gradient|), beside mma's, on the cells of backward-wgmma/smoke.log;
# a cell is BAD if an error passes 2x mma's + 1e-2 or 1.5x the error that log lists.
#   python3 smoke.py ../backward-wgmma/smoke.log
import math, os, re, sys
import torch, waveboost
old = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\d+) (\d) (\(.*?\)) dq ([\d.e+-]+) .*? dk ([\d.e+-]+) .*? dv ([\d.e+-]+)", line)
    if m:
        old[(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4))] = [float(m.group(i)) for i in (5, 6, 7)]
torch.manual_seed(0)
pipes = ["tma", "tma-red", "cp.async"]
worst = {p: 0.0 for p in pipes}
bad = 0
for dt in (torch.bfloat16, torch.float16):
    for D in (64, 128):
        for causal in (False, True):
            for (B, Lq, Lk, H, Hk) in ((2, 300, 300, 4, 2), (1, 97, 257, 8, 8), (1, 1025, 1025, 2, 1), (2, 257, 97, 4, 4)):
                q = torch.randn(B, Lq, H, D, device="cuda", dtype=dt)
                k = torch.randn(B, Lk, Hk, D, device="cuda", dtype=dt)
                v = torch.randn(B, Lk, Hk, D, device="cuda", dtype=dt)
                do = torch.randn(B, Lq, H, D, device="cuda", dtype=dt)
                out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="mma")
                gm = waveboost.attention_backward(do, q, k, v, out, lse, causal=causal, backend="mma")
                f = lambda x: x.float()
                gr = waveboost.attention_backward(f(do), f(q), f(k), f(v), f(out), lse, causal=causal, backend="naive")
                key = (str(dt)[6:], D, int(causal), str((B, Lq, Lk, H, Hk)))
                parts = []
                for pipe in pipes:
                    os.environ["WAVEBOOST_WGMMA_BACKWARD"] = pipe
                    gw = waveboost.attention_backward(do, q, k, v, out, lse, causal=causal, backend="wgmma")
                    torch.cuda.synchronize()
                    errs = []
                    for i, (n, a, m, r) in enumerate(zip("qkv", gw, gm, gr)):
                        scale = r.abs().max().item() + 1e-6
                        ew = (a.float() - r).abs().max().item() / scale
                        em = (m.float() - r).abs().max().item() / scale
                        ref_old = old.get(key, [float("nan")] * 3)[i]
                        worst[pipe] = max(worst[pipe], ew / max(ref_old, 1e-9))
                        if not (ew <= 2 * em + 1e-2) or math.isnan(ew) or ew > 1.5 * ref_old:
                            bad += 1
                            errs.append(f"d{n} {ew:.1e} BAD (mma {em:.1e}, old {ref_old:.1e})")
                        else:
                            errs.append(f"d{n} {ew:.1e} (mma {em:.1e})")
                    parts.append(pipe + ": " + " ".join(errs))
                print(*key, " | ".join(parts), flush=True)
print("max ratio to smoke.log error per pipeline:", {p: round(w, 3) for p, w in worst.items()})
print("BAD cells:", bad)
