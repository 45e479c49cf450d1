import sys, torch, waveboost
L = int(sys.argv[1]); causal = sys.argv[2] == "1"; D = 128; H = 16; B = 16384 // L
torch.manual_seed(0)
mk = lambda: torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
q, k, v, do = mk(), mk(), mk(), mk()
out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True)
for _ in range(2): waveboost.attention_backward(do, q, k, v, out, lse, causal=causal)
torch.cuda.synchronize()
