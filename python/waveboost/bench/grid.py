"""Benchmark cells and the presets that expand into them.

A cell is one attention call shape: batch, sequence length (seqlen_q == seqlen_k), heads,
kv heads (GQA/MQA when fewer than heads), head dim, dtype and causal flag. Presets give the
default axes; every command-line axis (--seqlens, --batch, ...) replaces the preset's.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

DTYPES = ("float16", "bfloat16", "float32", "float64")
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


@dataclass(frozen=True)
class Case:
    """One benchmark cell. `label` names model-shaped rows; empty for plain grid rows."""

    batch: int
    seqlen: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    causal: bool
    label: str = ""

    def __post_init__(self):
        for name in ("batch", "seqlen", "heads", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def flops(self) -> float:
        """4*B*H*Lq*Lk*D (two matmuls, 2 flops per multiply-add), halved for causal."""
        full = 4.0 * self.batch * self.heads * self.seqlen * self.seqlen * self.head_dim
        return full / 2 if self.causal else full

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    @property
    def score_elements(self) -> int:
        """Size of the B*H*L*L score matrix that a materializing implementation allocates."""
        return self.batch * self.heads * self.seqlen * self.seqlen

    def title(self) -> str:
        kv = f" KV={self.kv_heads}" if self.kv_heads != self.heads else ""
        head = f"{self.label}: " if self.label else ""
        return (f"{head}B={self.batch} L={self.seqlen} H={self.heads}{kv} D={self.head_dim} "
                f"{self.dtype}{' causal' if self.causal else ''}")

    def fields(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """Default axes. `rows` (model shapes) replaces the seqlens x batch x heads product;
    `tokens`/`hidden` derive batch = tokens // L and heads = hidden // D (the FA2-paper grid)."""

    doc: str
    seqlens: tuple = ()
    batch: tuple = (1,)
    heads: tuple = ()
    head_dims: tuple = (64,)
    dtypes: dict = None  # device -> default dtypes
    causal: tuple = (False,)
    rows: tuple = ()
    tokens: int = 0
    hidden: int = 0


def _model(label, batch, seqlen, heads, kv_heads, head_dim):
    return {"label": label, "batch": batch, "seqlen": seqlen, "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim}


PRESETS = {
    "quick": Preset(
        doc="small grid for a first look; under a minute on a 2-core CPU",
        seqlens=(128, 256, 512, 1024), heads=(8,), head_dims=(64,), causal=(False, True),
        dtypes={"cpu": ("float32",), "cuda": ("float16",)}),
    "seed": Preset(
        doc="the original study's launch-bound configuration: B=1, H=1, L=512, D=64",
        seqlens=(512,), heads=(1,), head_dims=(64,),
        dtypes={"cpu": ("float32",), "cuda": ("float16",)}),
    "fa2": Preset(
        doc="the FlashAttention-2 paper's grid: 16k tokens (B = 16384 / L), hidden 2048 (H = 2048 / D)",
        seqlens=(512, 1024, 2048, 4096, 8192, 16384), head_dims=(64, 128), causal=(False, True),
        dtypes={"cpu": ("float32",), "cuda": ("float16", "bfloat16")}, tokens=16384, hidden=2048),
    "models": Preset(
        doc="decoder prefill at model shapes (causal; bf16 on CUDA, fp32 on the CPU): LLaMA-3-70B/405B (GQA), "
            "an MHA and an MQA row (long on a CPU: minutes per cell)",
        dtypes={"cpu": ("float32",), "cuda": ("bfloat16",)}, causal=(True,),
        rows=(
            _model("llama3-70b", 1, 4096, 64, 8, 128),
            _model("llama3-405b", 1, 2048, 128, 8, 128),
            _model("mha", 2, 2048, 128, 128, 128),
            _model("mqa", 1, 4096, 64, 1, 128),
        )),
}


def parse_ints(text: str | None) -> tuple | None:
    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None


def parse_dtypes(text: str | None) -> tuple | None:
    if text is None:
        return None
    names = tuple(_DTYPE_ALIASES.get(t.strip(), t.strip()) for t in text.split(",") if t.strip())
    for name in names:
        if name not in DTYPES:
            raise ValueError(f"--dtypes: expected names from {DTYPES}, got {name!r}")
    return names


def parse_causal(text: str | None) -> tuple | None:
    choices = {None: None, "0": (False,), "1": (True,), "both": (False, True)}
    if text not in choices:
        raise ValueError(f"--causal: expected 0, 1 or both, got {text!r}")
    return choices[text]


def expand(preset: str, device: str, *, seqlens=None, batch=None, heads=None, kv_heads=None,
           head_dims=None, dtypes=None, causal=None) -> list[Case]:
    """Cells of `preset` on `device`, each given axis (a tuple) replacing the preset's."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    dtypes = dtypes or p.dtypes[device]
    causal = causal or p.causal
    if p.rows:
        shapes = []
        for row in p.rows:
            for b, seqlen, h, kv, d in itertools.product(batch or (row["batch"],), seqlens or (row["seqlen"],),
                                                         heads or (row["heads"],), kv_heads or (row["kv_heads"],),
                                                         head_dims or (row["head_dim"],)):
                shapes.append({"batch": b, "seqlen": seqlen, "heads": h, "kv_heads": kv, "head_dim": d,
                               "label": row["label"]})
    else:
        shapes = []
        for d, seqlen in itertools.product(head_dims or p.head_dims, seqlens or p.seqlens):
            for b, h in itertools.product(batch or ((max(1, p.tokens // seqlen),) if p.tokens else p.batch),
                                          heads or ((p.hidden // d,) if p.hidden else p.heads)):
                for kv in kv_heads or (h,):
                    shapes.append({"batch": b, "seqlen": seqlen, "heads": h, "kv_heads": kv, "head_dim": d,
                                   "label": ""})
    return [Case(dtype=dt, causal=c, **s) for dt, c, s in itertools.product(dtypes, causal, shapes)]
