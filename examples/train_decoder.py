"""Train a small decoder-only transformer twice, once with waveboost's attention and once with the
framework's own, from the same initial weights on the same batches, and compare the loss curves.

PyTorch: ``waveboost.torch.attention`` against ``torch.nn.functional.scaled_dot_product_attention``.
JAX: ``waveboost.jax.attention`` against ``jax.nn.dot_product_attention``.

The model: token and position embeddings, pre-norm blocks (RMSNorm, causal grouped-query attention,
a GELU MLP), RMSNorm and a vocabulary projection; 4 layers, d_model 512, 8 heads, 2 KV heads by
default. The task, fixed by the seed: a token string, a separator, then the string reversed. Each
token of the string follows its predecessor by a fixed random successor rule 80% of the time (a
pattern learnt in a few steps), and the reversed half can only be predicted by attending back to
the string; the loss is the mean cross-entropy of every next token. Weights are drawn once in NumPy
and loaded into both runs (and both frameworks), so the runs differ only in the attention call.

    python examples/train_decoder.py                                  # GPU: bf16, 300 steps, both frameworks
    python examples/train_decoder.py --device cpu --steps 50 --small  # CPU, fp32, a small model
    python examples/train_decoder.py --framework torch --plot losses.png

Prints each run's losses every few steps, then the largest difference between the two curves of a
framework, and exits 1 when it is above the tolerance of the dtype (--tolerance to change it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

# Largest relative difference of two loss curves expected from exact attention in each dtype. fp32:
# the two attentions differ by rounding (~1e-7 relative) and training amplifies it slowly; measured
# below 1e-5 over 50 steps of the small model on a CPU. bf16: the noise of bf16 activations (8 bits
# of mantissa) over a few hundred steps.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}
SEPARATOR = 1  # token 0 unused; the string's tokens are 2..vocab-1


@dataclass(frozen=True)
class Config:
    layers: int = 4
    d_model: int = 512
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 64
    string: int = 64  # tokens to reverse; a sequence is string + separator + string, minus the last
    batch: int = 16
    steps: int = 300
    lr: float = 3e-4
    seed: int = 0

    @property
    def seqlen(self) -> int:
        return 2 * self.string

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


SMALL = Config(layers=2, d_model=64, heads=4, kv_heads=2, vocab=32, string=16, batch=8, lr=1e-3)


def init_params(cfg: Config) -> dict:
    """float32 NumPy weights: normal(0, 0.02), output projections scaled by 1/sqrt(2 * layers)."""
    rng = np.random.default_rng(cfg.seed)
    d, hd = cfg.d_model, cfg.head_dim

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out_scale = 0.02 / math.sqrt(2 * cfg.layers)
    params = {"embed": normal(cfg.vocab, d), "pos": normal(cfg.seqlen, d), "norm": np.ones(d, np.float32),
              "head": normal(d, cfg.vocab)}
    for i in range(cfg.layers):
        params.update({
            f"{i}.norm1": np.ones(d, np.float32), f"{i}.wq": normal(d, cfg.heads * hd),
            f"{i}.wk": normal(d, cfg.kv_heads * hd), f"{i}.wv": normal(d, cfg.kv_heads * hd),
            f"{i}.wo": normal(cfg.heads * hd, d, scale=out_scale), f"{i}.norm2": np.ones(d, np.float32),
            f"{i}.w1": normal(d, 4 * d), f"{i}.w2": normal(4 * d, d, scale=out_scale)})
    return params


def batches(cfg: Config):
    """(inputs, targets, loss mask) per step, int64/int64/float32 NumPy, the same for every run."""
    rng = np.random.default_rng(cfg.seed + 1)
    successor = rng.permutation(np.arange(2, cfg.vocab))  # token t is followed by successor[t - 2]
    n = cfg.string
    for _ in range(cfg.steps):
        strings = np.empty((cfg.batch, n), np.int64)
        strings[:, 0] = rng.integers(2, cfg.vocab, size=cfg.batch)
        for i in range(1, n):
            follow = rng.random(cfg.batch) < 0.8
            strings[:, i] = np.where(follow, successor[strings[:, i - 1] - 2], rng.integers(2, cfg.vocab, cfg.batch))
        seq = np.concatenate([strings, np.full((cfg.batch, 1), SEPARATOR), strings[:, ::-1]], axis=1)
        yield seq[:, :-1], seq[:, 1:], np.ones((cfg.batch, cfg.seqlen), np.float32)


def adam_update(p, g, m, v, step: int, lr: float, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step (bias-corrected), the same arithmetic in both frameworks; returns (p, m, v)."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** step)
    v_hat = v / (1 - b2 ** step)
    return p - lr * m_hat / (v_hat ** 0.5 + eps), m, v


# ---- PyTorch ----------------------------------------------------------------------------------

def torch_attention(name: str):
    """BSHD causal GQA attention: waveboost's or SDPA's."""
    import torch.nn.functional as F

    if name == "waveboost":
        import waveboost.torch

        return lambda q, k, v: waveboost.torch.attention(q, k, v, causal=True)

    def sdpa(q, k, v):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return sdpa


def torch_loss(params: dict, inputs, targets, mask, cfg: Config, attention):
    import torch
    import torch.nn.functional as F

    def rms(x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain

    b, length = inputs.shape
    x = params["embed"][inputs] + params["pos"][:length]
    for i in range(cfg.layers):
        h = rms(x, params[f"{i}.norm1"])
        q = (h @ params[f"{i}.wq"]).view(b, length, cfg.heads, cfg.head_dim)
        k = (h @ params[f"{i}.wk"]).view(b, length, cfg.kv_heads, cfg.head_dim)
        v = (h @ params[f"{i}.wv"]).view(b, length, cfg.kv_heads, cfg.head_dim)
        x = x + attention(q, k, v).reshape(b, length, -1) @ params[f"{i}.wo"]
        h = rms(x, params[f"{i}.norm2"])
        x = x + F.gelu(h @ params[f"{i}.w1"], approximate="tanh") @ params[f"{i}.w2"]
    logits = (rms(x, params["norm"]) @ params["head"]).float()
    nll = F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1), reduction="none")
    return (nll * mask.reshape(-1)).sum() / mask.sum()


def train_torch(cfg: Config, attention_name: str, device: str = "cpu", dtype: str = "fp32",
                log_every: int = 0) -> list[float]:
    """Loss per step of the PyTorch model with `attention_name` ("waveboost" or "sdpa")."""
    import torch

    params = {k: torch.tensor(v, device=device, requires_grad=True) for k, v in init_params(cfg).items()}
    moments = {k: (torch.zeros_like(p), torch.zeros_like(p)) for k, p in params.items()}
    attention = torch_attention(attention_name)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")
    losses = []
    for step, (inputs, targets, mask) in enumerate(batches(cfg), 1):
        inputs, targets = (torch.as_tensor(a, device=device) for a in (inputs, targets))
        with autocast:
            loss = torch_loss(params, inputs, targets, torch.as_tensor(mask, device=device), cfg, attention)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for (name, p), g in zip(params.items(), grads):
                new, m, v = adam_update(p, g, *moments[name], step, cfg.lr)
                p.copy_(new)
                moments[name] = (m, v)
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == 1):
            print(f"  torch {attention_name:9s} step {step:4d}  loss {losses[-1]:.5f}", flush=True)
    return losses


# ---- JAX --------------------------------------------------------------------------------------

def jax_attention(name: str):
    import jax

    if name == "waveboost":
        import waveboost.jax

        return lambda q, k, v: waveboost.jax.attention(q, k, v, causal=True)
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)


def jax_loss(params: dict, inputs, targets, mask, cfg: Config, attention, compute_dtype):
    import jax
    import jax.numpy as jnp

    def rms(x, gain):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * gain

    p = {k: v.astype(compute_dtype) for k, v in params.items()}
    b, length = inputs.shape
    x = p["embed"][inputs] + p["pos"][:length]
    for i in range(cfg.layers):
        h = rms(x, p[f"{i}.norm1"])
        q = (h @ p[f"{i}.wq"]).reshape(b, length, cfg.heads, cfg.head_dim)
        k = (h @ p[f"{i}.wk"]).reshape(b, length, cfg.kv_heads, cfg.head_dim)
        v = (h @ p[f"{i}.wv"]).reshape(b, length, cfg.kv_heads, cfg.head_dim)
        x = x + attention(q, k, v).reshape(b, length, -1) @ p[f"{i}.wo"]
        h = rms(x, p[f"{i}.norm2"])
        x = x + jax.nn.gelu(h @ p[f"{i}.w1"], approximate=True) @ p[f"{i}.w2"]
    logits = (rms(x, p["norm"]) @ p["head"]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return (nll * mask).sum() / mask.sum()


def train_jax(cfg: Config, attention_name: str, device: str = "cpu", dtype: str = "fp32",
              log_every: int = 0) -> list[float]:
    """Loss per step of the JAX model with `attention_name` ("waveboost" or "jax")."""
    import jax
    import jax.numpy as jnp

    backend = "gpu" if device == "cuda" else "cpu"
    target = jax.devices(backend)[0]
    compute = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    attention = jax_attention(attention_name)
    params = {k: jax.device_put(v, target) for k, v in init_params(cfg).items()}
    moments = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in params.items()}

    @jax.jit
    def step_fn(params, moments, step, inputs, targets, mask):
        loss, grads = jax.value_and_grad(jax_loss)(params, inputs, targets, mask, cfg, attention, compute)
        new_params, new_moments = {}, {}
        for name, p in params.items():
            new_params[name], m, v = adam_update(p, grads[name], *moments[name], step, cfg.lr)
            new_moments[name] = (m, v)
        return loss, new_params, new_moments

    losses = []
    # fp32 matmuls default to TF32 on NVIDIA GPUs in XLA: ask for full fp32 so both runs are fp32.
    with jax.default_matmul_precision("highest" if dtype == "fp32" else None):
        for step, (inputs, targets, mask) in enumerate(batches(cfg), 1):
            arrays = (jax.device_put(a, target) for a in (inputs.astype(np.int32), targets.astype(np.int32), mask))
            loss, params, moments = step_fn(params, moments, jnp.float32(step), *arrays)
            losses.append(float(loss))
            if log_every and (step % log_every == 0 or step == 1):
                print(f"  jax   {attention_name:9s} step {step:4d}  loss {losses[-1]:.5f}", flush=True)
    return losses


# ---- comparison -------------------------------------------------------------------------------

def compare(ours: list[float], theirs: list[float]) -> dict:
    """Largest absolute and relative difference between two loss curves, and where."""
    a, b = np.asarray(ours), np.asarray(theirs)
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), 1e-12)
    return {"max_abs": float(diff.max()), "max_rel": float(rel.max()), "at_step": int(rel.argmax()) + 1,
            "first": float(b[0]), "last": float(b[-1])}


def plot(curves: dict, title: str, path: str) -> bool:
    """Loss curves and their differences to a PNG; False (with a message) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("plot skipped: matplotlib not installed (pip install matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
    for name, losses in curves.items():
        top.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1.2,
                 linestyle="-" if "waveboost" in name else "--")
    top.set_ylabel("training loss")
    top.legend()
    top.grid(True, alpha=0.3)
    for framework in ("torch", "jax"):
        ours, theirs = curves.get(f"{framework} waveboost"), curves.get(
            f"{framework} {'sdpa' if framework == 'torch' else 'jax.nn'}")
        if ours and theirs:
            rel = np.abs(np.asarray(ours) - np.asarray(theirs)) / np.abs(np.asarray(theirs))
            steps = np.flatnonzero(rel) + 1  # equal losses have no place on a log axis
            bottom.plot(steps, rel[steps - 1], marker="o", markersize=3, linestyle="none",
                        label=f"{framework}: |waveboost - peer| / peer")
    bottom.set_yscale("log")
    bottom.set_xlabel("step (steps where the losses are equal are not drawn)")
    bottom.set_ylabel("relative difference")
    bottom.legend()
    bottom.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when torch sees a GPU, else cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), help="default: bf16 on cuda, fp32 on cpu")
    ap.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    ap.add_argument("--steps", type=int, help=f"default: {Config.steps}")
    ap.add_argument("--small", action="store_true",
                    help="a small model (2 layers, d_model 64, 4 heads, 2 KV heads) for a CPU")
    ap.add_argument("--tolerance", type=float, help="largest relative loss difference allowed (default: by dtype "
                                                    + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items()) + ")")
    ap.add_argument("--plot", default="train_decoder_losses.png", help="PNG of the curves ('' for none)")
    ap.add_argument("--json", help="write the curves and the comparison to this file")
    args = ap.parse_args(argv)

    device = args.device
    if device is None:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    cfg = SMALL if args.small else Config()
    if args.steps is not None:
        if args.steps < 2:
            ap.error(f"--steps must be at least 2; got {args.steps}")
        cfg = replace(cfg, steps=args.steps)
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCE[dtype]
    print(f"model: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, {cfg.kv_heads} KV heads, "
          f"sequence {cfg.seqlen}, batch {cfg.batch}; {cfg.steps} steps of Adam (lr {cfg.lr}); {device}, {dtype}")

    runs = []
    if args.framework in ("torch", "both"):
        runs += [("torch waveboost", train_torch, "waveboost"), ("torch sdpa", train_torch, "sdpa")]
    if args.framework in ("jax", "both"):
        runs += [("jax waveboost", train_jax, "waveboost"), ("jax jax.nn", train_jax, "jax")]
    curves = {}
    for label, train, name in runs:
        started = time.perf_counter()
        curves[label] = train(cfg, name, device, dtype, log_every=max(1, cfg.steps // 10))
        print(f"{label}: {cfg.steps} steps in {time.perf_counter() - started:.1f} s, loss {curves[label][0]:.4f} -> "
              f"{curves[label][-1]:.4f}", flush=True)

    results, failed = {}, False
    for framework, peer in (("torch", "torch sdpa"), ("jax", "jax jax.nn")):
        ours = curves.get(f"{framework} waveboost")
        if ours is None or peer not in curves:
            continue
        c = compare(ours, curves[peer])
        results[framework] = c
        ok = c["max_rel"] <= tolerance and c["last"] < c["first"]
        failed |= not ok
        print(f"{framework}: max |waveboost - {peer.split()[1]}| over {cfg.steps} steps = {c['max_abs']:.3g} "
              f"(relative {c['max_rel']:.3g} at step {c['at_step']}; tolerance {tolerance:g} for {dtype}); "
              f"loss {c['first']:.4f} -> {c['last']:.4f}: {'ok' if ok else 'FAILED'}")
    if args.plot:
        title = (f"{cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads}/{cfg.kv_heads} heads, {device} {dtype}; "
                 + "; ".join(f"{f} max rel diff {c['max_rel']:.2g}" for f, c in results.items()))
        if plot(curves, title, args.plot):
            print(f"wrote {os.path.abspath(args.plot)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": asdict(cfg), "device": device, "dtype": dtype, "tolerance": tolerance,
                       "curves": curves, "comparison": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
