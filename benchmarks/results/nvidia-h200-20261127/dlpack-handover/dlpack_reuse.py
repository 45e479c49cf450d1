"""Does releasing torch's DLPack view of a JAX array before torch's queued copy of it runs let JAX reuse the
memory under torch's read? mode 'view' (the old helper: from_dlpack after block_until_ready, view dropped at
once) or 'helper' (tests/reference.torch_from_jax)."""
import os, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import torch, jax, jax.numpy as jnp
sys.path.insert(0, "tests")
from reference import torch_from_jax
mode, iters = sys.argv[1], int(sys.argv[2])
gpu = [d for d in jax.devices() if d.platform == "gpu"][0]
big = torch.randn(8192, 8192, device="cuda")
n = 1 << 20
bad = 0
for it in range(iters):
    x = jax.device_put(jnp.full((n,), float(it + 1), jnp.float32), gpu)
    for _ in range(4):
        big = (big @ big) * 1e-4  # torch's stream busy for a few ms
    if mode == "view":
        d = torch.from_dlpack(x.block_until_ready()).double()
    else:
        d = torch_from_jax(x).double()
    del x
    y = jax.device_put(jnp.full((n,), -7.0, jnp.float32), gpu).block_until_ready()
    torch.cuda.synchronize()
    if not bool((d == it + 1).all()):
        bad += 1
    del y
print(f"mode {mode}: {bad} of {iters} copies wrong")
