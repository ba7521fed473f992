#!/usr/bin/env python3
"""tools/sass_budget.py: where a kernel's issue slots go, per unit of work, from Nsight Compute's SASS counts.

    tools/sass_budget.py sass_<suite>_<layer>_m<M>.csv.gz [--per HGMMA] [--scale 8] [--top 30]

Reads the per-instruction CSV that tools/profile-decode writes (the "Source" and "Instructions Executed"
columns of `ncu --page source --csv`), sums the warp-level executed count of every opcode (the predicate
dropped, the modifiers kept: `HGMMA.64x64x16.F32.BF16` and `HMUL2.BF16_V2` are rows of their own), and
prints each opcode's count per `--scale` executions of the anchor opcode `--per` (a prefix; default HGMMA,
scale 8: per ring stage of the wgmma prefill kernel, 2 chunks x 4 k16 steps per warp). With the prefill
kernel at m = 64 this gave 232 instructions per warp and stage, 127 of them dequantisation
(docs/prefill-notes.md). Standard library only.
"""
import argparse
import collections
import csv
import gzip
import sys

from sass_scan import split  # one SASS line -> (opcode without its predicate, dest registers, sources)


def budget(rows):
    """{opcode: warp-level executed count} from the CSV's rows (a header row first)."""
    rows = iter(rows)
    for header in rows:
        if "Source" in header and "Instructions Executed" in header:
            break
    else:
        raise ValueError("no header with 'Source' and 'Instructions Executed' columns")
    src, cnt = header.index("Source"), header.index("Instructions Executed")
    counts = collections.Counter()
    for r in rows:
        if len(r) <= max(src, cnt) or not r[cnt].strip():
            continue
        op = split(r[src].strip())[0]
        if op:
            counts[op] += int(float(r[cnt].replace(",", "")))  # ncu may group digits
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="the SASS CSV of tools/profile-decode (.csv or .csv.gz)")
    ap.add_argument("--per", default="HGMMA", help="anchor opcode prefix (default HGMMA)")
    ap.add_argument("--scale", type=float, default=8.0, help="anchor executions per unit (default 8)")
    ap.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    a = ap.parse_args(argv)
    opener = gzip.open if a.csv.endswith(".gz") else open
    with opener(a.csv, "rt", newline="") as f:
        counts = budget(csv.reader(f))
    anchor = sum(n for op, n in counts.items() if op.startswith(a.per))
    if anchor == 0:
        print(f"sass_budget: no {a.per} instruction executed in {a.csv}", file=sys.stderr)
        return 1
    total = sum(counts.values())
    unit = anchor / a.scale
    print(f"{a.csv}: {total} warp instructions, {anchor} {a.per}*: {total / unit:.1f} per unit "
          f"({a.scale:g} {a.per}*)")
    for op, n in counts.most_common(a.top):
        print(f"  {op:34s} {n:12d} {n / unit:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
