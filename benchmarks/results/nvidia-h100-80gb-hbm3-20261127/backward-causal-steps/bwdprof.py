# per-kernel GPU times of one backward (waveboost wgmma vs SDPA cuDNN / flash), torch.profiler
import sys, torch, waveboost, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import sdpa_kernel, SDPBackend
L = int(sys.argv[1]); causal = sys.argv[2] == "1"; D = 128; H = 16; B = 16384 // L
torch.manual_seed(0)
mk = lambda: torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
q, k, v, do = mk(), mk(), mk(), mk()
out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
def wb(): return waveboost.attention_backward(do, q, k, v, out, lse, causal=causal)
qt, kt, vt = [x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v)]
def peer(be):
    with sdpa_kernel([be]):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return lambda: torch.autograd.grad(o, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)
fns = {"wb": wb, "cudnn": peer(SDPBackend.CUDNN_ATTENTION), "flash": peer(SDPBackend.FLASH_ATTENTION)}
for name, fn in fns.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): fn()
        torch.cuda.synchronize()
    evs = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            evs.setdefault(e.name, []).append(e.device_time)
    flops = 2.5 * 4 * B * H * L * L * D * (0.5 if causal else 1)
    tot = sum(sum(t) for t in evs.values()) / 5
    print(f"L={L} causal={int(causal)} {name}: total {tot:.1f} us/iter  {flops/tot/1e6:.1f} TFLOP/s")
    for n, t in sorted(evs.items(), key=lambda x: -sum(x[1])):
        print(f"   {sum(t)/len(t):9.1f} us x{len(t)//5}  {n[:110]}")
