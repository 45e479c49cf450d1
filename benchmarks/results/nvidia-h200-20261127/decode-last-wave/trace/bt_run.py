# Block trace: each shape's decode step run 6 times on distinct cache copies, synchronized; the trace build
# writes (t0, t1, smid, grid) per block into the buffer at WB_BT_PTR. Prints "CALL" and "BT" lines for bt_tab.py.
import os, sys, torch, waveboost
shapes = [tuple(int(n) for n in s.split("x")) for s in sys.argv[1].split(",")]
g = torch.Generator(device="cuda").manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16)
buf = torch.zeros(4 * (1 << 20), dtype=torch.int64, device="cuda")
os.environ["WB_BT_PTR"] = str(buf.data_ptr())
for si, (B, L, H, HKV) in enumerate(shapes):
    d = 128
    q = r(B, 1, H, d)
    caches = [(r(B, L, HKV, d), r(B, L, HKV, d)) for _ in range(3)]
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    for i in range(6):
        k, v = caches[i % 3]
        scale = 0.01 * (si * 10 + i + 1)
        buf.zero_(); torch.cuda.synchronize()
        waveboost.attention_with_kvcache(q, k, v, lens, softmax_scale=scale)
        torch.cuda.synchronize()
        e = buf.view(-1, 4).cpu()
        grid = int(e[0, 3])
        print(f"CALL {scale:.6f} {B}x{L}x{H}x{HKV} {i}")
        for b in range(grid):
            t0, t1, sm, gr = (int(x) for x in e[b])
            print(f"BT {b} {sm} {t0} {t1} {scale:.6f} {gr}")
