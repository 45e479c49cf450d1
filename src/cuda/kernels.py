#!/usr/bin/env python3
"""The kernel table of the CUDA paths, and the generator of their instantiation files.

Every compiled (backend, pass, variant, dtype, head dim) kernel is one row below. From the table
this script writes

  src/cuda/generated/<unit>.cu        the translation units (below) of kernels that every architecture
                                      of the build runs, built for all of them
  src/cuda/sm80/generated/<unit>.cu   kernels that need compute capability 8.0 or more, built only for
                                      the architectures of the build from 80 up
  src/cuda/cc90/generated/<unit>.cu   the same for kernels that need 9.0 or more
  src/cuda/sm90/generated/<unit>.cu   the same for sm_90a-only kernels (wgmma)
  src/cuda/generated/kernel_table.inc the entry points' declarations and the registry's rows,
                                      read by src/cuda/kernel_registry.cu

A unit holds the kernels of one family in one of those folders, every dtype and head dim (e.g.
decode.cu: decode_hdim64_fp16 ... decode_hdim128_bf16), or those of one dtype for the families marked
unit_per_dtype (mma_bf16.cu: mma_hdim64_bf16 and mma_hdim128_bf16). Every translation unit pays a fixed
cost whatever it instantiates (the CUDA headers parsed once per architecture and once more for the
host, about 5 s of a 2-core build), so kernels share units; the heaviest family is cut by dtype so that
no unit holds up the end of a build (each of its dtypes is ~38 s of nvcc for sm_80 + sm_90).

The generated files are committed; after editing the table run

    python3 src/cuda/kernels.py            # rewrite the generated files
    python3 src/cuda/kernels.py --check    # exit 1 if they differ from the table (CI runs this)

A new head dim is one more value in a family's head_dims; a new kernel family is one entry in
FAMILIES (its header, how to call its launcher, its shared memory and its requirements).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent
GENERATED = ROOT / "generated"
SM80_GENERATED = ROOT / "sm80" / "generated"
CC90_GENERATED = ROOT / "cc90" / "generated"
SM90_GENERATED = ROOT / "sm90" / "generated"


def generated_dirs() -> tuple:
    """The folders the generator writes (read when called, so that a test may point them elsewhere)."""
    return GENERATED, SM80_GENERATED, CC90_GENERATED, SM90_GENERATED


REPO = ROOT.parent.parent


def _shown(path: pathlib.Path) -> str:
    return os.path.relpath(path, REPO)

# dtype key (as in kernel names) -> (C++ element type, DType enumerator, dtype name)
DTYPES = {
    "fp16": ("__half", "DType::kFloat16", "float16"),
    "bf16": ("__nv_bfloat16", "DType::kBFloat16", "bfloat16"),
    "fp32": ("float", "DType::kFloat32", "float32"),
    "e4m3": ("__nv_fp8_e4m3", "DType::kFloat8E4M3", "float8_e4m3fn"),
}


@dataclass(frozen=True)
class Family:
    """One kernel template and what every instantiation of it needs.

    launch: the call of the launcher, with {T} (element type) and {D} (head dim); forward
      launchers see `p` (AttentionParams) and `l` (ForwardLaunch: stream, split pieces);
      backward launchers see `p` (AttentionBackwardParams), `workspace` and `stream`.
    smem: the dynamic shared memory of one block, a constant expression; None where it
      depends on the call (the backend's can_implement checks it).
    min_cc / max_cc: compute capability range (max 0: no upper bound); per-dtype and per-head-dim
      overrides in min_cc_by_dtype and min_cc_by_head_dim (the larger applies).
    vector_elements: q/k/v/out (and the gradients) move in 16 B pieces of this many elements
      (per dtype); 0: no alignment needed.
    unit_per_dtype: a generated translation unit per dtype rather than one for the family.
    """

    backend: str
    passes: str  # "forward" or "backward"
    header: str
    launch: str
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    smem: str | None
    min_cc: int
    max_cc: int = 0
    min_cc_by_dtype: dict = field(default_factory=dict)
    min_cc_by_head_dim: dict = field(default_factory=dict)
    vector_elements: dict = field(default_factory=dict)
    variant: str = ""
    sm90a: bool = False
    note: str = ""
    unit_per_dtype: bool = False


FAMILIES = {
    "simt": Family(
        backend="simt", passes="forward", header="waveboost/cuda/flash_simt.cuh",
        launch="launch_flash_simt<{T}, {D}>(p, l.stream)", dtypes=("fp16", "bf16", "fp32"), head_dims=(64, 128),
        smem="FlashSimtTraits<{T}, {D}>::kSmemBytes", min_cc=0, min_cc_by_dtype={"bf16": 80},
        note="CUDA cores only: the readable reference of the tiled algorithm"),
    "wmma": Family(
        backend="wmma", passes="forward", header="waveboost/cuda/flash_wmma.cuh",
        launch="launch_flash_wmma<{T}, {D}>(p, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="flash_wmma_min_smem_bytes({D})", min_cc=70, min_cc_by_dtype={"bf16": 80},
        note="tensor cores through the wmma API; key tile chosen by the device's shared memory"),
    "mma": Family(
        backend="mma", passes="forward", header="waveboost/cuda/flash_mma.cuh",
        launch="launch_flash_mma<{T}, {D}>(p, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="FlashMmaTraits<{T}, {D}>::kSmemBytes", min_cc=80, vector_elements={"fp16": 8, "bf16": 8},
        unit_per_dtype=True, note="mma.sync and cp.async; dense, varlen, seqused and paged"),
    "mma_tf32": Family(
        backend="mma", passes="forward", header="waveboost/cuda/flash_mma_tf32.cuh",
        launch="launch_flash_mma_tf32<{D}>(p, l.stream)", dtypes=("fp32",), head_dims=(64, 128),
        smem="FlashMmaTf32Traits<{D}>::kSmemBytes", min_cc=80, vector_elements={"fp32": 4},
        note="float32 on tf32 tensor cores, three products per product (3xTF32)"),
    "wgmma": Family(
        backend="wgmma", passes="forward", header="waveboost/cuda/flash_wgmma.cuh",
        launch="launch_flash_wgmma<{T}, {D}>(p, *l.split, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="FlashWgmmaTraits<{T}, {D}>::kSmemBytes", min_cc=90, max_cc=90,
        vector_elements={"fp16": 8, "bf16": 8}, sm90a=True,
        note="wgmma, every thread copying K/V by cp.async; split-KV and sequence layouts"),
    "wgmma_tma": Family(
        backend="wgmma", passes="forward", header="waveboost/cuda/flash_wgmma_ws.cuh",
        launch="launch_flash_wgmma_ws<{T}, {D}>(p, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="FlashWgmmaWsDefaultTraits<{T}, {D}>::kSmemBytes", min_cc=90, max_cc=90,
        vector_elements={"fp16": 8, "bf16": 8}, variant="tma", sm90a=True,
        note="wgmma with a TMA producer warpgroup and an mbarrier ring; dense unsplit calls"),
    "wgmma_fp8": Family(
        backend="wgmma", passes="forward", header="waveboost/cuda/flash_wgmma_ws.cuh",
        launch="launch_flash_wgmma_ws<{T}, {D}>(p, l.stream)", dtypes=("e4m3",), head_dims=(128,),
        smem="FlashWgmmaWsDefaultTraits<{T}, {D}>::kSmemBytes", min_cc=90, max_cc=90,
        vector_elements={"e4m3": 16}, sm90a=True,
        note="e4m3 inputs on the TMA kernel, V transposed in shared memory by the producer warpgroup; "
             "dense unsplit calls"),
    "decode": Family(
        backend="decode", passes="forward", header="waveboost/cuda/decode.cuh",
        launch="launch_decode<{T}, {D}>(p, *l.decode, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem=None, min_cc=80, vector_elements={"fp16": 8, "bf16": 8},
        note="split-KV over a kv head's packed query rows; its tile height depends on the call"),
    "decode_tma": Family(
        backend="decode", passes="forward", header="waveboost/cuda/decode.cuh",
        launch="launch_decode_tma<{T}, {D}>(p, *l.decode, l.stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem=None, min_cc=90, max_cc=90, vector_elements={"fp16": 8, "bf16": 8}, variant="tma", sm90a=True,
        note="the decode kernel with K/V tiles by TMA; dense and paged caches, tiles of 16, 32, 64 or 128 rows"),
    "bwd_mma": Family(
        backend="mma", passes="backward", header="waveboost/cuda/flash_bwd_mma.cuh",
        launch="launch_flash_bwd_mma<{T}, {D}>(p, workspace, stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="flash_bwd_mma_smem_bytes({D})", min_cc=80, vector_elements={"fp16": 8, "bf16": 8},
        note="FlashAttention-2's backward on mma.sync; deterministic dQ order on request"),
    "bwd_mma_tf32": Family(
        backend="mma", passes="backward", header="waveboost/cuda/flash_bwd_mma_tf32.cuh",
        launch="launch_flash_bwd_mma_tf32<{D}>(p, workspace, stream)", dtypes=("fp32",), head_dims=(64, 128),
        smem="FlashBwdMmaTf32Traits<{D}>::kSmemBytes", min_cc=80, vector_elements={"fp32": 4},
        min_cc_by_head_dim={128: 90},  # 208 KB of shared memory per block: more than 8.x devices have
        note="float32 backward on tf32 tensor cores, three products per product (3xTF32)"),
    "bwd_wgmma": Family(
        backend="wgmma", passes="backward", header="waveboost/cuda/flash_bwd_wgmma.cuh",
        launch="launch_flash_bwd_wgmma<{T}, {D}>(p, workspace, stream)", dtypes=("fp16", "bf16"), head_dims=(64, 128),
        smem="flash_bwd_wgmma_smem_bytes<{T}, {D}>()", min_cc=90, max_cc=90, vector_elements={"fp16": 8, "bf16": 8},
        sm90a=True,
        note="a TMA producer warp, dQ once per block added by a writer warp; cp.async fallback"),
}


@dataclass(frozen=True)
class Kernel:
    family: str
    dtype: str
    head_dim: int

    @property
    def f(self) -> Family:
        return FAMILIES[self.family]

    @property
    def name(self) -> str:
        return f"{self.family}_hdim{self.head_dim}_{self.dtype}"

    def fmt(self, text: str) -> str:
        return text.format(T=DTYPES[self.dtype][0], D=self.head_dim)

    @property
    def min_cc(self) -> int:
        by_dtype = self.f.min_cc_by_dtype.get(self.dtype, self.f.min_cc)
        return max(by_dtype, self.f.min_cc_by_head_dim.get(self.head_dim, 0))

    @property
    def group(self) -> str:
        """Which objects it belongs to: "sm90a" (sm_90a only), "cc90" (needs 9.0+), "sm80" (needs 8.0+) or ""
        (every architecture). Each is built only for the architectures of the build that can run it."""
        if self.f.sm90a:
            return "sm90a"
        return "cc90" if self.min_cc >= 90 else ("sm80" if self.min_cc >= 80 else "")

    @property
    def directory(self) -> pathlib.Path:
        return {"sm90a": SM90_GENERATED, "cc90": CC90_GENERATED, "sm80": SM80_GENERATED, "": GENERATED}[self.group]


def kernels() -> list[Kernel]:
    return [Kernel(name, dtype, d) for name, fam in FAMILIES.items() for dtype in fam.dtypes for d in fam.head_dims]


HEADER = "// Generated by src/cuda/kernels.py from its kernel table; edit the table, not this file.\n"


def units() -> dict[tuple, list[Kernel]]:
    """The translation units: (directory, file name) -> its kernels, in the table's order."""
    out: dict[tuple, list[Kernel]] = {}
    for k in kernels():
        name = f"{k.family}_{k.dtype}" if k.f.unit_per_dtype else k.family
        out.setdefault((k.directory, f"{name}.cu"), []).append(k)
    return out


def entry_points(k: Kernel) -> str:
    f = k.f
    if f.passes == "forward":
        entry = f"Status {k.name}(const AttentionParams& p, const ForwardLaunch& l) {{ return {k.fmt(f.launch)}; }}"
    else:
        entry = (f"Status {k.name}(const AttentionBackwardParams& p, void* workspace, cudaStream_t stream) {{\n"
                 f"  return {k.fmt(f.launch)};\n}}")
    smem = f"\nint {k.name}_smem_bytes() {{ return {k.fmt(f.smem)}; }}\n" if f.smem else ""
    return f"{entry}\n{smem}"


def translation_unit(unit: list[Kernel]) -> str:
    k = unit[0]
    f = k.f
    dtypes = ", ".join(dict.fromkeys(DTYPES[u.dtype][2] for u in unit))
    head_dims = ", ".join(str(d) for d in dict.fromkeys(u.head_dim for u in unit))
    return (f"{HEADER}// {f.backend} {f.passes}{' (' + f.variant + ')' if f.variant else ''}, "
            f"{dtypes}, head_dim {head_dims}: {f.note}.\n"
            f"#include \"{f.header}\"\n#include \"cuda/kernel_registry.h\"\n\n"
            f"namespace waveboost::cuda::kernels {{\n\n" + "\n".join(entry_points(u) for u in unit) +
            f"\n}}  // namespace waveboost::cuda::kernels\n")


GUARDS = {"": None, "sm80": "WAVEBOOST_WITH_SM80", "cc90": "WAVEBOOST_WITH_CC90", "sm90a": "WAVEBOOST_WITH_SM90A"}


def table_inc() -> str:
    decls = {g: [] for g in GUARDS}
    rows = {g: [] for g in GUARDS}
    for k in kernels():
        f = k.f
        if f.passes == "forward":
            decls[k.group].append(f"Status {k.name}(const AttentionParams&, const ForwardLaunch&);")
        else:
            decls[k.group].append(f"Status {k.name}(const AttentionBackwardParams&, void*, cudaStream_t);")
        if f.smem:
            decls[k.group].append(f"int {k.name}_smem_bytes();")
        fwd = f"&kernels::{k.name}" if f.passes == "forward" else "nullptr"
        bwd = f"&kernels::{k.name}" if f.passes == "backward" else "nullptr"
        smem = f"&kernels::{k.name}_smem_bytes" if f.smem else "nullptr"
        rows[k.group].append(
            f"    {{\"{k.name}\", Backend::k{f.backend.capitalize()}, "
            f"{'true' if f.passes == 'backward' else 'false'}, \"{f.variant}\", {DTYPES[k.dtype][1]}, "
            f"{k.head_dim}, {k.min_cc}, {f.max_cc}, {f.vector_elements.get(k.dtype, 0)}, {fwd}, {bwd}, {smem}}},")

    def guarded(parts: dict) -> list:
        out = []
        for group, guard in GUARDS.items():
            if not parts[group]:
                continue
            out += ([f"#ifdef {guard}"] if guard else []) + parts[group] + (["#endif"] if guard else [])
        return out

    out = [HEADER, "// Included once, by src/cuda/kernel_registry.cu, inside namespace waveboost::cuda.\n",
           "namespace kernels {\n"]
    out += guarded(decls) + ["}  // namespace kernels\n"]
    out += ["// name, backend, backward, variant, dtype, head_dim, min_cc, max_cc, vector_elements,",
            "// forward entry, backward entry, shared memory per block",
            "const KernelRecord kKernelTable[] = {"]
    out += guarded(rows) + ["};\n"]
    return "\n".join(out)


def expected_files() -> dict[pathlib.Path, str]:
    files = {GENERATED / "kernel_table.inc": table_inc()}
    for (directory, name), unit in units().items():
        files[directory / name] = translation_unit(unit)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the generated files with the table; write nothing")
    args = ap.parse_args(argv)
    files = expected_files()
    present = {p for d in generated_dirs() if d.is_dir() for p in d.iterdir()}
    stale = sorted(present - set(files))
    if args.check:
        bad = [p for p, text in files.items() if not p.is_file() or p.read_text() != text] + stale
        for p in bad:
            print(f"out of date: {_shown(p)}", file=sys.stderr)
        if bad:
            print("run: python3 src/cuda/kernels.py", file=sys.stderr)
        return 1 if bad else 0
    for p in stale:
        p.unlink()
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
    print(f"{len(files)} files in " + ", ".join(_shown(d) for d in generated_dirs()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
