"""PNG charts (matplotlib, Agg): latency, throughput, memory, speedup and a one-page dashboard.

Cells that differ only in sequence length form one panel with L on a log2 axis; presets
whose cells each have a single L (seed, models) get grouped bars instead. Only rows that ran
correctly are drawn; implementations with no drawable row are named in a footnote with why.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

from .report import cell_name, geomean, has_serving, rate_scale, rate_unit

_PANEL_KEYS = ("dtype", "head_dim", "causal", "heads", "kv_heads", "label", "pass_name", "layout", "seqlen_q",
               "page_size")
_KEY_DEFAULTS = {"pass_name": "fwd", "layout": "dense", "seqlen_q": 0, "page_size": 0}


def _key(r: dict, keys=_PANEL_KEYS) -> tuple:
    return tuple(r.get(k, _KEY_DEFAULTS.get(k)) for k in keys)


def _groups(rows: list[dict]) -> dict:
    """Panels: rows equal in everything but seqlen (and batch when the batch follows L, as in fa2)."""
    groups = defaultdict(list)
    for r in rows:
        groups[_key(r)].append(r)
    split = {}
    for key, rs in groups.items():
        points = {(r["impl"], r["seqlen"]) for r in rs}
        if len(points) == len(rs):
            split[key] = rs
        else:  # several batches at one L: one panel per batch
            for r in rs:
                split.setdefault(key + (r["batch"],), []).append(r)
    return split


def _panel_title(rs: list[dict]) -> str:
    r = rs[0]
    batches = {x["batch"] for x in rs}
    tokens = {x["batch"] * x["seqlen"] for x in rs}
    batch = f"B={r['batch']}" if len(batches) == 1 else f"B·L={tokens.pop()}" if len(tokens) == 1 else "B varies"
    kv = f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    name = f"{r['label']} " if r["label"] else ""
    pas = r.get("pass_name", "fwd")
    return (f"{name}{r['dtype']} D={r['head_dim']} H={r['heads']}{kv} {batch}{' causal' if r['causal'] else ''}"
            f"{'' if pas == 'fwd' else ' ' + pas}")


def _cell_name(r: dict) -> str:
    """Three lines of report.cell_name: the label or lengths, the shape, the rest."""
    words = cell_name(r).split()
    return "\n".join((" ".join(words[:2]), " ".join(words[2:5]), " ".join(words[5:])))


class _Styles:
    """One color and marker per implementation across all charts; waveboost solid, peers dashed."""

    def __init__(self, names):
        import matplotlib
        cmap = matplotlib.colormaps["tab10"]
        markers = "osD^v<>ph*"
        self.style = {}
        for i, name in enumerate(names):
            ours = name.startswith("waveboost")
            self.style[name] = {"color": cmap(i % 10), "marker": markers[i % len(markers)],
                                "linestyle": "-" if ours else "--", "linewidth": 2.0 if ours else 1.4}

    def __call__(self, name):
        return self.style[name]


def _legend_columns(width_inches: float, labels) -> int:
    """As many legend columns as fit the figure's width (about 0.08 inch per character)."""
    longest = max((len(str(label)) for label in labels), default=1)
    return max(1, min(len(labels), int(width_inches / (0.08 * longest + 0.6))))


def _log_if_wide(ax, values, axis="y"):
    """Log scale when the values span more than a factor of 20, labelled 0.1, 1, 10 (not 10^-1)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    values = [v for v in values if v and v > 0]
    if values and max(values) / min(values) > 20:
        target = ax.yaxis if axis == "y" else ax.xaxis
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        if max(values) / min(values) < 1000:  # few decades: label 1-2-5 steps, not only powers of 10
            target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        target.set_minor_formatter(NullFormatter())


def _lines(ax, rs, metric, styles, errors=False):
    by_impl = defaultdict(list)
    for r in rs:
        by_impl[r["impl"]].append(r)
    values = []
    for name, pts in by_impl.items():
        pts.sort(key=lambda r: r["seqlen"])
        xs = [r["seqlen"] for r in pts]
        ys = [metric(r) for r in pts]
        values += ys
        style = styles(name)
        if errors:
            lo = [y - r["q1_ms"] for y, r in zip(ys, pts)]
            hi = [r["q3_ms"] - y for y, r in zip(ys, pts)]
            ax.errorbar(xs, ys, yerr=[lo, hi], label=name, markersize=4, capsize=2, **style)
        else:
            ax.plot(xs, ys, label=name, markersize=4, **style)
    seqlens = sorted({r["seqlen"] for r in rs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
    ax.minorticks_off()
    ax.set_xlabel("sequence length L")
    ax.grid(True, which="major", alpha=0.3)
    return values


def _bars(ax, rs, metric, styles):
    cells = list(dict.fromkeys(_cell_name(r) for r in rs))
    present = {r["impl"] for r in rs}
    names = [n for n in styles.style if n in present]  # run order, the same in every chart
    width = 0.8 / max(1, len(names))
    values = []
    for j, name in enumerate(names):
        pts = {_cell_name(r): metric(r) for r in rs if r["impl"] == name}
        xs = [i + (j - (len(names) - 1) / 2) * width for i, c in enumerate(cells) if c in pts]
        ys = [pts[c] for c in cells if c in pts]
        values += ys
        ax.bar(xs, ys, width=width, label=name, color=styles(name)["color"])
    ax.set_xticks(range(len(cells)), cells, fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    return values


def _missing_note(all_rows, impls) -> str:
    """Why lines and bars are missing: implementations with no correct row (and why), then
    the count of cells per status for those with gaps."""
    ok = {r["impl"] for r in all_rows if r["status"] == "ok"}
    why, gaps = defaultdict(set), defaultdict(lambda: defaultdict(int))
    for r in all_rows:
        if r["impl"] not in ok:
            why[r["impl"]].add(r["status"] + (": " + r["reason"][:40] if r["status"] != "WRONG" else ""))
        elif r["status"] != "ok":
            gaps[r["impl"]][r["status"]] += 1
    for i in impls:
        if i["missing"]:
            why[i["name"]].add(i["missing"])
    parts = []
    if why:
        parts.append("no data: " + ", ".join(f"{n} ({'; '.join(sorted(w))})" for n, w in why.items()))
    if gaps:
        parts.append("gaps: " + ", ".join(f"{n} ({', '.join(f'{c} {s}' for s, c in st.items())})"
                                          for n, st in gaps.items()))
    return "; ".join(parts)


def _day(meta: dict) -> str:
    return meta["date"][:16].replace("T", " ")


def _metrics(device: str, baseline: str, rows=()) -> dict:
    scale = rate_scale(device)
    passes = {r.get("pass_name", "fwd") for r in rows}
    flops = "4·B·H·L²·D, /2 causal" if passes <= {"fwd"} else "bwd: 2.5x fwd FLOPs"
    serving = {"bandwidth": (lambda r: r.get("gb_s"), "GB/s (K/V cache + q + out bytes)", "Memory bandwidth")} \
        if has_serving(rows) else {}
    return {
        **serving,
        "latency": (lambda r: r["median_ms"], "latency (ms, median; bars: IQR)", "Latency"),
        "throughput": (lambda r: r["tflops"] * scale, f"{rate_unit(device)} ({flops})", "Throughput"),
        "memory": (lambda r: r["mem_extra_bytes"] / 2**20 if r.get("mem_extra_bytes") else None,
                   "peak extra memory (MiB)", "Peak extra memory"),
        "speedup": (lambda r: r["speedup"], f"speedup vs {baseline} (×)", f"Speedup vs {baseline}"),
    }


def _draw(ax, rs, metric, ylabel, styles, line_mode, errors=False):
    rs = [r for r in rs if metric(r) is not None]
    values = _lines(ax, rs, metric, styles, errors) if line_mode else _bars(ax, rs, metric, styles)
    ax.set_ylabel(ylabel)
    _log_if_wide(ax, values)
    return bool(rs)


def write_charts(rows: list[dict], meta: dict, impls: list[dict], out_dir: str) -> list[str]:
    """Writes the PNGs (latency, throughput, memory, speedup unless no baseline ran, bandwidth for serving
    cells, and the dashboard); returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    device = meta["environment"]["device"]
    baseline = meta["settings"]["baseline"]
    ok = [r for r in rows if r["status"] == "ok"]
    styles = _Styles(dict.fromkeys(r["impl"] for r in rows))
    groups = _groups(ok)
    line_mode = any(len({r["seqlen"] for r in rs}) > 1 for rs in groups.values())
    panels = list(groups.values()) if line_mode else [ok]
    title = f"{meta['environment']['name']} — {_day(meta)}"
    note = _missing_note(rows, impls)
    paths = []

    for chart, (metric, ylabel, heading) in _metrics(device, baseline, rows).items():
        if chart == "speedup" and not baseline:  # no baseline ran: no speedups to draw
            continue
        ncols = min(len(panels), 4) or 1
        nrows = max(1, math.ceil(len(panels) / ncols))
        width = max(9.0, 4.6 * ncols if line_mode else 0.25 * len(ok) + 3)
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.6 * nrows + 1.0), squeeze=False)
        for ax, rs in zip(axes.flat, panels):
            _draw(ax, rs, metric, ylabel, styles, line_mode, errors=chart == "latency")
            if chart == "speedup":
                ax.axhline(1.0, color="gray", linewidth=1)
            if line_mode:
                ax.set_title(_panel_title(rs), fontsize=9)
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        handles = {}
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=_legend_columns(width, handles),
                   bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()), fontsize=9, frameon=False)
        fig.suptitle(f"{heading} — {title}", fontsize=11)
        if note:
            fig.text(0.01, 0.005, note, fontsize=7, color="dimgray", wrap=True)
        fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1 - 0.6 / fig.get_figheight()))
        path = os.path.join(out_dir, f"{chart}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    paths.append(_dashboard(plt, ok, rows, meta, styles, groups, line_mode, note, out_dir))
    return paths


def _headline(groups: dict):
    """The panel the dashboard shows: the most seqlens, preferring fp16/bf16, D=128, non-causal."""
    def rank(item):
        key, rs = item
        dtype, head_dim, causal = key[0], key[1], key[2]
        return (len({r["seqlen"] for r in rs}), dtype in ("float16", "bfloat16"), head_dim == 128, not causal)
    return max(groups.items(), key=rank)[1] if groups else []


def _dashboard(plt, ok, rows, meta, styles, groups, line_mode, note, out_dir) -> str:
    env, settings = meta["environment"], meta["settings"]
    device, baseline = env["device"], settings["baseline"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    rs = _headline(groups) if line_mode else ok
    metrics = _metrics(device, baseline, rows)
    first = "bandwidth" if "bandwidth" in metrics else "throughput"
    for ax, name in zip((axes[0, 0], axes[0, 1], axes[1, 0]), (first, "latency", "memory")):
        metric, ylabel, heading = metrics[name]
        _draw(ax, rs, metric, ylabel, styles, line_mode, errors=name == "latency")
        ax.set_title(f"{heading}" + (f": {_panel_title(rs)}" if line_mode and rs else ""), fontsize=9)
        if not line_mode:
            ax.tick_params(axis="x", labelsize=6)

    # Whole run in one panel: geometric-mean speedup per implementation, whiskers min..max.
    ax = axes[1, 1]
    speedups = defaultdict(list)
    for r in ok:
        if r.get("speedup"):
            speedups[r["impl"]].append(r["speedup"])
    names = list(speedups)
    geo = [geomean(speedups[n]) for n in names]
    lo = [max(0.0, g - min(speedups[n])) for g, n in zip(geo, names)]  # rounding: geomean of equal values
    hi = [max(0.0, max(speedups[n]) - g) for g, n in zip(geo, names)]
    ax.barh(range(len(names)), geo, xerr=[lo, hi], color=[styles(n)["color"] for n in names], capsize=3)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="gray", linewidth=1)
    ax.set_xlabel(f"speedup vs {baseline} (×), geometric mean over cells; whiskers: min..max" if baseline
                  else "no speedups: the baseline did not run (--baseline)")
    ax.set_title(f"All {len({_key(r, _PANEL_KEYS + ('seqlen', 'batch')) for r in rows})} cells", fontsize=9)
    _log_if_wide(ax, [v for n in names for v in speedups[n]], axis="x")
    ax.grid(True, axis="x", alpha=0.3)

    handles = {}
    for a in axes.flat[:3]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=_legend_columns(13, handles),
               bbox_to_anchor=(0.5, 0.935), fontsize=9, frameon=False)
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v and k != "python")
    fig.suptitle(f"waveboost bench — {env['name']} ({device}) — {_day(meta)}\n{versions}", fontsize=11)
    fig.text(0.01, 0.012, f"$ {meta['command']}" + (f"\n{note}" if note else ""), fontsize=7, color="dimgray",
             wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.895))
    path = os.path.join(out_dir, "dashboard.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
