"""tools/sass_scan.py on synthetic cuobjdump output: a copy of freshly loaded registers is found and marked,
a read past the window or after the register is written again is not, wide loads and register pairs
count every register they name, uniform registers and RZ name none, --kernel and --copies-only filter.
Standard library only."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TOOL = ROOT / "tools" / "sass_scan.py"
sys.path.insert(0, str(ROOT / "tools"))
import sass_scan  # noqa: E402


def line(addr, inst):
    return f"        /*{addr:04x}*/                   {inst} ;                /* 0x0000000000000000 */\n"


def function(name, insts):
    return f"\t\tFunction : {name}\n" + "".join(line(16 * i, s) for i, s in enumerate(insts))


# Kernel A: a 128-bit load copied two instructions later (the register-allocation accident), then a
# 32-bit load whose first read is 13 instructions on (outside the default window).
KERNEL_A = function("_Z7kernelA", [
    "LDG.E.NA.128.CONSTANT R52, desc[UR12][R54.64]",
    "UIADD3 UR20, UR18, 0x4, URZ",
    "IMAD.MOV.U32 R63, RZ, RZ, R55",
    "LDG.E R8, desc[UR4][R2.64]",
    *["NOP"] * 12,
    "FADD R9, R8, R8",
])
# Kernel B: the loaded register written again before it is read; a load read through a register pair
# is not a read of the pair's registers unless they were loaded; uniform UR52 is not R52.
KERNEL_B = function("_Z7kernelB", [
    "@!P1 LDG.E.64 R20, desc[UR4][R4.64]",
    "MOV R20, R9",
    "MOV R21, R9",
    "FADD R1, R20, R21",
    "LDG.E.128 R40, desc[UR4][R6.64]",
    "ULEA UR52, UR43, UR41, 0x1",
    "HMUL2.BF16_V2 R50, R53, R43.reuse.H0_H0",
])
# Kernel C: the text after an unconditional branch is another path (its copy is not a read of this
# load); a predicated branch may fall through, so the read after it counts.
KERNEL_C = function("_Z7kernelC", [
    "LDG.E.128 R4, desc[UR6][R20.64]",
    "BRA 0x11f0",
    "IMAD.MOV.U32 R3, RZ, RZ, R7",
    "LDG.E R8, desc[UR6][R22.64]",
    "@P0 BRA 0x1200",
    "IMAD.MOV.U32 R9, RZ, RZ, R8",
])
SASS = KERNEL_A + KERNEL_B + KERNEL_C


def test_parse_reads_functions_and_instructions():
    k = sass_scan.parse(SASS.splitlines(True))
    assert list(k) == ["_Z7kernelA", "_Z7kernelB", "_Z7kernelC"]
    assert k["_Z7kernelA"][0] == "LDG.E.NA.128.CONSTANT R52, desc[UR12][R54.64]"
    assert len(k["_Z7kernelB"]) == 7


def test_split_dest_and_sources():
    op, dest, srcs = sass_scan.split("@!P0 LDG.E.NA.128.CONSTANT R52, desc[UR12][R54.64+0x200]")
    assert op == "LDG.E.NA.128.CONSTANT" and dest == {52, 53, 54, 55} and srcs == {54, 55}
    op, dest, srcs = sass_scan.split("STG.E desc[UR4][R2.64], R7")
    assert dest == set() and srcs == {2, 3, 7}
    _, dest, srcs = sass_scan.split("IMAD.MOV.U32 R63, RZ, RZ, UR55")
    assert dest == {63} and srcs == set()


def test_copy_after_load_is_found_and_marked():
    k = sass_scan.parse(SASS.splitlines(True))
    hits, loads = sass_scan.scan(k["_Z7kernelA"], 12)
    assert loads == 2
    assert [(h[0], h[2], h[4]) for h in hits] == [(0, 2, True)]


def test_window_bounds_the_search():
    k = sass_scan.parse(SASS.splitlines(True))
    hits, _ = sass_scan.scan(k["_Z7kernelA"], 13)
    assert [(h[0], h[2], h[4]) for h in hits] == [(0, 2, True), (3, 13, False)]


def test_overwritten_register_and_uniform_names_do_not_count():
    k = sass_scan.parse(SASS.splitlines(True))
    hits, loads = sass_scan.scan(k["_Z7kernelB"], 12)
    assert loads == 2
    # R20/R21 are written again before FADD reads them; R40..R43: HMUL2 reads R43 (a real early read).
    assert [(h[0], h[2]) for h in hits] == [(4, 2)]


def test_unconditional_branch_ends_the_path():
    k = sass_scan.parse(SASS.splitlines(True))
    hits, loads = sass_scan.scan(k["_Z7kernelC"], 12)
    assert loads == 2
    assert [(h[0], h[2], h[4]) for h in hits] == [(3, 2, True)]


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], input=SASS, capture_output=True, text=True)


def test_cli_filters_and_summary():
    r = run("-", "--copies-only")
    assert r.returncode == 0
    assert "_Z7kernelA" in r.stdout and "_Z7kernelB" not in r.stdout and "COPY IMAD.MOV" in r.stdout
    assert r.stdout.strip().endswith("sass_scan: 2 early reads (2 copies) after 6 global loads in 3 kernels")
    r = run("-", "--kernel", "kernelB")
    assert "_Z7kernelA" not in r.stdout
    assert r.stdout.strip().endswith("sass_scan: 1 early reads (0 copies) after 2 global loads in 1 kernels")


def test_cli_rejects_a_bad_window():
    r = run("-", "--window", "0")
    assert r.returncode == 2 and "--window must be >= 1 (got 0)" in r.stderr
