"""tools/report.py on fp4kit-bench JSON: the decode-only layout stays as it was, runs that time the prefill kernel
get the decode + prefill layout (best decode config, best prefill config, dispatch's pick), the targets under
--summary and the speedup-vs-m plot. Synthetic JSON, standard library (matplotlib only for the plot)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
REPORT = ROOT / "tools" / "report.py"


def _report():
    spec = importlib.util.spec_from_file_location("fp4kit_report", REPORT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(layer, fmt, m, config, kernel, us, cublas_us, dispatch):
    n, k = {"o": (8192, 8192), "down": (8192, 28672)}[layer]
    return {"op": "gemm", "model": "llama-3.3-70b", "layer": layer, "format": fmt, "act": "bf16", "m": m, "n": n,
            "k": k, "config": config, "kernel": kernel, "dispatch": dispatch, "us": us, "cublas_us": cublas_us,
            "speedup": cublas_us / us, "roofline_frac": 0.25, "tflops": 2.0 * m * n * k / (us * 1e6),
            "check_rel_l2": 1e-3}


def _prefill_run(tmp_path):
    rows = []
    for layer in ("o", "down"):
        for fmt in ("nvfp4", "mxfp4"):
            for m in (64, 256, 1024):
                big = m > 64
                rows.append(_row(layer, fmt, m, "m64_r2_w8_b1_c4x2", "decode", 40.0 * max(1, m // 64), 36.0 * max(1, m / 200),
                                 not big))
                rows.append(_row(layer, fmt, m, "p256_w8_s3", "prefill", 45.0 * max(1, m / 256), 36.0 * max(1, m / 200), big))
                rows.append(_row(layer, fmt, m, "p128_w8_s5_k8", "prefill", 30.0 * max(1, m / 256),
                                 36.0 * max(1, m / 200), False))
    path = tmp_path / "prefill.json"
    path.write_text(json.dumps({"tool": "fp4kit-bench", "device": "NVIDIA H200", "sms": 132, "commit": "abc1234",
                                "date": "2026-01-01T00:00:00Z", "suite": "llama70b-prefill", "rows": rows}))
    return path


def test_prefill_layout_and_targets(tmp_path):
    rep = _report()
    runs = rep.load([_prefill_run(tmp_path)])
    d = runs[0]
    assert rep.has_prefill(d) and len(d["rows"]) < len(d["all_rows"])
    best = rep.best_by_kernel(d)
    cell = best[("llama-3.3-70b", "o", "nvfp4", 256)]
    assert cell["prefill"]["config"] == "p128_w8_s5_k8"  # the fastest prefill row, not dispatch's
    assert cell["dispatch"]["config"] == "p256_w8_s3" and cell["decode"]["kernel"] == "decode"
    table = rep.readme_table(runs)
    for kk in ("| decode |", "| prefill |", "| dispatch |", "| **average** | | nvfp4 | dispatch |"):
        assert kk in table
    assert "**1.02x** P" in table  # m = 256: 36 * 1.28 / 45, and dispatch's kernel letter
    text = rep.summary(runs)
    assert "target m=256: average" in text and "target m=1024: average" in text


def test_decode_runs_keep_their_layout(tmp_path):
    rep = _report()
    rows = [_row("o", "nvfp4", m, "m8_r1_w8_b3_c8x1", "decode", 20.0, 35.0, True) for m in (1, 2)]
    for r in rows:
        del r["kernel"]  # JSON written before the prefill kernel
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"tool": "fp4kit-bench", "device": "NVIDIA H200", "commit": "abc", "date": "d",
                                "rows": rows}))
    runs = rep.load([path])
    assert not rep.has_prefill(runs[0])
    table = rep.readme_table(runs)
    assert "| o | 8192 x 8192 | nvfp4 | 1.75x / 25% | 1.75x / 25% |" in table


def test_prefill_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (needed for --plot only)")
    out = subprocess.run([sys.executable, str(REPORT), str(_prefill_run(tmp_path)), "--plot", str(tmp_path / "plots")],
                         capture_output=True, text=True, check=True)
    assert (tmp_path / "plots" / "prefill_speedup_llama-3.3-70b.png").stat().st_size > 1000, out.stdout


def test_decode_suite_with_prefill_rows_keeps_its_plot_name(tmp_path):
    # A decode suite (m <= 64) whose dispatch picks the prefill kernel at some m is drawn in the decode +
    # prefill layout under speedup_<model>.png: it must not overwrite the *-prefill suite's plot.
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (needed for --plot only)")
    prefill = _prefill_run(tmp_path)
    d = json.loads(prefill.read_text())
    d["suite"] = "llama70b"
    d["rows"] = [r for r in d["rows"] if r["m"] <= 64 or r["kernel"] == "prefill"]
    decode = tmp_path / "decode.json"
    decode.write_text(json.dumps(d))
    plots = tmp_path / "plots"
    out = subprocess.run([sys.executable, str(REPORT), str(prefill), str(decode), "--plot", str(plots)],
                         capture_output=True, text=True, check=True)
    assert sorted(p.name for p in plots.iterdir()) == ["prefill_speedup_llama-3.3-70b.png",
                                                       "speedup_llama-3.3-70b.png"], out.stdout


def test_table_header_states_the_steady_clock_method():
    """The table text mentions the warm-up only where the JSON's method says the run used it."""
    rep = _report()
    assert "steady clocks" in rep.steady_note({"method": "after 150 ms of the same calls (steady clocks), CUDA graph"})
    assert rep.steady_note({"method": "CUDA graph of >= 8 calls over rotating weight copies"}) == ""
    assert rep.steady_note({}) == ""


def test_sm80_runs_go_to_their_own_readme_table(tmp_path):
    """A run dispatched as an sm_80-89 device (fp4kit-bench --as-cc 8) fills the sm80-table markers and leaves
    the Hopper perf-table alone; its header says what it is."""
    src = json.loads(_prefill_run(tmp_path).read_text())
    src["as_cc"] = 8
    path = tmp_path / "sm80.json"
    path.write_text(json.dumps(src))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- perf-table:begin -->\nHOPPER\n<!-- perf-table:end -->\nb\n"
                      "<!-- sm80-table:begin -->\nOLD\n<!-- sm80-table:end -->\n")
    subprocess.run([sys.executable, str(REPORT), str(path), "--readme", str(readme)], check=True)
    text = readme.read_text()
    assert "HOPPER" in text and "OLD" not in text
    assert "the sm_80-89 path (dispatch as on a cc 8.x device" in text and "| **average** | | nvfp4 | dispatch |" in text


def _sweep(tmp_path, pick_us):
    """A --config all sweep of one point: dispatch's pick at pick_us against a fastest config at 40 us."""
    rows = [_row("down", "nvfp4", 16, "p64_w8_s4_b2_k8", "prefill", pick_us, 100.0, True),
            _row("down", "nvfp4", 16, "p64_w8_s8_k8", "prefill", 40.0, 100.0, False),
            _row("down", "nvfp4", 16, "m16_r1_w8_b2_c8x2", "decode", 50.0, 100.0, False)]
    path = tmp_path / f"cfg_{pick_us}.json"
    path.write_text(json.dumps({"tool": "fp4kit-bench", "device": "NVIDIA H200", "sms": 132, "commit": "abc1234",
                                "date": "2026-01-01T00:00:00Z", "suite": "llama70b", "rows": rows}))
    return path


def test_dispatch_check(tmp_path):
    rep = _report()
    text, worst = rep.dispatch_check(rep.load([_sweep(tmp_path, 43.6)]))
    assert abs(worst - 43.6 / 40.0) < 1e-9 and "MISS" in text and "+9.0%" in text
    text, worst = rep.dispatch_check(rep.load([_sweep(tmp_path, 41.0)]))
    assert worst <= rep.DISPATCH_TOLERANCE and "MISS" not in text
    # The command's exit status: 1 past the 5% rule, 0 within it.
    bad = subprocess.run([sys.executable, str(REPORT), "--dispatch-check", str(_sweep(tmp_path, 43.6))],
                         capture_output=True, text=True)
    good = subprocess.run([sys.executable, str(REPORT), "--dispatch-check", str(_sweep(tmp_path, 41.0))],
                          capture_output=True, text=True)
    assert bad.returncode == 1 and "worst: +9.0%" in bad.stdout
    assert good.returncode == 0, good.stdout + good.stderr
