"""waveboost: exact attention (FlashAttention-style forward and backward) for NumPy, PyTorch, CuPy and JAX.

>>> import numpy as np, waveboost
>>> q = np.random.randn(1, 128, 4, 64).astype(np.float32)   # (batch, seqlen, heads, head_dim)
>>> out = waveboost.attention(q, q, q, causal=True)
"""

from ._api import BACKENDS, attention, attention_backward, backward_backends, flash_attn_func, info, resolve_backend
from ._api import attention_varlen, attention_with_kvcache, capabilities, kernels, merge_attention_states, plan

__version__ = info()["version"]

__all__ = ["BACKENDS", "attention", "attention_backward", "backward_backends", "flash_attn_func", "info",
           "resolve_backend", "__version__", "attention_varlen", "attention_with_kvcache", "capabilities",
           "kernels", "merge_attention_states", "plan"]
