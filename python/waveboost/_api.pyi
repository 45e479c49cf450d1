# Types of the public Python API (waveboost.attention, flash_attn_func, resolve_backend, info).
# Arrays come back in the framework of `q` (NumPy, PyTorch, CuPy, JAX): the result type is q's type.
# The one exception, a generic DLPack producer in host memory, gives NumPy arrays; type it as
# numpy.ndarray (np.from_dlpack) if a checker should know.

from typing import Any, Literal, Optional, TypedDict, TypeVar, Union, overload

_Array = TypeVar("_Array")

BackendName = Literal["auto", "cpu", "naive", "simt", "wmma", "mma", "wgmma", "decode"]
ResolvedBackend = Literal["cpu", "naive", "simt", "wmma", "mma", "wgmma", "decode"]

BACKENDS: tuple[BackendName, ...]

class Info(TypedDict):
    version: str
    cuda_compiled: bool
    cuda_architectures: str
    gpus: list[str]
    gpu: Optional[str]
    backends: list[ResolvedBackend]
    cpu_isa: Literal["avx512", "avx2", "baseline"]
    cpu_threads: int

class Capability(TypedDict):
    backend: ResolvedBackend
    device: Literal["cpu", "cuda"]
    requires: str
    available: bool
    reason: Optional[str]
    passes: list[Literal["forward", "backward"]]
    forward_dtypes: list[Literal["float16", "bfloat16", "float32", "float64"]]
    backward_dtypes: list[Literal["float16", "bfloat16", "float32", "float64"]]
    head_dims: list[int]
    backward_head_dims: list[int]
    any_head_dim: bool
    causal: bool
    gqa: bool
    varlen: bool
    seqused: bool
    paged: bool
    deterministic_backward: bool

def capabilities(device: int = ...) -> list[Capability]: ...

# "pass" is a keyword: the functional form.
KernelRecord = TypedDict("KernelRecord", {
    "name": str,
    "backend": ResolvedBackend,
    "pass": Literal["forward", "backward"],
    "variant": str,
    "dtype": Literal["float16", "bfloat16", "float32", "float8_e4m3fn"],
    "head_dim": int,
    "min_compute_capability": int,
    "max_compute_capability": Optional[int],
    "vector_elements": int,
    "smem_bytes": Optional[int],
})

def kernels() -> list[KernelRecord]: ...

class Plan(TypedDict):
    backend: ResolvedBackend
    kernel: str
    num_splits: int
    merge: Literal["", "in-kernel", "cluster", "combine-kernel"]

def plan(q: Any, k: Any, v: Any, *, causal: bool = ..., backend: BackendName = ...) -> Plan: ...
def check_flag(value: Any, arg: str) -> bool: ...
def check_backend(backend: Any) -> BackendName: ...
def check_softmax_scale(softmax_scale: Any) -> Optional[float]: ...
@overload
def attention(
    q: _Array,
    k: _Array,
    v: _Array,
    *,
    causal: bool = ...,
    softmax_scale: Optional[float] = ...,
    out: Optional[_Array] = ...,
    return_lse: Literal[False] = ...,
    backend: BackendName = ...,
    q_descale: Union[float, _Array, None] = ...,
    k_descale: Union[float, _Array, None] = ...,
    v_descale: Union[float, _Array, None] = ...,
) -> _Array: ...
@overload
def attention(
    q: _Array,
    k: _Array,
    v: _Array,
    *,
    causal: bool = ...,
    softmax_scale: Optional[float] = ...,
    out: Optional[_Array] = ...,
    return_lse: Literal[True],
    backend: BackendName = ...,
    q_descale: Union[float, _Array, None] = ...,
    k_descale: Union[float, _Array, None] = ...,
    v_descale: Union[float, _Array, None] = ...,
) -> tuple[_Array, _Array]: ...
@overload
def attention(
    q: _Array,
    k: _Array,
    v: _Array,
    *,
    causal: bool = ...,
    softmax_scale: Optional[float] = ...,
    out: Optional[_Array] = ...,
    return_lse: bool,
    backend: BackendName = ...,
    q_descale: Union[float, _Array, None] = ...,
    k_descale: Union[float, _Array, None] = ...,
    v_descale: Union[float, _Array, None] = ...,
) -> _Array | tuple[_Array, _Array]: ...
def resolve_backend(
    q: _Array,
    k: _Array,
    v: _Array,
    *,
    causal: bool = ...,
    backend: BackendName = ...,
    backward: bool = ...,
    deterministic: bool = ...,
) -> ResolvedBackend: ...
def info() -> Info: ...
@overload
def flash_attn_func(
    q: _Array,
    k: _Array,
    v: _Array,
    dropout_p: float = ...,
    softmax_scale: Optional[float] = ...,
    causal: bool = ...,
    window_size: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: None = ...,
    deterministic: bool = ...,
    return_attn_probs: Literal[False] = ...,
) -> _Array: ...
@overload
def flash_attn_func(
    q: _Array,
    k: _Array,
    v: _Array,
    dropout_p: float = ...,
    softmax_scale: Optional[float] = ...,
    causal: bool = ...,
    window_size: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: None = ...,
    deterministic: bool = ...,
    *,
    return_attn_probs: Literal[True],
) -> tuple[_Array, _Array, None]: ...
@overload
def flash_attn_func(
    q: _Array,
    k: _Array,
    v: _Array,
    dropout_p: float = ...,
    softmax_scale: Optional[float] = ...,
    causal: bool = ...,
    window_size: tuple[int, int] = ...,
    softcap: float = ...,
    alibi_slopes: None = ...,
    deterministic: bool = ...,
    return_attn_probs: bool = ...,
) -> _Array | tuple[_Array, _Array, None]: ...
