"""waveboost: exact attention (FlashAttention-style forward) for NumPy, PyTorch, CuPy and JAX.

>>> import numpy as np, waveboost
>>> q = np.random.randn(1, 128, 4, 64).astype(np.float32)   # (batch, seqlen, heads, head_dim)
>>> out = waveboost.attention(q, q, q, causal=True)
"""

from ._api import BACKENDS, attention, flash_attn_func, info, resolve_backend

__version__ = info()["version"]

__all__ = ["BACKENDS", "attention", "flash_attn_func", "info", "resolve_backend", "__version__"]
