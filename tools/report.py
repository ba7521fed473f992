#!/usr/bin/env python3
"""Turn fp4kit-bench JSON into the summary table, the README performance table and PNG plots.

    tools/report.py bench/results/decode_*.json [--summary] [--readme README.md] [--plot DIR]

Every number comes from the JSON files; nothing is typed in by hand.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def load(paths):
    """Each run's rows, keeping only what dispatch picks (a --config all sweep also times the others)."""
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        d["_path"] = str(p)
        d["rows"] = [r for r in d["rows"] if r.get("dispatch", True)]
        runs.append(d)
    return runs


def summary(runs):
    lines = []
    for d in runs:
        lines.append(f"# {Path(d['_path']).name}: {d['device']} commit {d['commit']} {d['date']}")
        rows = d["rows"]
        models = sorted({r["model"] for r in rows})
        for model in models:
            for fmt in sorted({r["format"] for r in rows if r["model"] == model}):
                sel = [r for r in rows if r["model"] == model and r["format"] == fmt]
                ms = sorted({r["m"] for r in sel})
                layers = list(dict.fromkeys(r["layer"] for r in sel))
                head = f"{model:18s} {fmt:6s} " + " ".join(f"{'m=' + str(m):>12s}" for m in ms)
                lines.append(head)
                for layer in layers:
                    cells = []
                    for m in ms:
                        r = next((r for r in sel if r["layer"] == layer and r["m"] == m), None)
                        cells.append(f"{r['speedup']:5.2f}x {100 * r['roofline_frac']:4.0f}%" if r else " " * 12)
                    lines.append(f"{'':18s} {layer:6s} " + " ".join(f"{c:>12s}" for c in cells))
                avg = []
                for m in ms:
                    sp = [r["speedup"] for r in sel if r["m"] == m]
                    avg.append(f"{statistics.mean(sp):5.2f}x avg")
                lines.append(f"{'':18s} {'avg':6s} " + " ".join(f"{c:>12s}" for c in avg))
    return "\n".join(lines)


def readme_table(runs):
    """Compact table: one row per (layer, format), speedup and % of the 4.25 TB/s copy roofline per m."""
    out = []
    for d in runs:
        rows = d["rows"]
        ms = sorted({r["m"] for r in rows})
        models = sorted({r["model"] for r in rows})
        out.append(f"**{', '.join(models)}** on {d['device']}, commit `{d['commit']}`, {d['date']} "
                   f"(`{Path(d['_path']).as_posix()}`). Per-call time inside CUDA graphs with cold weights; "
                   "cell = speedup over cuBLASLt BF16 measured in the same run / FP4 weight bytes (codes + "
                   "scales) per second as % of the 4.25 TB/s copy roofline.")
        out.append("")
        out.append("| layer | N x K | format | " + " | ".join(f"m={m}" for m in ms) + " |")
        out.append("|---|---|---|" + "---:|" * len(ms))
        for model in models:
            for fmt in ("nvfp4", "mxfp4"):
                for layer in dict.fromkeys(r["layer"] for r in rows if r["model"] == model):
                    sel = {r["m"]: r for r in rows if r["model"] == model and r["layer"] == layer and r["format"] == fmt}
                    if not sel:
                        continue
                    any_r = next(iter(sel.values()))
                    cells = [f"{sel[m]['speedup']:.2f}x / {100 * sel[m]['roofline_frac']:.0f}%" if m in sel else ""
                             for m in ms]
                    out.append(f"| {layer} | {any_r['n']} x {any_r['k']} | {fmt} | " + " | ".join(cells) + " |")
                avg = [statistics.mean(r["speedup"] for r in rows if r["model"] == model and r["format"] == fmt
                                       and r["m"] == m) for m in ms]
                out.append(f"| **average** | | {fmt} | " + " | ".join(f"**{a:.2f}x**" for a in avg) + " |")
        out.append("")
    return "\n".join(out)


def update_readme(path, table):
    text = Path(path).read_text()
    b, e = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
    if b not in text or e not in text:
        sys.exit(f"{path}: markers {b} / {e} not found")
    head, rest = text.split(b, 1)
    _, tail = rest.split(e, 1)
    Path(path).write_text(head + b + "\n" + table + "\n" + e + tail)


def plot(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for d in runs:
        rows = d["rows"]
        for model in sorted({r["model"] for r in rows}):
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for fmt, style in (("nvfp4", "-o"), ("mxfp4", "--s")):
                for layer in dict.fromkeys(r["layer"] for r in rows if r["model"] == model):
                    sel = sorted((r for r in rows if r["model"] == model and r["layer"] == layer and r["format"] == fmt),
                                 key=lambda r: r["m"])
                    if sel:
                        ax.plot([r["m"] for r in sel], [r["speedup"] for r in sel], style, label=f"{layer} {fmt}")
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("m (tokens)")
            ax.set_ylabel("speedup over cuBLAS BF16")
            ax.set_title(f"{model}: fp4kit decode GEMM on {d['device']} ({d['commit']})")
            ax.legend(fontsize=7, ncol=2)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            name = outdir / f"speedup_{model}.png"
            fig.savefig(name, dpi=110)
            plt.close(fig)
            print(f"wrote {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--readme")
    ap.add_argument("--plot")
    a = ap.parse_args()
    runs = load(a.json)
    if a.summary:
        print(summary(runs))
    if a.readme:
        update_readme(a.readme, readme_table(runs))
    if a.plot:
        plot(runs, a.plot)


if __name__ == "__main__":
    main()
