"""Benchmark cells and the presets that expand into them.

A cell is one attention call shape: batch, sequence length (seqlen_q == seqlen_k), heads,
kv heads (GQA/MQA when fewer than heads), head dim, dtype and causal flag, and the pass timed
(forward, backward, forward + backward). Serving cells (layout kvcache, paged or varlen) have a
few queries per sequence (`seqlen_q`) against a KV cache of `seqlen` keys. Presets give the
default axes; every command-line axis (--seqlens, --batch, ...) replaces the preset's.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

DTYPES = ("float16", "bfloat16", "float32", "float64")
PASSES = ("fwd", "bwd", "fwdbwd")
# FLOPs of a pass in units of the forward's: the backward's five matmuls against the forward's two,
# the count FlashAttention's papers use (2.5x), and the sum for forward + backward.
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
LAYOUTS = ("dense", "kvcache", "paged", "varlen")  # dense: the self-attention grid; the rest: serving
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


@dataclass(frozen=True)
class Case:
    """One benchmark cell. `label` names model-shaped rows; empty for plain grid rows.

    pass_name: "fwd", "bwd" (the backward alone, given the forward's saved outputs) or "fwdbwd".
    layout: "dense" (q, k, v of `seqlen` tokens each) or a serving layout: "kvcache" (a contiguous
    cache), "paged" (pages of `page_size` keys, shuffled) or "varlen" (sequences packed along one
    axis, their KV lengths spread evenly over 0.5x..1.5x `seqlen`); there `seqlen` is the KV
    length and `seqlen_q` the queries per sequence (causal: aligned bottom-right)."""

    batch: int
    seqlen: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    causal: bool
    label: str = ""
    pass_name: str = "fwd"
    layout: str = "dense"
    seqlen_q: int = 0  # 0: seqlen (the dense grid)
    page_size: int = 0  # paged layout only

    def __post_init__(self):
        for name in ("batch", "seqlen", "heads", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.pass_name not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {self.pass_name!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.serving and self.pass_name != "fwd":
            raise ValueError(f"the serving layouts ({self.layout}) are forward-only; got pass {self.pass_name!r}")
        if self.seqlen_q < 0:
            raise ValueError(f"seqlen_q must be >= 0, got {self.seqlen_q}")
        if (self.layout == "paged") != (self.page_size > 0):
            raise ValueError(f"page_size must be > 0 exactly for the paged layout; got {self.page_size} with "
                             f"layout {self.layout!r}")
        if self.layout == "paged" and self.seqlen % self.page_size:
            raise ValueError(f"seqlen ({self.seqlen}) must be a multiple of page_size ({self.page_size})")

    @property
    def serving(self) -> bool:
        """A memory-bound serving cell: reported in GB/s beside TFLOP/s."""
        return self.layout != "dense"

    @property
    def lq(self) -> int:
        return self.seqlen_q or self.seqlen

    @property
    def kv_lengths(self) -> tuple:
        """KV length of each sequence: `seqlen`, or for varlen spread evenly over 0.5x..1.5x it."""
        if self.layout != "varlen" or self.batch == 1:
            return (self.seqlen,) * self.batch
        return tuple(max(self.lq, round(self.seqlen * (0.5 + i / (self.batch - 1)))) for i in range(self.batch))

    @property
    def max_seqlen_k(self) -> int:
        return max(self.kv_lengths)

    @property
    def forward_flops(self) -> float:
        """4*H*D*(score pairs): 4*B*H*Lq*Lk*D without a mask; causal halves it on the square grid,
        and counts the pairs a bottom-right mask keeps when Lq != Lk."""
        pairs = 0.0
        for lk in self.kv_lengths:
            lq = self.lq
            if not self.causal:
                pairs += lq * lk
            elif lq == lk:
                pairs += lq * lk / 2
            else:  # query i sees keys j <= i + lk - lq
                pairs += sum(max(0, min(lk, i + lk - lq + 1)) for i in range(lq))
        return 4.0 * self.heads * self.head_dim * pairs

    @property
    def flops(self) -> float:
        """The forward's FLOPs times 1 (fwd), 2.5 (bwd) or 3.5 (fwdbwd)."""
        return self.forward_flops * PASS_FLOP_FACTOR[self.pass_name]

    @property
    def bytes_moved(self) -> float:
        """HBM bytes one call must move at least: the K/V cache read plus q read and out written."""
        size = ITEMSIZE[self.dtype]
        kv = 2 * sum(self.kv_lengths) * self.kv_heads * self.head_dim * size
        return kv + 2 * self.batch * self.lq * self.heads * self.head_dim * size

    @property
    def tokens(self) -> int:
        return self.batch * self.lq

    @property
    def score_elements(self) -> int:
        """Size of the B*H*Lq*Lk score matrix that a materializing implementation allocates."""
        return self.batch * self.heads * self.lq * self.max_seqlen_k

    def title(self) -> str:
        kv = f" KV={self.kv_heads}" if self.kv_heads != self.heads else ""
        head = f"{self.label}: " if self.label else ""
        seq = f"L={self.seqlen}" if not self.serving else f"Lq={self.lq} Lk={self.seqlen}"
        layout = "" if not self.serving else f" {self.layout}" + (str(self.page_size) if self.page_size else "")
        return (f"{head}B={self.batch} {seq} H={self.heads}{kv} D={self.head_dim} "
                f"{self.dtype}{' causal' if self.causal else ''}{layout}"
                f"{'' if self.pass_name == 'fwd' else ' ' + self.pass_name}")

    def fields(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """Default axes. `rows` (model shapes) replaces the seqlens x batch x heads product, with
    `cpu_rows` in its place on the CPU when given (small shapes that CI can run); `tokens`/`hidden`
    derive batch = tokens // L and heads = hidden // D (the FA2-paper grid). `passes`: the passes
    timed unless --pass says otherwise."""

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
    passes: tuple = ("fwd",)
    cpu_rows: tuple = ()


def _model(label, batch, seqlen, heads, kv_heads, head_dim, **serving):
    """A row; `serving` may add layout, seqlen_q, page_size and causal (which the row then fixes
    unless --causal is given)."""
    return {"label": label, "batch": batch, "seqlen": seqlen, "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim, **serving}


def _serving_rows(layout: str, shapes, page_sizes=(0,)) -> tuple:
    """Rows of one serving layout from (label, batch, seqlen_k, heads, kv_heads, head_dim, seqlen_q) shapes;
    a seqlen_q above 1 is a causal (speculative verify) row."""
    rows = []
    for label, b, lk, h, kv, d, lq in shapes:
        for ps in page_sizes:
            rows.append(_model(label, b, lk, h, kv, d, layout=layout, seqlen_q=lq, page_size=ps, causal=lq > 1))
    return tuple(rows)


# Decode shapes (label, batch, KV length, heads, kv heads, head dim, queries per sequence): GQA 4 and 8
# with the LLaMA-3 head dim, MQA, head dim 64, one long sequence, the weak short-cache cell, and
# speculative verify (4 causal queries).
_DECODE_SHAPES = (
    ("b16-8k", 16, 8192, 32, 8, 128, 1),
    ("b64-4k", 64, 4096, 64, 8, 128, 1),
    ("b128-2k", 128, 2048, 32, 8, 128, 1),
    ("b32-8k-mqa", 32, 8192, 32, 1, 128, 1),
    ("b32-8k-d64", 32, 8192, 32, 8, 64, 1),
    ("b1-32k", 1, 32768, 32, 8, 128, 1),
    ("b1-2k", 1, 2048, 32, 8, 128, 1),
    ("verify4", 16, 8192, 32, 8, 128, 4),
)
# The CPU's: the same kinds of cell at sizes a 2-core CI machine runs in seconds.
_DECODE_SHAPES_CPU = (
    ("b4-512", 4, 512, 8, 2, 64, 1),
    ("b1-1k-mqa", 1, 1024, 8, 1, 64, 1),
    ("verify4", 2, 512, 8, 2, 64, 4),
)


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
    "train": Preset(
        doc="training steps at model shapes: forward + backward by default (--pass), causal; fp16 and bf16 on "
            "CUDA, fp32 on the CPU (small rows there): LLaMA-3-8B (GQA 32/8), LLaMA-3-70B's heads of one of 8 "
            "tensor-parallel GPUs (8/1), a GPT-style MHA row at head dim 64",
        dtypes={"cpu": ("float32",), "cuda": ("bfloat16", "float16")}, causal=(True,), passes=("fwdbwd",),
        rows=(
            _model("llama3-8b", 2, 8192, 32, 8, 128),
            _model("llama3-70b-tp8", 4, 4096, 8, 1, 128),
            _model("gpt-mha-d64", 16, 1024, 16, 16, 64),
        ),
        cpu_rows=(
            _model("gqa", 1, 256, 8, 2, 64),
            _model("mha-d64", 2, 128, 4, 4, 64),
        )),
    "decode": Preset(
        doc="one query per sequence (4 for speculative verify) against a contiguous KV cache: memory-bound, "
            "GB/s and percent of peak HBM bandwidth; bf16 on CUDA, fp32 on the CPU (small rows there)",
        dtypes={"cpu": ("float32",), "cuda": ("bfloat16",)},
        rows=_serving_rows("kvcache", _DECODE_SHAPES), cpu_rows=_serving_rows("kvcache", _DECODE_SHAPES_CPU)),
    "paged": Preset(
        doc="the decode shapes on a paged KV cache (pages of 16 and 256, shuffled) beside the contiguous cache",
        dtypes={"cpu": ("float32",), "cuda": ("bfloat16",)},
        rows=_serving_rows("kvcache", _DECODE_SHAPES[:3] + _DECODE_SHAPES[5:7])
        + _serving_rows("paged", _DECODE_SHAPES[:3] + _DECODE_SHAPES[5:7], (16, 256)),
        cpu_rows=_serving_rows("kvcache", _DECODE_SHAPES_CPU[:1])
        + _serving_rows("paged", _DECODE_SHAPES_CPU[:1], (16, 256))),
    "varlen": Preset(
        doc="decode over sequences of different KV lengths (0.5x..1.5x the given length) packed along one axis "
            "(waveboost.attention_varlen); peers take a padded cache with each sequence's length",
        dtypes={"cpu": ("float32",), "cuda": ("bfloat16",)},
        rows=_serving_rows("varlen", (("b16-8k", 16, 8192, 32, 8, 128, 1), ("b64-4k", 64, 4096, 64, 8, 128, 1),
                                      ("b128-2k", 128, 2048, 32, 8, 128, 1), ("verify4", 16, 8192, 32, 8, 128, 4))),
        cpu_rows=_serving_rows("varlen", (("b4-512", 4, 512, 8, 2, 64, 1), ("verify4", 3, 256, 8, 2, 64, 4)))),
}
SERVING_PRESETS = ("decode", "paged", "varlen")


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


def parse_passes(text: str | None) -> tuple | None:
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    for name in names:
        if name not in PASSES:
            raise ValueError(f"--pass: expected names from {PASSES}, got {name!r}")
    return names


def expand(preset: str, device: str, *, seqlens=None, batch=None, heads=None, kv_heads=None,
           head_dims=None, dtypes=None, causal=None, passes=None) -> list[Case]:
    """Cells of `preset` on `device`, each given axis (a tuple) replacing the preset's."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    dtypes = dtypes or p.dtypes[device]
    passes = passes or p.passes
    rows = p.cpu_rows if device == "cpu" and p.cpu_rows else p.rows
    if rows:
        cases = []
        for row in rows:
            serving = {k: row[k] for k in ("layout", "seqlen_q", "page_size") if k in row}
            row_causal = causal or ((row["causal"],) if "causal" in row else p.causal)
            for dt, c, pn, b, seqlen, h, kv, d in itertools.product(
                    dtypes, row_causal, passes, batch or (row["batch"],), seqlens or (row["seqlen"],),
                    heads or (row["heads"],), kv_heads or (row["kv_heads"],), head_dims or (row["head_dim"],)):
                cases.append(Case(b, seqlen, h, kv, d, dt, c, row["label"], pn, **serving))
        return cases
    causal = causal or p.causal
    shapes = []
    for d, seqlen in itertools.product(head_dims or p.head_dims, seqlens or p.seqlens):
        for b, h in itertools.product(batch or ((max(1, p.tokens // seqlen),) if p.tokens else p.batch),
                                      heads or ((p.hidden // d,) if p.hidden else p.heads)):
            for kv in kv_heads or (h,):
                shapes.append({"batch": b, "seqlen": seqlen, "heads": h, "kv_heads": kv, "head_dim": d,
                               "label": ""})
    return [Case(dtype=dt, causal=c, pass_name=pn, **s)
            for pn, dt, c, s in itertools.product(passes, dtypes, causal, shapes)]
