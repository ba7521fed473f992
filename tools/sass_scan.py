#!/usr/bin/env python3
"""tools/sass_scan.py: global loads whose result an instruction reads soon after, per kernel, from SASS.

    cuobjdump -sass build/tools/fp4kit-bench | tools/sass_scan.py - [--kernel REGEX] [--window N] [--copies-only]
    tools/sass_scan.py FILE.sass --kernel decode_gemm

A load whose destination registers are read within a few instructions makes the warp wait for memory
right there. In a streaming kernel that is where the latency is meant to be hidden, so such a read is
either the intended first use (the end of a pipeline stage) or an accident of register allocation: a
loop-carried value merged from two paths (a conditional load, an early loop exit) makes ptxas copy the
freshly loaded registers into the loop-carried ones at once (`IMAD.MOV.U32 R63, RZ, RZ, R55` two
instructions after `LDG.E.128 R52`). The decode kernel lost ~8% of its warps' time at m = 16 to one such
copy (docs/decode-gemm-notes.md, v16); `--copies-only` lists just that signature.

Reads are looked for in the next `--window` instructions (default 12), up to an unconditional jump or
exit (what follows it in the text is another path); a register written again before it is read no
longer counts. Prints one block per kernel with hits and a last line `sass_scan: H early reads
(C copies) after L global loads in K kernels`. Exit status 0 (it reports, it does not judge).
"""
import argparse
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
INST = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
PRED = re.compile(r"^@!?U?P[T0-9]+\s+")
REG = re.compile(r"(?<![A-Z0-9_.])R(\d+)((?:\.64)?)")
# Opcodes whose first operand is read, not written.
NO_DEST = ("ST", "RED", "BRA", "BAR", "EXIT", "RET", "CALL", "JMP", "BSYNC", "BSSY", "MEMBAR", "WARPSYNC",
           "LDGSTS", "SYNCS", "DEPBAR", "ERRBAR", "CCTL", "NOP", "YIELD")
COPY = ("MOV", "IMAD.MOV")


def regs_of(operand):
    """Register numbers an operand names (R4.64 names R4 and R5; RZ and uniform registers name none)."""
    out = set()
    for n, wide in REG.findall(operand):
        out.update(range(int(n), int(n) + (2 if wide else 1)))
    return out


def split(inst):
    """(opcode, dest registers, source registers) of one SASS instruction."""
    body = PRED.sub("", inst)
    op, _, rest = body.partition(" ")
    ops = [o.strip() for o in rest.split(",")] if rest.strip() else []
    dest, srcs = set(), set()
    for i, o in enumerate(ops):
        first = re.match(r"^R(\d+)", o) if i == 0 and not op.startswith(NO_DEST) else None
        if first:  # the destination: a load's width says how many registers it fills
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            dest = set(range(int(first.group(1)), int(first.group(1)) + width))
        else:
            srcs |= regs_of(o)
    return op, dest, srcs


def parse(lines):
    """{kernel: [instruction text]} from cuobjdump -sass output."""
    kernels, cur = {}, None
    for line in lines:
        m = FUNC.search(line)
        if m:
            cur = m.group(1)
            kernels[cur] = []
            continue
        m = INST.search(line)
        if m and cur is not None:
            kernels[cur].append(m.group(1).strip())
    return kernels


def scan(insts, window):
    """[(index, load, distance, reader, is_copy)] for global loads read within `window` instructions."""
    hits, loads = [], 0
    parsed = [split(s) for s in insts]
    for i, (op, dest, _) in enumerate(parsed):
        if not op.startswith("LDG") or not dest:
            continue
        loads += 1
        watch = set(dest)
        for j in range(i + 1, min(len(parsed), i + 1 + window)):
            op2, dest2, srcs2 = parsed[j]
            if watch & srcs2:
                hits.append((i, insts[i], j - i, insts[j], op2.startswith(COPY)))
                break
            watch -= dest2
            # The text after an unconditional jump or exit belongs to another path.
            if not watch or (op2.startswith(("BRA", "JMP", "EXIT", "RET")) and not PRED.match(insts[j])):
                break
    return hits, loads


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output ('-': stdin)")
    ap.add_argument("--kernel", default="", help="only kernels whose (mangled) name matches this regex")
    ap.add_argument("--window", type=int, default=12, help="instructions after a load to look in (default 12)")
    ap.add_argument("--copies-only", action="store_true", help="only reads that copy the loaded registers")
    a = ap.parse_args(argv)
    if a.window < 1:
        ap.error(f"--window must be >= 1 (got {a.window})")
    text = sys.stdin if a.sass == "-" else open(a.sass, encoding="utf-8", errors="replace")
    kernels = parse(text)
    pat = re.compile(a.kernel)
    total = copies = nloads = nk = 0
    for name, insts in kernels.items():
        if not pat.search(name):
            continue
        nk += 1
        hits, loads = scan(insts, a.window)
        nloads += loads
        hits = [h for h in hits if h[4] or not a.copies_only]
        if not hits:
            continue
        print(name)
        for i, load, dist, reader, is_copy in hits:
            print(f"  {i:6d} {load[:64]:64s} -> +{dist} {'COPY ' if is_copy else ''}{reader[:60]}")
        total += len(hits)
        copies += sum(1 for h in hits if h[4])
    print(f"sass_scan: {total} early reads ({copies} copies) after {nloads} global loads in {nk} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
