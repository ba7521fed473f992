#!/usr/bin/env python3
"""Turn fp4kit's JSON reports into the summary tables, the README tables and PNG plots.

    tools/report.py bench/results/decode_*.json [--summary] [--readme README.md] [--plot DIR]
    tools/report.py bench/results/prefill_llama70b.json [--summary] [--readme README.md] [--plot DIR]
    tools/report.py bench/results/moe.json [--summary] [--readme README.md] [--plot DIR]   (fp4kit-bench-moe)
    tools/report.py bench/results/e2e_*.json [--summary] [--readme README.md]              (python -m fp4kit.e2e)
    tools/report.py bench/results/quality*.json [--summary] [--readme README.md]           (python -m fp4kit.quality)
    tools/report.py --merge bench/results/e2e_llama70b.json bench/results/e2e_llama70b-*.json   (join e2e steps)
    tools/report.py --dispatch-check bench/results/cfg_*.json   (--config all sweeps: dispatch's pick against the
                                                                  fastest config; exit 1 past issue 5's 5%)

fp4kit-bench runs that time the prefill kernel (the llama70b-prefill suite, m up to 16384) get a decode + prefill
layout in the perf-table (best decode config, best prefill config and dispatch's pick per layer, format and m; the
targets of the prefill work under --summary) and a plot prefill_speedup_<model>.png of speedup vs m per layer
(decode, prefill, dispatch); decode-only runs keep the decode layout and speedup_<model>.png.

Each report goes to its own README markers: perf-table (sm80-table for runs dispatched as an sm_80-89 device,
fp4kit-bench --as-cc 8), moe-table, e2e-table (Llama-3.1-8B),
e2e-llama70b-table, e2e-gptoss-table, quality-table (GPU runs first, then the CPU reference). The e2e and quality
tables come from python/fp4kit/tables.py, loaded from its file: no torch and no built fp4kit are needed.
Every number comes from the JSON files; nothing is typed in by hand.
"""
import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path


def steady_note(d):
    """', after a warm-up of the same calls (steady clocks)' when the JSON's method says so."""
    return ", after a warm-up of the same calls (steady clocks)" if "steady clocks" in d.get("method", "") else ""


def _tables():
    """python/fp4kit/tables.py as a module of its own (it imports only the standard library)."""
    path = Path(__file__).resolve().parent.parent / "python" / "fp4kit" / "tables.py"
    spec = importlib.util.spec_from_file_location("fp4kit_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(paths):
    """Each run's rows: `rows` keeps only what dispatch picks (a --config all sweep also times the others),
    `all_rows` everything."""
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        d["_path"] = str(p)
        if d.get("tool") in ("fp4kit.e2e", "fp4kit.quality"):
            runs.append(d)
            continue
        d["all_rows"] = d["rows"]
        d["rows"] = [r for r in d["rows"] if r.get("dispatch", True)]
        runs.append(d)
    return runs


def kernel(r):
    """decode or prefill (rows written before the prefill kernel carry no "kernel": decode configs then)."""
    return r.get("kernel") or ("prefill" if r["config"].startswith("p") else "decode")


def has_prefill(d):
    return any(kernel(r) == "prefill" for r in d.get("all_rows", d["rows"]))


def best_by_kernel(d):
    """{(model, layer, format, m): {"decode": row, "prefill": row, "dispatch": row}}: the fastest row of each
    kernel among the configs timed, and dispatch's pick."""
    out = {}
    for r in d["all_rows"]:
        cell = out.setdefault((r["model"], r["layer"], r["format"], r["m"]), {})
        kk = kernel(r)
        if kk not in cell or r["us"] < cell[kk]["us"]:
            cell[kk] = r
        if r.get("dispatch", True):
            cell["dispatch"] = r
    return out


# The prefill work's targets (speedup of what dispatch picks over cuBLAS BF16, per format over the layers).
TARGETS = [([256], 1.10, 1.0), ([1024, 4096, 8192], 0.95, 0.9)]


# Issue 5's dispatch rule: what gemm() picks is never more than 5% slower than the fastest config timed.
DISPATCH_TOLERANCE = 1.05


def dispatch_check(runs, tolerance=DISPATCH_TOLERANCE):
    """(text, worst ratio) over `fp4kit-bench --config all` sweeps: per (model, layer, format, m) timed with two or
    more configs, dispatch's pick against the fastest config; rows past `tolerance` are marked MISS. Points where
    the pick was not timed (another run) are listed as such and count as misses."""
    lines, worst = [], 1.0
    for d in runs:
        by_point = {}
        for r in d["all_rows"]:
            by_point.setdefault((r["model"], r["layer"], r["format"], r["m"]), []).append(r)
        pts = {kk: rs for kk, rs in by_point.items() if len({r["config"] for r in rs}) >= 2}
        lines.append(f"# {Path(d['_path']).name}: commit {d['commit']}, {len(pts)} points with >= 2 configs "
                     f"(dispatch's pick against the fastest)")
        for kk, rs in sorted(pts.items()):
            fast = min(rs, key=lambda r: r["us"])
            pick = [r for r in rs if r.get("dispatch")]
            if not pick:
                lines.append(f"{kk[0]:18s} {kk[1]:8s} {kk[2]:6s} m={kk[3]:<6d} pick not timed           MISS")
                worst = float("inf")
                continue
            ratio = pick[0]["us"] / fast["us"]
            worst = max(worst, ratio)
            mark = "MISS" if ratio > tolerance else ""
            lines.append(f"{kk[0]:18s} {kk[1]:8s} {kk[2]:6s} m={kk[3]:<6d} {pick[0]['config']:24s} {pick[0]['us']:9.1f} "
                         f"fastest {fast['config']:24s} {fast['us']:9.1f} {100 * (ratio - 1):+6.1f}% {mark}")
    lines.append(f"worst: {100 * (worst - 1):+.1f}% (rule: <= {100 * (tolerance - 1):.0f}%)")
    return "\n".join(lines), worst


def prefill_summary(d):
    """Text: per (model, format) the speedup of the best decode config, the best prefill config and dispatch's
    pick per layer and m, then the targets."""
    best = best_by_kernel(d)
    partial = " PARTIAL RUN (complete: false)," if d.get("complete") is False else ""
    lines = [f"# {Path(d['_path']).name}: {d['device']} commit {d['commit']} {d['date']}{partial} (decode / prefill / "
             "dispatch speedup over cuBLAS BF16; D or P: the kernel dispatch picks)"]
    rows = d["all_rows"]
    for model in sorted({r["model"] for r in rows}):
        for fmt in sorted({r["format"] for r in rows if r["model"] == model}):
            ms = sorted({r["m"] for r in rows if r["model"] == model and r["format"] == fmt})
            layers = list(dict.fromkeys(r["layer"] for r in rows if r["model"] == model))
            lines.append(f"{model:18s} {fmt:6s} " + " ".join(f"{'m=' + str(m):>17s}" for m in ms))
            for layer in layers:
                cells = []
                for m in ms:
                    c = best.get((model, layer, fmt, m), {})
                    f = lambda kk: f"{c[kk]['speedup']:4.2f}" if kk in c else "  - "
                    tag = kernel(c["dispatch"])[0].upper() if "dispatch" in c else " "
                    cells.append(f"{f('decode')}/{f('prefill')}/{f('dispatch')}{tag}")
                lines.append(f"{'':18s} {layer:6s} " + " ".join(f"{x:>17s}" for x in cells))
            for target_ms, avg_min, floor in TARGETS:
                for m in target_ms:
                    sp = [c["dispatch"]["speedup"] for (mo, la, fo, mm), c in best.items()
                          if mo == model and fo == fmt and mm == m and "dispatch" in c]
                    if not sp:
                        continue
                    avg, low = statistics.mean(sp), min(sp)
                    ok = "ok" if avg >= avg_min and low >= floor else "MISSED"
                    lines.append(f"{'':18s} target m={m}: average {avg:.2f}x (>= {avg_min:.2f}), lowest {low:.2f}x "
                                 f"(>= {floor:.2f}): {ok}")
    return "\n".join(lines)


def summary(runs):
    lines = []
    for d in runs:
        if has_prefill(d):
            lines.append(prefill_summary(d))
            continue
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


def prefill_readme_table(d):
    """Decode + prefill layout: per (layer, format) the best decode config (speedup / % of the copy
    roofline), the best prefill config (speedup / TFLOP/s) and dispatch's pick (speedup, D or P), per m."""
    best = best_by_kernel(d)
    rows = d["all_rows"]
    ms = sorted({r["m"] for r in rows})
    models = sorted({r["model"] for r in rows})
    as_cc = d.get("as_cc", 9)
    what = ("decode and prefill kernels" if as_cc == 9 else
            f"the sm_80-89 path (dispatch as on a cc {as_cc}.x device: the decode kernel, 64-token blocks past 64, "
            "and the mma.sync prefill kernel; run on this Hopper GPU, against its wgmma cuBLAS)")
    out = [f"**{', '.join(models)}, {what}** on {d['device']}, commit `{d['commit']}`, {d['date']} "
           f"(`{Path(d['_path']).as_posix()}`). Per-call time inside CUDA graphs over rotating weight copies"
           f"{steady_note(d)}; cell = "
           "speedup over cuBLASLt BF16 measured in the same run; decode rows: best decode config / % of the 4.25 TB/s "
           "copy roofline; prefill rows: best prefill config / TFLOP/s; dispatch rows: what gemm() picks "
           "(D: decode, P: prefill).", ""]
    out.append("| layer | N x K | format | kernel | " + " | ".join(f"m={m}" for m in ms) + " |")
    out.append("|---|---|---|---|" + "---:|" * len(ms))
    for model in models:
        for fmt in ("nvfp4", "mxfp4"):
            layers = list(dict.fromkeys(r["layer"] for r in rows if r["model"] == model and r["format"] == fmt))
            if not layers:
                continue
            for layer in layers:
                any_r = next(r for r in rows if r["model"] == model and r["layer"] == layer)
                for kk in ("decode", "prefill", "dispatch"):
                    cells = []
                    for m in ms:
                        r = best.get((model, layer, fmt, m), {}).get(kk)
                        if not r:
                            cells.append("")
                        elif kk == "decode":
                            cells.append(f"{r['speedup']:.2f}x / {100 * r['roofline_frac']:.0f}%")
                        elif kk == "prefill":
                            tf = r.get("tflops", 2.0 * r["m"] * r["n"] * r["k"] / (r["us"] * 1e6))
                            cells.append(f"{r['speedup']:.2f}x / {tf:.0f}")
                        else:
                            cells.append(f"**{r['speedup']:.2f}x** {kernel(r)[0].upper()}")
                    out.append(f"| {layer} | {any_r['n']} x {any_r['k']} | {fmt} | {kk} | " + " | ".join(cells) + " |")
            avg = []
            for m in ms:
                sp = [c["dispatch"]["speedup"] for (mo, la, fo, mm), c in best.items()
                      if mo == model and fo == fmt and mm == m and "dispatch" in c]
                avg.append(f"**{statistics.mean(sp):.2f}x**" if sp else "")
            out.append(f"| **average** | | {fmt} | dispatch | " + " | ".join(avg) + " |")
    out.append("")
    return "\n".join(out)


def readme_table(runs):
    """Compact table: one row per (layer, format), speedup and % of the 4.25 TB/s copy roofline per m (runs
    with the prefill kernel: prefill_readme_table)."""
    out = []
    for d in runs:
        if has_prefill(d):
            out.append(prefill_readme_table(d))
            continue
        rows = d["rows"]
        ms = sorted({r["m"] for r in rows})
        models = sorted({r["model"] for r in rows})
        out.append(f"**{', '.join(models)}** on {d['device']}, commit `{d['commit']}`, {d['date']} "
                   f"(`{Path(d['_path']).as_posix()}`). Per-call time inside CUDA graphs with cold weights"
                   f"{steady_note(d)}; "
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
                sp = [[r["speedup"] for r in rows if r["model"] == model and r["format"] == fmt and r["m"] == m]
                      for m in ms]
                if any(sp):
                    out.append(f"| **average** | | {fmt} | " +
                               " | ".join(f"**{statistics.mean(x):.2f}x**" if x else "" for x in sp) + " |")
        out.append("")
    return "\n".join(out)


MOE_TENSOR_PEAK = 790.0  # TFLOP/s: an H200's BF16 tensor-core ceiling (docs/prefill-plan.md)


def moe_tflops(r):
    """A fused-MoE row's useful TFLOP/s: 2 T top_k (H 2I + I H) / time (computed for rows that predate the field)."""
    if "tflops" in r:
        return r["tflops"]
    return 2.0 * r["T"] * r["top_k"] * (r["H"] * 2 * r["I"] + r["I"] * r["H"]) / (r["us"] * 1e-6) / 1e12


def moe_table(runs):
    """fp4kit-bench-moe runs: one row per (model, format, T), with the weight stream (TB/s, % of 4.25 TB/s: the
    decode measure) and the useful TFLOP/s (% of the 790 TFLOP/s BF16 tensor-core ceiling: the large-T
    measure); with BF16 experts in the run (format bf16), a column with each FP4 row's speedup over them (same
    model and T)."""
    out = []
    for d in runs:
        out.append(f"**fused MoE** on {d['device']}, commit `{d['commit']}`, {d['date']} (`{Path(d['_path']).as_posix()}`). "
                   f"{d['method']}.")
        out.append("")
        vs = any("speedup_vs_bf16" in r for r in d["rows"])
        paths = any("path" in r for r in d["rows"])  # runs since the tensor-core path record which path ran
        extra = (" path |" if paths else "") + (" speedup over bf16 |" if vs else "")
        out.append("| model | E / top-k | H x I | format | T | us / layer | experts touched | TB/s | % of 4.25 TB/s | tokens/s "
                   f"| TFLOP/s (% of {MOE_TENSOR_PEAK:.0f}) |" + extra)
        out.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if paths else "") + ("---:|" if vs else ""))
        for r in d["rows"]:
            cl = r.get("clusters", [0, 0])  # decode path: CTAs per cluster of gate_up / down (0: stream-K)
            path = r.get("path", "").replace("_", " ") + (f" (clusters {cl[0]} / {cl[1]})" if any(cl) else "")
            if r.get("routing") == "logits":  # routed inside the layer; route_us: the routing kernel alone
                path += f" + routing ({r['route_us']:.1f} us alone)" if "route_us" in r else " + routing"
            sp = f" {path} |" if paths else ""
            if vs:
                sp += f" {r['speedup_vs_bf16']:.2f}x |" if "speedup_vs_bf16" in r else " |"
            out.append(f"| {r['model']} | {r['E']} / {r['top_k']} | {r['H']} x {r['I']} | {r['format']} | {r['T']} | "
                       f"{r['us']:.1f} | {r['touched_experts']:.1f} | {r['weight_tbps']:.2f} | "
                       f"{100 * r['roofline_frac']:.0f}% | {r['tokens_per_s']:.0f} | "
                       f"{moe_tflops(r):.1f} ({100 * moe_tflops(r) / MOE_TENSOR_PEAK:.1f}%) |" + sp)
        out.append("")
    return "\n".join(out)


def moe_plot(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for d in runs:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for model in dict.fromkeys(r["model"] for r in d["rows"]):
            for fmt, style in (("mxfp4", "-o"), ("nvfp4", "--s")):
                sel = sorted((r for r in d["rows"] if r["model"] == model and r["format"] == fmt), key=lambda r: r["T"])
                if sel:
                    ax.plot([r["T"] for r in sel], [100 * r["roofline_frac"] for r in sel], style, label=f"{model} {fmt}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("touched expert bytes / time, % of 4.25 TB/s")
        ax.set_title(f"fused MoE, {d['device']} ({d['commit']})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out = outdir / "moe_roofline.png"
        fig.savefig(out, dpi=120)
        plt.close(fig)
        print(f"wrote {out}")


def update_readme(path, table, marker="perf-table"):
    text = Path(path).read_text()
    b, e = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if b not in text or e not in text:
        sys.exit(f"{path}: markers {b} / {e} not found")
    head, rest = text.split(b, 1)
    _, tail = rest.split(e, 1)
    Path(path).write_text(head + b + "\n" + table + "\n" + e + tail)


def plot_prefill(d, outdir, prefix):
    """<prefix>_<model>.png: speedup over cuBLAS BF16 vs m, one panel per (format, layer), with the best
    decode config, the best prefill config and dispatch's pick."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    best = best_by_kernel(d)
    rows = d["all_rows"]
    for model in sorted({r["model"] for r in rows}):
        fmts = [f for f in ("nvfp4", "mxfp4") if any(r["model"] == model and r["format"] == f for r in rows)]
        layers = list(dict.fromkeys(r["layer"] for r in rows if r["model"] == model))
        fig, axes = plt.subplots(len(fmts), len(layers), figsize=(3.6 * len(layers), 3.0 * len(fmts)), squeeze=False,
                                 sharex=True)
        for i, fmt in enumerate(fmts):
            for j, layer in enumerate(layers):
                ax = axes[i][j]
                ms = sorted(mm for (mo, la, fo, mm) in best if mo == model and la == layer and fo == fmt)
                for kk, style, label in (("decode", "-o", "decode (best config)"), ("prefill", "-s", "prefill (best config)"),
                                         ("dispatch", "--", "dispatch")):
                    pts = [(m, best[(model, layer, fmt, m)][kk]["speedup"]) for m in ms
                           if kk in best[(model, layer, fmt, m)]]
                    if pts:
                        kw = dict(lw=2.2, color="black", alpha=0.6) if kk == "dispatch" else dict(ms=3.5)
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, **kw)
                ax.axhline(1.0, color="gray", lw=0.8)
                ax.set_xscale("log", base=2)
                ax.grid(alpha=0.3)
                ax.set_title(f"{layer} {fmt}", fontsize=9)
                if j == 0:
                    ax.set_ylabel("speedup over cuBLAS BF16")
                if i == len(fmts) - 1:
                    ax.set_xlabel("m (tokens)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{model}: fp4kit decode and prefill kernels on {d['device']} ({d['commit']})", fontsize=10)
        fig.tight_layout()
        name = Path(outdir) / f"{prefix}_{model}.png"
        fig.savefig(name, dpi=110)
        plt.close(fig)
        print(f"wrote {name}")


def plot(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for d in runs:
        if has_prefill(d):
            # A decode suite whose m <= 64 rows include the prefill kernel keeps its own file name
            # (speedup_<model>.png); only a *-prefill suite (m up to 16384) draws prefill_speedup_<model>.png.
            prefill_suite = str(d.get("suite", "")).endswith("-prefill")
            plot_prefill(d, outdir, "prefill_speedup" if prefill_suite else "speedup")
            continue
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


def e2e_and_quality(reports, summary_, readme):
    """fp4kit.e2e reports (one README table per model's marker) and fp4kit.quality reports (one table)."""
    t = _tables()
    e2e = [d for d in reports if d.get("tool") == "fp4kit.e2e"]
    quality = sorted((d for d in reports if d.get("tool") == "fp4kit.quality"), key=lambda d: d["engine"] == "numpy")
    by_marker = {}
    for d in e2e:
        by_marker.setdefault(t.e2e_marker(d), []).append(d)
    for marker, ds in by_marker.items():
        if len(ds) > 1:
            sys.exit(f"report: {len(ds)} e2e reports for the README table {marker} "
                     f"({', '.join(d['_path'] for d in ds)}); merge them first (--merge)")
        d = ds[0]
        if summary_:
            print(t.e2e_text(d) + "\n")
        if readme:
            update_readme(readme, t.e2e_markdown(d) + f"\n\n(`{Path(d['_path']).as_posix()}`)", marker)
    if quality:
        if summary_:
            for d in quality:
                print(t.quality_text(d) + "\n")
        if readme:
            update_readme(readme, t.quality_markdown(quality, [Path(d["_path"]).as_posix() for d in quality]),
                          t.QUALITY_MARKER)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--readme")
    ap.add_argument("--plot")
    ap.add_argument("--merge", metavar="OUT", help="join fp4kit.e2e reports (the steps of one large run) into OUT")
    ap.add_argument("--dispatch-check", action="store_true",
                    help="fp4kit-bench --config all sweeps: dispatch's pick against the fastest config per point; "
                         "exit status 1 where one is more than 5%% slower")
    a = ap.parse_args()
    if a.merge:
        t = _tables()
        merged = t.merge_e2e(t.load(a.json))
        t.write_json(a.merge, merged)
        print(f"wrote {a.merge}: {len(merged['rows'])} rows, {len(merged['skipped'])} skipped, from "
              f"{len(a.json)} report(s)")
        return
    runs = load(a.json)
    if a.dispatch_check:
        text, worst = dispatch_check([d for d in runs if d.get("tool") == "fp4kit-bench"])
        print(text)
        sys.exit(1 if worst > DISPATCH_TOLERANCE else 0)
    other = [d for d in runs if d.get("tool") in ("fp4kit.e2e", "fp4kit.quality")]
    moe = [d for d in runs if d.get("tool") == "fp4kit-bench-moe"]
    runs = [d for d in runs if d.get("tool") not in ("fp4kit-bench-moe", "fp4kit.e2e", "fp4kit.quality")]
    if other:
        e2e_and_quality(other, a.summary, a.readme)
    if a.summary:
        if runs:
            print(summary(runs))
        if moe:
            print(moe_table(moe))
    if a.readme:
        # Runs dispatched as an sm_80-89 device (fp4kit-bench --as-cc 8) have a table of their own.
        sm80 = [d for d in runs if d.get("as_cc", 9) != 9]
        runs = [d for d in runs if d.get("as_cc", 9) == 9]
        for d in sm80:
            update_readme(a.readme, prefill_readme_table(d), "sm80-table")
        if runs:
            update_readme(a.readme, readme_table(runs))
        if moe:
            update_readme(a.readme, moe_table(moe), "moe-table")
    if a.plot:
        if runs:
            plot(runs, a.plot)
        if moe:
            moe_plot(moe, a.plot)


if __name__ == "__main__":
    main()
