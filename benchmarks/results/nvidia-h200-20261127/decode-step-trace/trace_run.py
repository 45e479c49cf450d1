# One decode step at batch 1 x L keys (argv[1], default 2048; 32/8 heads, d 128) 20 times, synchronized;
# the kernel of a trace build (trace.patch here, or the H100 folder's) prints a TRACE line per block.
import sys, torch, waveboost
B, L, H, HKV, d = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 2048, 32, 8, 128
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)
q = r(B, 1, H, d); k = r(B, L, HKV, d); v = r(B, L, HKV, d)
lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
for i in range(20):
    waveboost.attention_with_kvcache(q, k, v, lens)
    torch.cuda.synchronize()
