import sys, torch, waveboost
d, L, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = max(1, 16384 // L), 2048 // d
q, k, v = [torch.randn(b, L, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
for _ in range(3):
    waveboost.attention(q, k, v, causal=causal, backend="wgmma")
torch.cuda.synchronize()
