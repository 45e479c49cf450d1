"""The command line of the benchmark suite: `python -m waveboost.bench`, `waveboost-bench`."""

from __future__ import annotations

import argparse
import fnmatch
import os
import shlex
import sys
import time
from contextlib import contextmanager
from datetime import datetime

from . import grid, hardware, impls, measure, report

DEFAULTS = {  # per device: max timed calls, time budget per cell and implementation, memory limit
    "cpu": {"repeats": 20, "budget_ms": 200.0, "mem_limit_gb": 20.0},
    "cuda": {"repeats": 50, "budget_ms": 200.0, "mem_limit_gb": 20.0},
}
# Fixed per device, never picked by what happens to be installed: a speedup always says against what.
DEFAULT_BASELINE = {"cpu": "numpy", "cuda": "sdpa_flash"}
DEFAULT_SPREAD = 0.10
DEFAULT_MAX_MINUTES = 15.0


def build_parser() -> argparse.ArgumentParser:
    presets = "; ".join(f"{name}: {p.doc}" for name, p in grid.PRESETS.items())
    p = argparse.ArgumentParser(
        prog="python -m waveboost.bench",
        description="Latency, throughput and peak memory of waveboost's attention against its peers, each "
                    "output checked against a float64 reference before it is timed.",
        epilog=f"Presets -- {presets}. Axis flags take comma-separated lists and replace the preset's axis.")
    p.add_argument("--preset", choices=sorted(grid.PRESETS), help="grid to run (default: quick)")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch sees a GPU, else cpu")
    p.add_argument("--impls", help="comma-separated names or globs (e.g. 'waveboost_*,sdpa_flash'); default: all")
    p.add_argument("--baseline", help="implementation the speedups divide by (default: sdpa_flash on cuda, numpy on "
                                      "cpu; without it in the run, no speedups are computed)")
    p.add_argument("--dtypes", help="e.g. float16,bfloat16 (fp16, bf16, fp32 accepted)")
    p.add_argument("--seqlens", help="e.g. 512,1024,2048")
    p.add_argument("--batch", help="e.g. 1,8,32 (fa2 default: 16384 / L)")
    p.add_argument("--heads", help="query heads (fa2 default: 2048 / D)")
    p.add_argument("--kv-heads", help="kv heads for GQA/MQA (default: = heads)")
    p.add_argument("--head-dims", help="e.g. 64,128")
    p.add_argument("--causal", choices=("0", "1", "both"), help="causal mask (default: the preset's)")
    p.add_argument("--repeats", type=int, help="most timed calls per cell (default: 20 cpu, 50 cuda)")
    p.add_argument("--budget-ms", type=float, help="time budget of the timed calls per cell (default: 200)")
    p.add_argument("--mem-limit-gb", type=float,
                   help="skip implementations whose score matrix would need more (default: 20)")
    p.add_argument("--spread-threshold", type=float, default=DEFAULT_SPREAD,
                   help="IQR / median of a cell's timed calls above which it is re-timed once and, still above, "
                        "marked ~ unstable (default: 0.10)")
    p.add_argument("--max-minutes", type=float, default=DEFAULT_MAX_MINUTES,
                   help="CPU runs: refuse a grid estimated to take longer, saying how long (default: 15; 0: no limit)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    p.add_argument("--out", help="output folder (default: bench-results/<device>-<YYYYMMDD-HHMM>)")
    p.add_argument("--no-charts", action="store_true", help="write no PNG charts")
    p.add_argument("--plain", action="store_true", help="plain text output even when rich is installed")
    p.add_argument("--list", action="store_true", help="list presets and implementations, then exit")
    p.add_argument("--distributed", metavar="N", help="context parallelism: ring attention on N ranks (torchrun) "
                   "against one device; its own options: python -m waveboost.bench --distributed N --help")
    add_pass_arguments(p)
    return p


def add_pass_arguments(p: argparse.ArgumentParser) -> None:
    """--pass (forward, backward, both), --peak-gbs (the serving presets' bandwidth percentage) and
    --cuda-graphs (timing by graph replay)."""
    p.add_argument("--pass", dest="passes",
                   help="comma-separated passes to time: fwd (the forward), bwd (the backward alone, given the "
                        "forward's saved outputs: waveboost.attention_backward with out and lse; autograd's backward "
                        "of SDPA with a fixed output gradient; the backward function of jax.vjp, jitted), fwdbwd "
                        "(both). FLOPs: forward 4*B*H*Lq*Lk*D, backward 2.5x, fwdbwd 3.5x, halved for causal. "
                        "Default: the preset's (fwd; fwdbwd for train). The serving presets are forward-only")
    p.add_argument("--peak-gbs", type=float,
                   help="peak memory bandwidth (GB/s) that the serving presets (decode, paged, varlen) report a "
                        "percentage of (default: a table by GPU name, else the driver's memory clock x bus width)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="time waveboost and SDPA by replaying a CUDA graph of one call (as engines run decode "
                        "steps): the GPU time without the host's launch cost; JAX is timed as before")


def pass_settings(args, cases: list, device: str, env: dict) -> dict:
    """The passes timed and, when a cell is memory-bound, the peak bandwidth and where it comes from."""
    passes = list(dict.fromkeys(c.pass_name for c in cases))
    out = {"passes": passes}
    if passes != ["fwd"]:
        out["tolerance_backward"] = measure.TOLERANCE_BACKWARD
    if any(c.serving for c in cases):
        ordinal = impls.module("torch").cuda.current_device() if device == "cuda" else 0
        out["peak_gbs"], out["peak_source"] = hardware.peak_bandwidth(device, env["name"], args.peak_gbs, ordinal)
    return out


def applicable(chosen: list, cases: list) -> list:
    """The implementations that take part in at least one cell (pass and layout)."""
    return [i for i in chosen if any(i.applies(c) for c in cases)]


def resolve_device(requested: str) -> str:
    torch = impls.module("torch") if requested != "cpu" else None
    has_cuda = bool(torch is not None and torch.cuda.is_available())
    if requested == "cuda" and not has_cuda:
        raise SystemExit("--device cuda: no CUDA device visible to torch (the CUDA runs use torch tensors, "
                         "CUDA events and a torch float64 reference)")
    return "cuda" if has_cuda else "cpu"


def select(registry: list, patterns: str | None) -> list:
    if not patterns:
        return registry
    names = [i.name for i in registry]
    chosen = []
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        matched = [i for i in registry if fnmatch.fnmatchcase(i.name, pattern) and i not in chosen]
        if not matched and not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise SystemExit(f"--impls: {pattern!r} matches none of {', '.join(names)}")
        chosen += matched
    return chosen


@contextmanager
def progress_bar(total: int, use_rich: bool):
    """Yields advance(description): a rich bar on a terminal's stderr, else plain lines (a log file)."""
    if use_rich and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("", total=total)
            yield lambda text, steps=1: bar.update(task, advance=steps, description=text)
        return
    done = [0]
    started = time.perf_counter()

    def advance(text, steps=1):
        done[0] += steps
        state = "done" if steps else "running"
        print(f"[{done[0]}/{total} {time.perf_counter() - started:.0f}s] {state}: {text}", file=sys.stderr, flush=True)
    yield advance


def estimate_cpu_minutes(cases: list, n_impls: int, settings: measure.Settings) -> tuple[float, float]:
    """(a lower bound of the run's minutes, the GFLOP/s it assumes): every implementation at the
    speed of waveboost's CPU path, measured here on a small probe, for the calls a cell makes."""
    import numpy as np

    wb = impls.module("waveboost")
    probe = grid.Case(1, 512, 8, 8, 64, "float32", False)
    q = np.random.default_rng(0).standard_normal((1, 512, 8, 64)).astype(np.float32)
    wb.attention(q, q, q)
    start = time.perf_counter()
    wb.attention(q, q, q)
    rate = probe.flops / max(time.perf_counter() - start, 1e-9)
    seconds = 0.0
    for case in cases:
        call = case.flops / rate
        timed = max(measure.MIN_REPS * call, min(settings.budget_s, settings.repeats * call))
        seconds += (measure.WARMUP_CALLS + 2) * call + timed  # warm-up, the checked call, the memory call
    return seconds * n_impls / 60, rate / 1e9


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns 1 when a waveboost implementation is WRONG or errors, else 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--distributed" in argv:
        from .distributed import launch
        return launch(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    registry = impls.registry(device)
    if args.list:
        for name, p in grid.PRESETS.items():
            print(f"preset {name:8s} {p.doc}")
        for impl in registry:
            print(f"{device:5s} {impl.name:16s} {impl.missing() or 'available'}")
        return 0

    preset = "quick" if args.quick else args.preset or "quick"
    try:
        cases = grid.expand(preset, device, seqlens=grid.parse_ints(args.seqlens), batch=grid.parse_ints(args.batch),
                            heads=grid.parse_ints(args.heads), kv_heads=grid.parse_ints(args.kv_heads),
                            head_dims=grid.parse_ints(args.head_dims), dtypes=grid.parse_dtypes(args.dtypes),
                            causal=grid.parse_causal(args.causal), passes=grid.parse_passes(args.passes))
    except ValueError as exc:
        parser.error(str(exc))
    if device == "cpu" and any(c.dtype in ("float16", "bfloat16") for c in cases):
        parser.error("--dtypes: the CPU runs take float32 and float64")

    if args.peak_gbs is not None and not args.peak_gbs > 0:
        parser.error(f"--peak-gbs must be > 0; got {args.peak_gbs}")
    selected = select(registry, args.impls)
    chosen = applicable(selected, cases)
    for name in sorted({i.name for i in selected} - {i.name for i in chosen}):
        if args.impls and name in args.impls.split(","):  # named outright, not through a glob
            print(f"note: {name} takes part in no cell of this grid (pass or layout); it is left out", file=sys.stderr)
    impl_info = [{"name": i.name, "kind": i.kind, "missing": i.missing()} for i in chosen]
    runnable = [i for i, info in zip(chosen, impl_info) if not info["missing"]]
    names = [i.name for i in chosen]
    runnable_names = [i.name for i in runnable]
    if args.baseline and args.baseline not in names:
        parser.error(f"--baseline {args.baseline!r} is not among the implementations: {', '.join(names)}")
    if args.baseline and args.baseline not in runnable_names:
        parser.error(f"--baseline {args.baseline!r} cannot run here: "
                     f"{next(i['missing'] for i in impl_info if i['name'] == args.baseline)}")
    baseline = args.baseline or DEFAULT_BASELINE[device]
    if baseline not in runnable_names:
        baseline = ""  # the default baseline is not in this run: no speedups rather than a silent substitute
    if not args.spread_threshold > 0:
        parser.error(f"--spread-threshold must be > 0; got {args.spread_threshold}")

    d = DEFAULTS[device]
    settings = measure.Settings(device=device, repeats=args.repeats or d["repeats"],
                                budget_s=(args.budget_ms or d["budget_ms"]) / 1e3,
                                mem_limit_bytes=(args.mem_limit_gb or d["mem_limit_gb"]) * 1e9, seed=args.seed,
                                spread_threshold=args.spread_threshold)
    if device == "cpu" and args.max_minutes > 0 and runnable:
        minutes, rate = estimate_cpu_minutes(cases, len(runnable), settings)
        if minutes > args.max_minutes:
            parser.error(f"this grid would take at least ~{minutes:.0f} minutes here ({len(cases)} cells x "
                         f"{len(runnable)} implementations, each assumed as fast as waveboost's CPU path, which runs "
                         f"~{rate:.0f} GFLOP/s on this machine). Shrink it (--seqlens, --batch, --heads, --impls) "
                         f"or raise --max-minutes (0: no limit)")
    env = report.environment(device)
    extra_settings = pass_settings(args, cases, device, env)
    settings.peak_gbs = extra_settings.get("peak_gbs")
    settings.cuda_graphs = bool(args.cuda_graphs)
    extra_settings["cuda_graphs"] = settings.cuda_graphs
    stamp = datetime.now().astimezone()
    out_dir = args.out or os.path.join("bench-results", f"{report.slug(env['name'])}-{stamp:%Y%m%d-%H%M}")
    meta = {"tool": "waveboost.bench", "date": stamp.isoformat(timespec="seconds"),
            "command": "python -m waveboost.bench " + shlex.join(argv), "environment": env,
            "settings": {"preset": preset, "baseline": baseline, "repeats": settings.repeats,
                         "budget_ms": settings.budget_s * 1e3, "mem_limit_gb": settings.mem_limit_bytes / 1e9,
                         "seed": settings.seed, "tolerance": measure.TOLERANCE, "warmup_calls": measure.WARMUP_CALLS,
                         "min_reps": measure.MIN_REPS, "cells": len(cases),
                         "spread_threshold": settings.spread_threshold, **extra_settings},
            # The work each implementation faces: divide by a rate to estimate the run's length.
            "gflop_per_impl": sum(c.flops for c in cases) / 1e9}

    use_rich = impls.module("rich") is not None and not args.plain
    flush = mempool = None
    if device == "cuda":
        torch = impls.module("torch")
        flush = torch.empty(measure.FLUSH_BYTES, dtype=torch.int8, device="cuda")
        mempool = measure.default_mempool()
    rows = []
    started = time.perf_counter()
    for line in report.header_lines(meta):
        print(line, flush=True)
    # Files are rewritten after every cell: an interrupted run keeps everything it measured.
    try:
        steps = sum(max(1, sum(i.applies(c) for i in runnable)) for c in cases)
        with progress_bar(steps, use_rich) as advance:
            for n, case in enumerate(cases):
                inputs = measure.make_inputs(case, device, settings.seed + n)
                reference = measure.Reference(case, inputs)
                cell_impls = [i for i in runnable if i.applies(case)]
                for impl in cell_impls:
                    advance(f"{case.title()}  {impl.name}", 0)
                    rows.append(measure.run_cell(case, impl, inputs, reference, settings, flush, mempool))
                    advance(f"{case.title()}  {impl.name}")
                if not cell_impls:
                    advance(case.title())
                del inputs, reference
                if device == "cuda":
                    torch.cuda.empty_cache()  # hand cached blocks back so the next cell's JAX calls find memory
                meta["cells_done"] = n + 1
                meta["seconds"] = round(time.perf_counter() - started, 1)
                report.add_speedups(rows, baseline)
                written = report.write_files(out_dir, meta, impl_info, rows)
    except KeyboardInterrupt:
        meta["interrupted"] = True
        print(f"interrupted after {meta.get('cells_done', 0)} of {len(cases)} cells; what was measured is in "
              f"{out_dir}", file=sys.stderr)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    report.add_speedups(rows, baseline)
    written = report.write_files(out_dir, meta, impl_info, rows)
    console = None
    if use_rich:
        from rich.console import Console
        console = Console()
        if not console.is_terminal:  # a log file: no 80-column squeeze
            console = Console(width=180)
    report.print_table(rows, impl_info, device, baseline, console)
    if not args.no_charts and impls.module("matplotlib") is None:
        print("charts skipped: matplotlib not installed (pip install 'waveboost[bench]')")
    elif not args.no_charts:
        from . import charts
        written += charts.write_charts(rows, meta, impl_info, out_dir)
    files = ", ".join(os.path.basename(w) for w in written)
    print(f"{len(cases)} cells in {meta['seconds']} s on {env['name']}; wrote {files} to {out_dir}")
    unstable = sum(bool(r.get("unstable")) for r in rows)
    if unstable:
        print(f"~ {unstable} of {len(rows)} timings stayed unstable after a re-run (IQR over "
              f"{settings.spread_threshold:.0%} of the median): other work on the machine? treat them with care")
    if meta.get("interrupted"):
        return 130
    failed = [r for r in rows if r["impl"].startswith("waveboost") and r["status"] in ("WRONG", "error")]
    return 1 if failed else 0
