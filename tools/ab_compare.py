#!/usr/bin/env python3
"""Compare the JSON of an A/B run (tools/ab-bench): per row, the median us over the rounds of each side and
head / base; last, the geometric mean of head / base over the rows both sides have.

    tools/ab_compare.py DIR/ab_base_r1.json DIR/ab_head_r1.json DIR/ab_base_r2.json ...

A file is the base side if its name starts with "ab_base", the head side if with "ab_head". Rows match on
their identity fields (op, model, layer, format, act, m, T, config: those a row has), so fp4kit-bench and
fp4kit-bench-moe JSON both work. A dispatch row ("dispatch": true) matches on the shape whatever config each
side picked: the label shows the base's pick, or "base->head" where the picks differ. Standard library only.
"""
import json
import math
import statistics
import sys
from pathlib import Path

KEY_FIELDS = ("op", "model", "layer", "format", "act", "m", "T", "config")


def row_key(row):
    return tuple((f, "*" if f == "config" and row.get("dispatch") is True else row[f]) for f in KEY_FIELDS if f in row)


def collect(paths):
    """{side: {key: [us, ...]}}, {side: commit} and {side: {key: config}} (the dispatch rows' picks) from the
    files of an A/B run."""
    times = {"base": {}, "head": {}}
    picks = {"base": {}, "head": {}}  # the config of each side's dispatch rows
    commits = {}
    for p in paths:
        name = Path(p).name
        side = "base" if name.startswith("ab_base") else "head" if name.startswith("ab_head") else None
        if side is None:
            raise SystemExit(f"ab_compare: {p}: the file name must start with ab_base or ab_head")
        try:
            d = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"ab_compare: {p}: cannot read it as JSON ({e})")
        commits.setdefault(side, d.get("commit", "?"))
        for r in d.get("rows", []):
            times[side].setdefault(row_key(r), []).append(float(r["us"]))
            if r.get("dispatch") is True and "config" in r:
                picks[side].setdefault(row_key(r), r["config"])
    return times, commits, picks


def label(key, picks):
    """The row's identity for the table; a dispatch row's config is the pick (base->head where they differ)."""
    out = []
    for f, v in key:
        if f == "op":
            continue
        if f == "config" and v == "*":
            b, h = picks["base"].get(key, "?"), picks["head"].get(key, "?")
            v = b if b == h else f"{b}->{h}"
        out.append(str(v))
    return " ".join(out)


def compare(times):
    """[(key, base median, head median, head / base)] for the rows both sides have, in the base's order."""
    out = []
    for key, base in times["base"].items():
        head = times["head"].get(key)
        if head:
            b, h = statistics.median(base), statistics.median(head)
            out.append((key, b, h, h / b if b > 0 else float("nan")))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip())
        return 2
    times, commits, picks = collect(argv[1:])
    rows = compare(times)
    if not rows:
        print("ab_compare: no row appears on both sides")
        return 1
    print(f"base {commits.get('base', '?')}  head {commits.get('head', '?')}  (us: median over rounds)")
    for key, b, h, ratio in rows:
        print(f"{label(key, picks):60s} {b:10.1f} {h:10.1f}  {ratio:6.3f}")
    ratios = [r for *_, r in rows if r > 0 and math.isfinite(r)]
    gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean head / base over {len(ratios)} rows: {gmean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
