"""One decode step three times (bf16, head dim 128): python3 one_step.py BxLxHxHKV [seqlen_q]; for ncu."""
import sys, torch, waveboost
b, lk, h, hkv = map(int, sys.argv[1].split("x"))
sq = int(sys.argv[2]) if len(sys.argv) > 2 else 1
g = torch.Generator(device="cuda").manual_seed(0)
kc = torch.randn(b, lk, hkv, 128, generator=g, device="cuda").to(torch.bfloat16)
vc = torch.randn(b, lk, hkv, 128, generator=g, device="cuda").to(torch.bfloat16)
q = torch.randn(b, sq, h, 128, generator=g, device="cuda").to(torch.bfloat16)
n = torch.full((b,), lk, dtype=torch.int32, device="cuda")
for _ in range(3):
    waveboost.attention_with_kvcache(q, kc, vc, n, causal=sq > 1)
torch.cuda.synchronize()
