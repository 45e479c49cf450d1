# Backward alone, bf16, FA2 grid (batch = 16384 / L, heads = 2048 / D): the wgmma main kernels
# (WAVEBOOST_WGMMA_BACKWARD, read per call) interleaved with SDPA flash and cuDNN; CUDA events, median of
# ROUNDS (15) rounds after 3 warm-up calls each, every round timing each implementation once in turn.
#   python3 time_backward.py time.csv
import csv, os, statistics, sys
import torch, waveboost
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
out_csv = sys.argv[1]
ROUNDS = int(os.environ.get("ROUNDS", "15"))
pipes = ["cp.async", "tma-red", "tma"]
rows = []
print("D L causal | ms: " + " ".join(pipes) + " sdpa_flash sdpa_cudnn | TFLOP/s tma | tma/flash tma/cp.async tma/cudnn tma-red/flash")
for D in (64, 128):
    for L in (1024, 4096, 16384):
        for causal in (False, True):
            B, H = 16384 // L, 2048 // D
            q, k, v, do = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
            fns = {}
            for pipe in pipes:
                def f(pipe=pipe):
                    os.environ["WAVEBOOST_WGMMA_BACKWARD"] = pipe
                    waveboost.attention_backward(do, q, k, v, out, lse, causal=causal, backend="wgmma")
                fns[pipe] = f
            for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
                try:
                    with sdpa_kernel(be):
                        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    g = do.transpose(1, 2)
                    fns[name] = lambda o=o, qt=qt, kt=kt, vt=vt, g=g: torch.autograd.grad(o, (qt, kt, vt), g, retain_graph=True)
                except Exception as e:
                    print("skip", name, e)
            for f in fns.values():
                for _ in range(3):
                    f()
            torch.cuda.synchronize()
            ts = {n: [] for n in fns}
            for _ in range(ROUNDS):
                for n, f in fns.items():
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(); f(); b.record(); b.synchronize()
                    ts[n].append(a.elapsed_time(b))
            med = {n: statistics.median(x) for n, x in ts.items()}
            flops = 2.5 * 4 * B * H * L * L * D / (2 if causal else 1)
            for n, ms in med.items():
                rows.append(dict(head_dim=D, seqlen=L, causal=int(causal), batch=B, heads=H, impl=n,
                                 ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}"))
            g = lambda n: med.get(n, float("nan"))
            print(D, L, int(causal), "|", " ".join(f"{g(n):.3f}" for n in pipes + ["sdpa_flash", "sdpa_cudnn"]), "|",
                  f"{flops / g('tma') / 1e9:.0f}", "|",
                  f"{g('sdpa_flash') / g('tma'):.2f} {g('cp.async') / g('tma'):.2f} {g('sdpa_cudnn') / g('tma'):.2f} "
                  f"{g('sdpa_flash') / g('tma-red'):.2f}", flush=True)
            del fns, q, k, v, do, out, lse
            torch.cuda.empty_cache()
with open(out_csv, "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
