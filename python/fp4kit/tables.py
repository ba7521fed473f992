"""Text and Markdown tables of fp4kit's JSON reports (fp4kit.e2e, fp4kit.quality), merging of e2e reports, and
the README writer. Standard library only: ``tools/report.py`` loads this file directly, so the README tables can
be regenerated from committed JSON on a machine without torch or a built fp4kit.

Every number in a table comes from a JSON report; nothing is typed in by hand.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

__all__ = ["e2e_text", "e2e_markdown", "e2e_marker", "merge_e2e", "quality_text", "quality_markdown",
           "update_readme", "E2E_MARKERS", "QUALITY_MARKER"]

#: README marker of each model's end-to-end table (<!-- NAME:begin --> ... <!-- NAME:end -->).
E2E_MARKERS = {"llama-3.1-8b": "e2e-table", "llama-3.3-70b": "e2e-llama70b-table", "gpt-oss-120b": "e2e-gptoss-table"}
QUALITY_MARKER = "quality-table"


def update_readme(path: str, marker: str, block: str) -> None:
    """Replace what lies between the README's <!-- marker:begin --> and <!-- marker:end --> lines by `block`."""
    text = Path(path).read_text()
    b, e = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if b not in text or e not in text:
        raise SystemExit(f"{path}: markers {b} / {e} not found")
    head, rest = text.split(b, 1)
    tail = rest.split(e, 1)[1]
    Path(path).write_text(head + b + "\n" + block + "\n" + e + tail)


# ---- fp4kit.e2e ------------------------------------------------------------------------------------------------
def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def e2e_text(rep: dict) -> str:
    """An fp4kit.e2e report as a fixed-width text table."""
    c = rep["config"]
    lines = [f"device: {rep['device']}   commit: {rep['commit'] or '-'}   {rep['date']}",
             f"prompt {c['prompt']}, gen {c['gen']}, CUDA graph: {c['cuda_graph']}, compile: {c['compile']}; "
             f"kept in BF16: {c.get('kept_bf16', '-')}", "",
             f"{'model':14} {'variant':7} {'layers':>6} {'batch':>5} {'prefill ms':>11} {'decode tok/s':>13} "
             f"{'ms/step':>8} {'peak GiB':>9} {'vs bf16':>8}"]
    for r in rep["rows"]:
        lines.append(f"{r['model']:14} {r['variant']:7} {r['layers']:6d} {r['batch']:5d} {r['prefill_ms']:11.1f} "
                     f"{_f(r['decode_tok_s'], '13.1f')} {_f(r['decode_ms_per_step'], '8.3f')} "
                     f"{_f(r['peak_gib'], '9.2f')} {_f(r['ratio_vs_bf16'], '7.2f')}{'x' if r['ratio_vs_bf16'] else ''}")
    for s in rep["skipped"]:
        lines.append(f"skipped: {s['model']} {s['variant']} layers {s['layers']} batch {s['batch'] or 'all'}: "
                     f"{s['reason']}")
    return "\n".join(lines)


def _short_reason(reason: str) -> str:
    """The first sentence of a skip reason (the fit rule's advice is in the JSON)."""
    return reason.split(". Rule:")[0].split(" Rule:")[0].rstrip(".")


def e2e_markdown(rep: dict) -> str:
    """An fp4kit.e2e report as a Markdown table: one line per model, depth and batch, the variants' decode
    tokens/s side by side with their ratio to BF16 at the same depth and batch; then the report's notes and
    what was skipped, if anything."""
    c = rep["config"]
    variants = list(dict.fromkeys(r["variant"] for r in rep["rows"]))
    head = "| model | layers | batch | prefill ms (" + " / ".join(variants) + ") | " + \
        " | ".join(f"{v} tok/s" for v in variants) + " | peak GiB (" + " / ".join(variants) + ") |"
    lines = [f"**fp4kit.e2e** on {rep['device']}, commit `{rep['commit'] or '-'}`, {rep['date']}: prompt "
             f"{c['prompt']}, {c['gen']} generated tokens, decode step in a CUDA graph: "
             f"{c['cuda_graph']}. Kept in BF16: {c.get('kept_bf16', '-')}.", "", head,
             "|---|---:|---:|---:|" + "---:|" * len(variants) + "---:|"]
    groups = dict.fromkeys((r["model"], r["layers"], r["batch"]) for r in rep["rows"])
    for key in groups:
        by = {r["variant"]: r for r in rep["rows"] if (r["model"], r["layers"], r["batch"]) == key}

        def cell(v):
            r = by.get(v)
            if r is None or r["decode_tok_s"] is None:
                return "-"
            ratio = f" ({r['ratio_vs_bf16']:.2f}x)" if r["ratio_vs_bf16"] and v != "bf16" else ""
            return f"{r['decode_tok_s']:.0f}{ratio}"
        pre = " / ".join(f"{by[v]['prefill_ms']:.0f}" if v in by else "-" for v in variants)
        peak = " / ".join(f"{by[v]['peak_gib']:.1f}" if v in by and by[v]["peak_gib"] is not None else "-"
                          for v in variants)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {pre} | " + " | ".join(cell(v) for v in variants)
                     + f" | {peak} |")
    notes = list(c.get("notes", []))
    for s in rep.get("skipped", []):
        notes.append(f"not measured: {s['model']} {s['variant']} at {s['layers']} layers"
                     f"{', batch ' + str(s['batch']) if s['batch'] else ''}: {_short_reason(s['reason'])}")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def e2e_marker(rep: dict) -> str:
    """The README marker of a report's table (by its first model)."""
    model = rep["rows"][0]["model"] if rep["rows"] else next(iter(rep["config"]["models"]), "")
    return E2E_MARKERS.get(model, "e2e-table")


def merge_e2e(reps: Sequence[dict]) -> dict:
    """One report from several fp4kit.e2e reports of the same prompt/gen (e.g. the steps of one large run):
    rows and skips concatenated (a skip that another part measured is dropped), ratios to BF16 recomputed over
    all rows at the same model, depth and batch, commits and dates kept per part."""
    if not reps:
        raise ValueError("merge: no reports")
    for r in reps:
        if r.get("tool") != "fp4kit.e2e":
            raise ValueError(f"merge: not an fp4kit.e2e report (tool {r.get('tool')!r})")
    c0 = reps[0]["config"]
    for r in reps[1:]:
        for k in ("prompt", "gen", "cuda_graph", "compile", "seed"):
            if r["config"].get(k) != c0.get(k):
                raise ValueError(f"merge: config {k} differs ({r['config'].get(k)!r} vs {c0.get(k)!r})")
    rows = [dict(x) for r in reps for x in r["rows"]]
    seen = {(x["model"], x["variant"], x["layers"], x["batch"]) for x in rows}
    skipped = [s for r in reps for s in r["skipped"]
               if not (s["batch"] is not None and (s["model"], s["variant"], s["layers"], s["batch"]) in seen)]
    base = {(x["model"], x["layers"], x["batch"]): x["decode_tok_s"] for x in rows if x["variant"] == "bf16"}
    for x in rows:
        ref = base.get((x["model"], x["layers"], x["batch"]))
        x["ratio_vs_bf16"] = round(x["decode_tok_s"] / ref, 3) if ref and x["decode_tok_s"] else None
    commits = list(dict.fromkeys(r["commit"] or "-" for r in reps))
    config = dict(c0)
    config["models"] = {}
    config["notes"] = []
    config["variants"] = list(dict.fromkeys(v for r in reps for v in r["config"]["variants"]))
    config["batches"] = sorted({b for r in reps for b in r["config"]["batches"]})
    for r in reps:
        for name, m in r["config"]["models"].items():
            config["models"].setdefault(name, m)
        for n in r["config"].get("notes", []):
            if n not in config["notes"]:
                config["notes"].append(n)
    devices = list(dict.fromkeys(r["device"] for r in reps))
    return {"tool": "fp4kit.e2e", "device": " / ".join(devices), "commit": " / ".join(commits),
            "date": max(r["date"] for r in reps), "config": config, "rows": rows, "skipped": skipped,
            "parts": [{"commit": r["commit"], "date": r["date"], "step": r["config"].get("step"),
                       "partial": r.get("partial", False)} for r in reps]}


# ---- fp4kit.quality --------------------------------------------------------------------------------------------
def quality_text(rep: dict) -> str:
    """An fp4kit.quality report as text."""
    lines = [f"model:  {rep['model']}", f"text:   {rep['text']}: first {rep['tokens']} tokens, "
             f"windows of {rep['window']} ({rep['windows']})",
             f"device: {rep['device']} ({rep['device_name']}), engine {rep['engine']}"
             + (f", commit {rep['commit']}" if rep.get("commit") else ""),
             f"FP4:    {rep['quantized']}; kept in BF16: {rep['kept_bf16']}",
             f"prompt: {rep['prompt']!r} (greedy, {rep['gen_tokens']} tokens)", "",
             f"{'variant':8} {'ppl':>8} {'vs bf16':>8}  generated"]
    for r in rep["rows"]:
        lines.append(f"{r['variant']:8} {r['ppl']:8.3f} {r['ratio']:8.3f}  {r['generated']!r}")
    lines.append(f"\ntotal {rep['seconds']} s")
    return "\n".join(lines)


def _md_text(s: str) -> str:
    """Generated text in a Markdown table cell: newlines shown as the two characters \\n, pipes escaped."""
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "\\r").replace("\n", "\\n").replace("`", "'")


def _engine(rep: dict) -> str:
    if rep["engine"] == "numpy":
        return ("CPU numpy reference path (float32 numpy, multiplying by exactly the weights fp4kit's GEMM "
                "multiplies by; not the GPU kernels)")
    if rep["device"].startswith("cuda"):
        return (f"{rep['device_name']}, GPU: the FP4 variants through fp4kit's CUDA kernels (fp4kit.nn.Linear, "
                f"torch.ops.fp4kit.gemm), BF16 through torch (cuBLAS)")
    return "CPU, torch engine (fp4kit's torch operators on their CPU reference)"


def quality_markdown(reps: Sequence[dict], sources: Optional[Sequence[str]] = None) -> str:
    """fp4kit.quality reports as Markdown: per report a line saying what computed it (GPU kernels or the CPU
    numpy reference), then perplexity, ratio to BF16 and the greedy continuation of each variant."""
    out: List[str] = []
    if not any(r["engine"] != "numpy" for r in reps):
        out += ["**GPU (fp4kit's CUDA kernels)**: not measured yet; `tools/gpu-quality` writes "
                "`bench/results/quality.json` on a GPU machine.", ""]
    for i, rep in enumerate(reps):
        src = f" (`{sources[i]}`)" if sources else ""
        commit = f", commit `{rep['commit']}`" if rep.get("commit") else ""
        out.append(f"**{_engine(rep)}**{commit}, {rep['date']}{src}. {rep['model']}; perplexity on the first "
                   f"{rep['tokens']} tokens of `{Path(rep['text']).name}` in windows of {rep['window']}; greedy "
                   f"continuation ({rep['gen_tokens']} tokens at most) of \"{_md_text(rep['prompt'])}\".")
        out += ["", "| variant | perplexity | vs BF16 | greedy continuation |", "|---|---:|---:|---|"]
        for r in rep["rows"]:
            out.append(f"| {r['variant']} | {r['ppl']:.2f} | {r['ratio']:.3f} | {_md_text(r['generated'])} |")
        out.append("")
    if reps:
        out.append(f"FP4: {reps[0]['quantized']}; kept in BF16: {reps[0]['kept_bf16']}.")
    return "\n".join(out).rstrip("\n")


def load(paths: Iterable[str]) -> List[dict]:
    out = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        d["_path"] = str(p)
        out.append(d)
    return out


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def write_json(path: str, rep: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(_strip(rep), indent=2) + "\n")
