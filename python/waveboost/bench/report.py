"""Results out: speedups, CSV/JSON/Markdown files, the console table, the run's environment."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import shutil
import subprocess
from collections import defaultdict

from .impls import module

CASE_COLUMNS = ["label", "batch", "seqlen", "heads", "kv_heads", "head_dim", "dtype", "causal", "pass_name", "layout",
                "seqlen_q", "page_size"]
_CASE_DEFAULTS = {"pass_name": "fwd", "layout": "dense", "seqlen_q": 0, "page_size": 0}
CSV_COLUMNS = {
    "latency.csv": CASE_COLUMNS + ["impl", "status", "reason", "rel_err", "clock", "reps", "median_ms", "q1_ms",
                                   "q3_ms", "min_ms", "max_ms", "spread", "retimed", "unstable", "speedup",
                                   "speedup_unstable", "baseline"],
    "throughput.csv": CASE_COLUMNS + ["impl", "status", "median_ms", "tokens_per_s", "tflops", "gb_s", "pct_peak"],
    "memory.csv": CASE_COLUMNS + ["impl", "status", "mem_extra_bytes", "mem_extra_mb", "mem_method"],
}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
STATUS_STYLE = {"ok": "green", "WRONG": "bold red", "error": "red", "unsupported": "yellow", "skipped": "yellow",
                "not installed": "dim"}


def cell_key(row: dict) -> tuple:
    return tuple(row.get(c, _CASE_DEFAULTS.get(c)) for c in CASE_COLUMNS)


def add_speedups(rows: list[dict], baseline: str) -> None:
    """speedup = baseline median / impl median within each cell (None where either did not run)."""
    base = {cell_key(r): r for r in rows if r["impl"] == baseline and r["status"] == "ok"}
    for r in rows:
        b = base.get(cell_key(r))
        r["baseline"] = baseline
        r["speedup"] = b["median_ms"] / r["median_ms"] if b and r["status"] == "ok" else None
        # A ratio is only as steady as the noisier of its two timings.
        r["speedup_unstable"] = bool(r["speedup"] is not None and (r.get("unstable") or b.get("unstable")))


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


# ---- environment ----------------------------------------------------------------------------

def _nvidia_driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """Device, driver and versions for results.json; nothing here imports a missing package."""
    versions = {"python": platform.python_version()}
    for name in ("waveboost", "numpy", "torch", "jax", "jaxlib", "cupy", "triton"):
        mod = module(name)
        versions[name] = getattr(mod, "__version__", None) if mod else None
    env = {"device": device, "platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "versions": versions}
    if hasattr(os, "getloadavg"):  # other work on the machine skews CPU timings most: say how busy it was
        env["load_average_1_5_15m"] = [round(x, 2) for x in os.getloadavg()]
    wb = module("waveboost")
    if wb is not None:
        env["waveboost_info"] = wb.info()
    torch = module("torch")
    if torch is not None:
        env["torch_threads"] = torch.get_num_threads()
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   compute_capability=f"{props.major}.{props.minor}", cuda_runtime=torch.version.cuda,
                   driver=_nvidia_driver())
        env["name"] = props.name
    else:
        env["name"] = env["cpu"]
    return env


def header_lines(meta: dict) -> list[str]:
    """What a reader needs to weigh the numbers: device, CPU path and threads, baseline, spread rule."""
    env, settings = meta["environment"], meta["settings"]
    info = env.get("waveboost_info") or {}
    lines = [f"{env['name']} ({env['device']}), {env.get('cpu_count')} logical CPUs; waveboost "
             f"{env['versions'].get('waveboost')}, CPU path {info.get('cpu_isa', '?')} with "
             f"{info.get('cpu_threads', '?')} threads"
             + (f"; torch {env['versions'].get('torch')} with {env['torch_threads']} threads"
                if env.get("torch_threads") else "")]
    if meta.get("gflop_per_impl") is not None:
        lines.append(f"grid: {settings['cells']} cells, {meta['gflop_per_impl']:.4g} GFLOP per implementation "
                     f"(preset {settings['preset']})")
    baseline = settings["baseline"]
    lines += pass_lines(settings)
    lines.append(f"speedup = {baseline} time / implementation time (--baseline to change)" if baseline
                 else "no speedups: the baseline did not run (pick one with --baseline)")
    lines.append(f"cells whose timed calls spread (IQR / median) over {settings['spread_threshold']:.0%} are "
                 "re-timed once; still over: marked ~ (unstable)")
    if meta.get("interrupted"):
        lines.append(f"INTERRUPTED: {meta.get('cells_done', 0)} of {settings['cells']} cells measured")
    return lines


def pass_lines(settings: dict) -> list[str]:
    """How the backward passes count FLOPs and the serving cells bytes, when the run has them."""
    lines = []
    passes = settings.get("passes") or ["fwd"]
    if passes != ["fwd"]:
        lines.append(f"passes {', '.join(passes)}: FLOPs = forward 4*B*H*Lq*Lk*D (halved for causal), backward 2.5x "
                     "that, fwdbwd 3.5x; bwd times the backward alone from the forward's saved outputs")
    if "peak_source" in settings:
        peak = settings.get("peak_gbs")
        lines.append("serving cells: GB/s = (K/V cache bytes read + q read + out written) / time, the same bytes "
                     "for every implementation; peak " + (f"{peak:.0f} GB/s" if peak else "unknown")
                     + f" ({settings['peak_source']})")
    return lines


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---- files ----------------------------------------------------------------------------------

def csv_value(value):
    """One CSV field: bools as 0/1, floats to 6 significant digits, None as empty."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def write_files(out_dir: str, meta: dict, impls: list[dict], rows: list[dict]) -> list[str]:
    """latency.csv, throughput.csv, memory.csv, results.json and summary.md in `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, columns in CSV_COLUMNS.items():
        path = os.path.join(out_dir, name)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            for r in rows:
                mb = r.get("mem_extra_bytes")
                full = {**r, "mem_extra_mb": mb / 2**20 if mb is not None else None}
                writer.writerow([csv_value(full.get(c)) for c in columns])
        written.append(path)
    path = os.path.join(out_dir, "results.json")
    with open(path, "w") as f:
        json.dump({**meta, "impls": impls, "rows": rows}, f, indent=1, default=str)
    written.append(path)
    path = os.path.join(out_dir, "summary.md")
    with open(path, "w") as f:
        f.write(summary_markdown(meta, impls, rows))
    written.append(path)
    return written


def summary_markdown(meta: dict, impls: list[dict], rows: list[dict]) -> str:
    """Per-implementation counts and geometric-mean speedups, then waveboost-vs-peer latency ratios."""
    env = meta["environment"]
    baseline = meta["settings"]["baseline"]
    unstable = sum(bool(r.get("unstable")) for r in rows)
    lines = [f"# {env['name']} ({env['device']}), {meta['date']}", "", f"Command: `{meta['command']}`", "",
             *header_lines(meta), "", f"Unstable timings (~): {unstable} of {len(rows)} rows.", "",
             f"| impl | ok | WRONG | other | geomean speedup vs {baseline or '(none)'} | "
             f"best {rate_unit(env['device'])} |",
             "|---|---|---|---|---|---|"]
    by_impl = defaultdict(list)
    for r in rows:
        by_impl[r["impl"]].append(r)
    scale = rate_scale(env["device"])
    for name, rs in by_impl.items():
        ok = [r for r in rs if r["status"] == "ok"]
        wrong = sum(r["status"] == "WRONG" for r in rs)
        geo = geomean(r["speedup"] for r in ok)
        best = max((r["tflops"] * scale for r in ok), default=None)
        lines.append(f"| {name} | {len(ok)} | {wrong} | {len(rs) - len(ok) - wrong} | "
                     f"{'' if geo is None else f'{geo:.2f}'} | {'' if best is None else f'{best:.1f}'} |")
    for i in impls:
        if i["missing"]:
            lines.append(f"| {i['name']} | not run: {i['missing']} | | | | |")
    ours = [n for n in by_impl if n.startswith("waveboost_")]
    peers = [n for n in by_impl if not n.startswith("waveboost_")]
    if ours and peers:
        lines += ["", "Peer latency / waveboost latency, geometric mean over the cells both ran "
                      "(> 1: waveboost faster; cells in brackets):",
                  "", "| waveboost | " + " | ".join(peers) + " |", "|---" * (len(peers) + 1) + "|"]
        median = {(r["impl"], cell_key(r)): r["median_ms"] for r in rows if r["status"] == "ok"}
        for name in ours:
            cells = []
            for peer in peers:
                ratios = [median[(peer, k)] / m for (n, k), m in median.items() if n == name and (peer, k) in median]
                geo = geomean(ratios)
                cells.append("" if geo is None else f"{geo:.2f} ({len(ratios)})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if len(rows) > len(by_impl):  # more than one cell: every cell's numbers side by side
        lines += ["", *per_cell_table(rows, list(by_impl), env["device"])]
    return "\n".join(lines) + "\n"


def per_cell_table(rows: list[dict], names: list[str], device: str) -> list[str]:
    """Markdown: one line per cell, one column per implementation: TFLOP/s (GFLOP/s on a CPU), or for
    serving cells GB/s and the percentage of peak; then the best waveboost over the best peer."""
    serving = has_serving(rows)
    unit = "GB/s (% of peak)" if serving else rate_unit(device)
    scale = rate_scale(device)
    lines = [f"Per cell, {unit}; last column: best peer time / best waveboost time (> 1: waveboost faster):",
             "", "| cell | " + " | ".join(names) + " | waveboost / best peer |", "|---" * (len(names) + 2) + "|"]
    cells = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            cells[cell_name(r)][r["impl"]] = r
        else:
            cells[cell_name(r)].setdefault(r["impl"], r)
    for cell, by_name in cells.items():
        values = []
        for name in names:
            r = by_name.get(name)
            if r is None:
                values.append("")
            elif r["status"] != "ok":
                values.append(r["status"])
            elif serving and r.get("gb_s") is not None:
                pct = r.get("pct_peak")
                values.append(f"{r['gb_s']:.3g}" + (f" ({pct:.0f}%)" if pct is not None else ""))
            else:
                values.append(f"{r['tflops'] * scale:.1f}")
        ok = [r for r in by_name.values() if r["status"] == "ok"]
        ours = min((r["median_ms"] for r in ok if r["impl"].startswith("waveboost")), default=None)
        theirs = min((r["median_ms"] for r in ok if not r["impl"].startswith("waveboost")), default=None)
        ratio = f"{theirs / ours:.2f}" if ours and theirs else ""
        lines.append(f"| {cell} | " + " | ".join(values) + f" | {ratio} |")
    return lines


def rate_unit(device: str) -> str:
    return "GFLOP/s" if device == "cpu" else "TFLOP/s"


def rate_scale(device: str) -> float:
    return 1e3 if device == "cpu" else 1.0


# ---- console --------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def cell_name(r: dict) -> str:
    """A cell in one line: label, lengths, heads, dtype, mask, layout and pass."""
    kv = f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    layout = r.get("layout", "dense")
    seq = f"L={r['seqlen']}" if layout == "dense" else f"Lq={r.get('seqlen_q') or r['seqlen']} Lk={r['seqlen']}"
    where = "" if layout == "dense" else f" {layout}{r.get('page_size') or ''}"
    pas = r.get("pass_name", "fwd")
    return (f"{r['label'] + ' ' if r['label'] else ''}{seq} B={r['batch']} H={r['heads']}{kv} "
            f"D={r['head_dim']} {SHORT_DTYPE[r['dtype']]}{' causal' if r['causal'] else ''}{where}"
            f"{'' if pas == 'fwd' else ' ' + pas}")


def has_serving(rows: list[dict]) -> bool:
    return any(r.get("layout", "dense") != "dense" for r in rows)


def table_rows(rows: list[dict], device: str) -> list[list[str]]:
    scale = rate_scale(device)
    serving = has_serving(rows)
    out = []
    for r in rows:
        ok = r["status"] == "ok"
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        mb = r.get("mem_extra_bytes")
        cell = cell_name(r)
        bandwidth = [_fmt(r.get("gb_s") if ok else None, ".4g"), _fmt(r.get("pct_peak") if ok else None, ".1f")]
        out.append([
            cell,
            r["impl"], status,
            _fmt(r.get("median_ms"), ".4g") if ok else "",
            f"{r['q1_ms']:.3g}-{r['q3_ms']:.3g}{' ~' if r.get('unstable') else ''}" if ok else "",
            _fmt(r["tflops"] * scale, ".1f") if ok else "",
            _fmt(r.get("tokens_per_s") and r["tokens_per_s"] / 1e6, ".3g") if ok else "",
            _fmt(mb and mb / 2**20, ".1f") if ok else "",
            _fmt(r.get("speedup"), ".2f") + (" ~" if r.get("speedup_unstable") else ""),
        ] + (bandwidth if serving else []))
    return out


def table_header(device: str, baseline: str, serving: bool = False) -> list[str]:
    return ["cell", "impl", "status", "median ms", "IQR ms", rate_unit(device), "Mtok/s", "extra MB",
            f"x {baseline}" if baseline else "x (no baseline)"] + (["GB/s", "% peak"] if serving else [])


def print_table(rows: list[dict], impls: list[dict], device: str, baseline: str, console=None) -> None:
    """A rich table when `console` (a rich Console) is given, plain aligned text otherwise."""
    header = table_header(device, baseline, has_serving(rows))
    body = table_rows(rows, device)
    missing = [[i["name"], "not installed" if "not installed" in i["missing"] else "not run", i["missing"]]
               for i in impls if i["missing"]]
    if console is not None:
        from rich.table import Table
        table = Table(*header, title=f"waveboost bench ({device})", show_lines=False)
        previous = None
        for r, cells in zip(rows, body):
            key = cell_key(r)
            if previous is not None and key != previous:
                table.add_section()
            style = STATUS_STYLE.get(r["status"], "")
            table.add_row(cells[0] if key != previous else "", cells[1], f"[{style}]{cells[2]}[/]", *cells[3:])
            previous = key
        for name, state, why in missing:
            table.add_section()
            table.add_row("(all)", name, f"[dim]{state}: {why}[/]", *[""] * (len(header) - 3))
        console.print(table)
        return
    lines = [header] + [[c if len(c) <= 60 else c[:57] + "..." for c in cells] for cells in body]
    lines += [["(all)", name, f"{state}: {why}"] + [""] * (len(header) - 3) for name, state, why in missing]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
