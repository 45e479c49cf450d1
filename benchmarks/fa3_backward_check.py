"""FlashAttention-3's JAX wheel (flash_attn3_jax): its backward, non-causal and causal, against a float32
reference, through the bench's pattern (jax.vjp's function applied under jax.jit) and through plain jax.grad.

    PYTHONPATH=<wheel site> python benchmarks/fa3_backward_check.py

Prints one line per (shape, causal): the forward's and each gradient's relative (Frobenius) error.
"""
import jax, jax.numpy as jnp, numpy as np
import flash_attn3_jax as fa3

def ref(q, k, v, causal):
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q32, k32) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        mask = jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + (lk - lq)
        s = jnp.where(mask, s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v32)

key = jax.random.key(0)
for (b, l, h, d) in ((2, 1024, 8, 128), (2, 1024, 8, 64), (1, 777, 4, 128)):
    ks = jax.random.split(key, 4)
    q, k, v, g = (jax.random.normal(kk, (b, l, h, d), jnp.float32).astype(jnp.bfloat16) for kk in ks)
    for causal in (False, True):
        f = lambda q, k, v: fa3.flash_mha(q, k, v, is_causal=causal)
        r = lambda q, k, v: ref(q, k, v, causal)
        out = f(q, k, v)
        gr = jax.vjp(r, q, k, v)[1](g.astype(jnp.float32))
        _, bwd = jax.vjp(f, q, k, v)
        gj = jax.jit(lambda fn, x: fn(x))(bwd, g)          # the bench's pattern
        gp = jax.grad(lambda q, k, v: (f(q, k, v).astype(jnp.float32) * g.astype(jnp.float32)).sum(), argnums=(0, 1, 2))(q, k, v)
        rel = lambda a, b_: float(jnp.linalg.norm(a.astype(jnp.float32) - b_) / jnp.linalg.norm(b_))
        print(f"FA3 {b,l,h,d} causal={causal}: out rel {rel(out, r(q,k,v)):.2e}; "
              f"grads (vjp-in-jit) dq/dk/dv rel {[f'{rel(a, c):.2e}' for a, c in zip(gj, gr)]}; "
              f"(jax.grad) {[f'{rel(a, c):.2e}' for a, c in zip(gp, gr)]}", flush=True)
