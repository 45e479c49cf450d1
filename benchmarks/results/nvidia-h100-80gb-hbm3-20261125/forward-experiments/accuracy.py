import sys, torch, waveboost
tag=sys.argv[1]
g=torch.Generator(device="cuda").manual_seed(5)
for dt in (torch.bfloat16, torch.float16):
    for d in (64,128):
        for causal in (False, True):
            q,k,v=[torch.randn(2,1024,8,d,generator=g,device="cuda").to(dt) for _ in range(3)]
            q=q*2
            out=waveboost.attention(q,k,v,causal=causal,backend="wgmma")
            qd,kd,vd=[x.double().transpose(1,2) for x in (q,k,v)]
            s=qd@kd.transpose(-1,-2)*d**-0.5
            if causal:
                s=s.masked_fill(torch.ones(1024,1024,device="cuda",dtype=torch.bool).triu(1), float("-inf"))
            ref=(s.softmax(-1)@vd).transpose(1,2)
            e=(out.double()-ref).abs()
            print(tag, str(dt)[6:], d, int(causal), f"max {e.max().item():.3e} mean {e.mean().item():.3e}")
