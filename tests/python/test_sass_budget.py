"""tools/sass_budget.py on a synthetic Nsight Compute source CSV: opcodes summed over lines (predicates
dropped, modifiers kept), counts per unit of the anchor opcode, the kernel-name line before the header
skipped, gzip or plain input, and a clear failure without the anchor. Standard library only."""
import csv
import gzip
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sass_budget  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
LINES = [
    ["0x0", "      LDC R1, c[0x0][0x28]", "3", "10"],
    ["0x10", "      LOP3.LUT R95, R19, 0x81c081c0, RZ, 0xc0, !PT", "1", "400"],
    ["0x20", "@!P1  LOP3.LUT R9, R19, 0x81c081c0, RZ, 0xc0, !PT", "1", "100"],
    ["0x30", "      HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR16], R24", "2", "80"],
    ["0x40", "      HMUL2.BF16_V2 R1, R2, R3", "0", "320"],
    ["0x50", "@!P0  BRA 0x7f9bb37f5c40", "5", "90"],
    ["0x58", "      LOP3.LUT R9, R9, 0x1, RZ, 0xc0, !PT", "0", "1,000"],
    ["0x60", "", "0", ""],
]


def write(path, rows, gz):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "void k()"])
    w.writerow(HEADER)
    w.writerows(rows)
    data = buf.getvalue()
    if gz:
        with gzip.open(path, "wt", newline="") as f:
            f.write(data)
    else:
        path.write_text(data)


def test_counts_per_opcode():
    counts = sass_budget.budget(csv.reader(io.StringIO("\n".join(",".join(f'"{c}"' for c in r) for r in [HEADER] + LINES))))
    assert counts["LOP3.LUT"] == 1500  # predicated and unpredicated lines, digits grouped or not
    assert counts["HGMMA.64x64x16.F32.BF16"] == 80 and counts["HMUL2.BF16_V2"] == 320
    assert counts["BRA"] == 90 and counts["LDC"] == 10 and "" not in counts


def test_per_unit_output(tmp_path, capsys):
    p = tmp_path / "s.csv.gz"
    write(p, LINES, gz=True)
    assert sass_budget.main([str(p), "--per", "HGMMA", "--scale", "8"]) == 0
    out = capsys.readouterr().out
    # 2000 instructions over 80 HGMMA = 10 units of 8: 200 per unit; LOP3 150, HMUL2 32, BRA 9.
    assert "2000 warp instructions, 80 HGMMA*: 200.0 per unit" in out
    assert [l.split()[-1] for l in out.splitlines() if "LOP3.LUT" in l or "HMUL2" in l] == ["150.0", "32.0"]
    assert any(l.split()[0] == "BRA" and l.split()[-1] == "9.0" for l in out.splitlines()[1:])


def test_plain_csv_and_missing_anchor(tmp_path, capsys):
    p = tmp_path / "s.csv"
    write(p, [r for r in LINES if "HGMMA" not in r[1]], gz=False)
    assert sass_budget.main([str(p)]) == 1
    assert "no HGMMA instruction executed" in capsys.readouterr().err
    assert sass_budget.main([str(p), "--per", "LOP3", "--scale", "1"]) == 0
    assert "1500 LOP3*: 1.3 per unit" in capsys.readouterr().out  # 1920 / 1500


def test_no_header_is_an_error():
    try:
        sass_budget.budget(csv.reader(io.StringIO('"a","b"\n"1","2"\n')))
    except ValueError as e:
        assert "Instructions Executed" in str(e)
    else:
        raise AssertionError("a CSV without the columns must be rejected")
