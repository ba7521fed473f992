"""The GPU-machine runs, checked on the CPU without torch: the plan of the large end-to-end runs (memory and
time per step, fp4kit.e2e_plan), merging their reports and writing the README tables (fp4kit.tables,
tools/report.py), and moving the quality check's model in parts (tools/quality_carry.py). Under 2 s."""
import dataclasses
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fp4kit import e2e_plan as plan
from fp4kit import tables

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the plan -------------------------------------------------------------------------------------------------------
def test_memory_arithmetic_llama70b():
    l70 = plan.PRESETS["llama-3.3-70b"]
    assert plan.cache_len(512, 256) == 768
    # KV cache: K and V, BF16, 80 layers x 8 KV heads x 768 slots x 128 per sequence = 240 MiB
    assert plan.kv_bytes(l70, 1, 768) == 2 * 2 * 80 * 8 * 768 * 128 == 240 << 20
    assert plan.kv_bytes(l70, 64, 768) == 15 * GIB
    bf = plan.weight_bytes(l70, "bf16")
    params = 80 * (10240 * 8192 + 8192 * 8192 + 57344 * 8192 + 8192 * 28672)
    assert bf == 2 * params + 80 * 4 * 8192 + 2 * (2 * 128256 * 8192 + 8192)
    assert 141.0e9 < bf < 141.2e9
    for fmt, bits in (("nvfp4", 4.5), ("mxfp4", 4.25)):   # codes + one 8-bit scale per 16 / 32 values
        fp4 = plan.weight_bytes(l70, fmt) - 2 * (2 * 128256 * 8192 + 8192) - 80 * 4 * 8192
        assert params * bits / 8 <= fp4 < params * bits / 8 * 1.01
    fits = {(v, b): plan.memory_estimate(l70, v, b, 512, 256)["total"] <= plan.GPU_FREE
            for v in plan.VARIANTS for b in (1, 10, 64)}
    assert fits.pop(("bf16", 64)) is False and all(fits.values())   # only BF16 at batch 64 does not fit
    assert plan.max_layers(l70, "bf16", 64, 512, 256, plan.GPU_FREE) == 67
    assert plan.fit_depth(l70) == plan.FIT_DEPTH == 64
    deep = dataclasses.replace(l70, layers=plan.FIT_DEPTH)
    assert plan.memory_estimate(deep, "bf16", 64, 512, 256)["total"] <= plan.GPU_FREE - 5 * GIB   # a margin


def test_memory_arithmetic_gptoss():
    g = plan.PRESETS["gpt-oss-120b"]
    assert plan.kv_bytes(g, 64, 768) == 2 * 2 * 36 * 64 * 8 * 768 * 64
    for fmt in ("nvfp4", "mxfp4"):
        est = plan.memory_estimate(g, fmt, 64, 512, 256)
        assert 55 * GIB < est["weights"] < 66 * GIB and est["total"] < 80 * GIB
    # the MoE slot intermediates are counted in the prefill estimate
    dense = dataclasses.replace(g, experts=0, top_k=0, moe_bias=False)
    assert plan.act_bytes(g, 64, 512) - plan.act_bytes(dense, 64, 512) == 64 * 512 * 2 * 4 * (3 * 2880 + 2880)


def test_large_steps_cover_the_runs_and_fit_ten_minutes():
    steps = plan.LARGE_STEPS
    assert list(steps) == ["llama70b-a", "llama70b-b", "llama70b-fit", "gptoss-fp4"]
    runs = {(s.model, s.layers, v, b) for s in steps.values() for v in s.variants for b in s.batches}
    for fmt in ("nvfp4", "mxfp4"):
        for b in (1, 10, 64):
            assert ("llama-3.3-70b", 80, fmt, b) in runs and ("gpt-oss-120b", 36, fmt, b) in runs
    for v in plan.VARIANTS:
        assert ("llama-3.3-70b", plan.FIT_DEPTH, v, 64) in runs   # BF16 and FP4 side by side at batch 64
    assert {("llama-3.3-70b", 80, "bf16", b) for b in (1, 10)} <= runs
    for s in steps.values():
        assert s.name.startswith(s.group + "-") and s.note
        assert plan.step_seconds(s) < 6 * 60, (s.name, plan.step_seconds(s))   # pessimistic, + install < 10 min
        mem = plan.step_memory(s)
        assert all(m["fits"] for m in mem if not (s.name == "llama70b-a" and m["variant"] == "bf16"
                                                   and m["batch"] == 64))
    text = plan.plan_text()
    assert "llama70b-fit: llama-3.3-70b at 64 layers" in text and "does not fit" in text


# ---- reports and README tables --------------------------------------------------------------------------------------
def _row(variant, layers, batch, tok_s, model="llama-3.3-70b"):
    return {"model": model, "variant": variant, "layers": layers, "batch": batch, "prompt": 512, "gen": 256,
            "prefill_ms": 100.0, "decode_ms_per_step": 1.0, "decode_tok_s": tok_s, "total_tok_s": tok_s,
            "peak_gib": 50.0, "weights_gib": 40.0, "ratio_vs_bf16": None, "build_s": 3.0, "seconds": 30.0}


def _report(step, rows, skipped=(), commit="abc1234"):
    s = plan.LARGE_STEPS[step]
    return {"tool": "fp4kit.e2e", "device": "NVIDIA H200", "commit": commit, "date": f"2026-12-01T10:0{len(rows)}:00Z",
            "config": {"models": {s.model: {"layers": s.layers}}, "variants": list(s.variants),
                       "batches": list(s.batches), "prompt": 512, "gen": 256, "max_len": 768, "cuda_graph": True,
                       "compile": False, "seed": 0, "kept_bf16": plan.KEPT_BF16, "step": step,
                       "notes": [f"{s.model} at {s.layers} layers: {s.note}"]},
            "rows": rows, "skipped": list(skipped)}


def _parts():
    skip = {"model": "llama-3.3-70b", "variant": "bf16", "layers": 80, "batch": 64,
            "reason": "needs about 29.4 GiB beyond the weights, 7.5 GiB are free. Rule: when BF16 does not fit ..."}
    a = _report("llama70b-a", [_row("bf16", 80, 1, 25.0), _row("bf16", 80, 10, 240.0), _row("nvfp4", 80, 1, 50.0),
                               _row("nvfp4", 80, 10, 400.0), _row("nvfp4", 80, 64, 1200.0)], [skip])
    b = _report("llama70b-b", [_row("mxfp4", 80, 1, 49.0), _row("mxfp4", 80, 10, 390.0), _row("mxfp4", 80, 64, 1100.0)],
                commit="def5678")
    fit = _report("llama70b-fit", [_row("bf16", 64, 64, 1000.0), _row("nvfp4", 64, 64, 1500.0),
                                   _row("mxfp4", 64, 64, 1400.0)])
    return a, b, fit


def test_merge_and_markdown():
    a, b, fit = _parts()
    rep = tables.merge_e2e([a, b, fit])
    ratio = {(r["variant"], r["layers"], r["batch"]): r["ratio_vs_bf16"] for r in rep["rows"]}
    assert ratio[("nvfp4", 80, 1)] == 2.0 and ratio[("mxfp4", 80, 10)] == 1.625 and ratio[("bf16", 80, 1)] == 1.0
    assert ratio[("nvfp4", 64, 64)] == 1.5 and ratio[("nvfp4", 80, 64)] is None   # no BF16 at 80 layers, batch 64
    assert rep["commit"] == "abc1234 / def5678" and [p["step"] for p in rep["parts"]] == \
        ["llama70b-a", "llama70b-b", "llama70b-fit"]
    assert len(rep["skipped"]) == 1 and len(rep["config"]["notes"]) == 3
    md = tables.e2e_markdown(rep)
    lines = md.splitlines()
    assert "| llama-3.3-70b | 80 | 64 | - / 100 / 100 | - | 1200 | 1100 | - / 50.0 / 50.0 |" in lines
    assert "| llama-3.3-70b | 64 | 64 | 100 / 100 / 100 | 1000 | 1500 (1.50x) | 1400 (1.40x) | 50.0 / 50.0 / 50.0 |" \
        in lines
    assert any(x.startswith("- not measured: llama-3.3-70b bf16 at 80 layers, batch 64: needs about 29.4 GiB") and
               "Rule" not in x for x in lines)
    assert tables.e2e_marker(rep) == "e2e-llama70b-table"
    with pytest.raises(ValueError, match="config gen differs"):
        bad = json.loads(json.dumps(b))
        bad["config"]["gen"] = 128
        tables.merge_e2e([a, bad])


def test_a_measured_row_drops_the_skip_of_another_part():
    a, _, _ = _parts()
    late = _report("llama70b-a", [_row("bf16", 80, 64, 900.0)])
    assert tables.merge_e2e([a, late])["skipped"] == []


def test_report_tool_merges_and_writes_the_readme(tmp_path):
    a, b, fit = _parts()
    paths = []
    for name, rep in (("a", a), ("b", b), ("fit", fit)):
        p = tmp_path / f"e2e_llama70b-{name}.json"
        p.write_text(json.dumps(rep))
        paths.append(str(p))
    out = tmp_path / "e2e_llama70b.json"
    tool = [sys.executable, str(ROOT / "tools" / "report.py")]
    subprocess.run(tool + ["--merge", str(out)] + paths, check=True, capture_output=True)
    merged = json.loads(out.read_text())
    assert len(merged["rows"]) == 11 and merged["tool"] == "fp4kit.e2e"
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- e2e-llama70b-table:begin -->\nold\n<!-- e2e-llama70b-table:end -->\ny\n")
    subprocess.run(tool + [str(out), "--readme", str(readme)], check=True, capture_output=True)
    text = readme.read_text()
    assert "old" not in text and "| llama-3.3-70b | 64 | 64 |" in text and f"(`{out.as_posix()}`)" in text
    r = subprocess.run(tool + paths[:2] + ["--readme", str(readme)], capture_output=True, text=True)
    assert r.returncode != 0 and "merge them first" in r.stderr


def test_the_committed_8b_table_is_what_the_tables_module_writes():
    rep = json.loads((ROOT / "bench/results/e2e_llama8b.json").read_text())
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- e2e-table:begin -->\n", 1)[1].split("\n<!-- e2e-table:end -->", 1)[0]
    assert block == tables.e2e_markdown(rep) + "\n\n(`bench/results/e2e_llama8b.json`)"


# ---- moving the quality model in parts ------------------------------------------------------------------------------
def test_split_stash_assemble(tmp_path):
    qc = _tool("quality_carry")
    model = tmp_path / "m.gguf"
    data = bytes(range(256)) * 4001 + b"tail"
    model.write_bytes(data)
    text = tmp_path / "GPL-3"
    text.write_text("some text\n")
    carry, stash = tmp_path / "carry", tmp_path / "stash"
    man = qc.split(model, text, carry, limit=300_000)
    parts = man["model"]["parts"]
    assert len(parts) == 4 and sum(p["bytes"] for p in parts) == len(data) and max(p["bytes"] for p in parts) <= 300_000
    assert man["model"]["sha256"] == hashlib.sha256(data).hexdigest()
    for p in parts:
        assert (carry / p["file"]).read_bytes() == data[p["offset"]:p["offset"] + p["bytes"]]
    for i in (2, 0, 3):                                  # any order; one part per call
        qc.stash(i, carry, stash)
        assert qc.missing_parts(stash) == [j for j in range(4) if j not in (2, 0, 3)[:(2, 0, 3).index(i) + 1]]
        with pytest.raises(FileNotFoundError, match="not in"):
            qc.assemble(stash)
    qc.stash(1, carry, stash)
    whole = qc.assemble(stash)
    assert whole.read_bytes() == data and whole.name == "m.gguf"
    assert qc.text_path(stash) == text                  # the machine's own copy, when it matches
    text.write_text("another text\n")
    assert qc.text_path(stash) == stash / "GPL-3"        # else the carried one
    # a corrupted part is refused before it is stashed
    (carry / "model.part1").write_bytes(b"x" * parts[1]["bytes"])
    with pytest.raises(ValueError, match="does not match the manifest"):
        qc.stash(1, carry, stash)
    # the command line: exit 3 while parts are missing
    fresh = tmp_path / "fresh"
    assert qc.main(["stash", "0", "--carry", str(carry), "--stash", str(fresh)]) == 0
    assert qc.main(["assemble", "--stash", str(fresh)]) == qc.MISSING


def test_the_real_model_splits_into_two_parts_that_travel(tmp_path):
    qc = _tool("quality_carry")
    if not qc.MODEL.is_file():
        pytest.skip(f"{qc.MODEL} is not on this machine (python -m fp4kit.quality fetches it)")
    carry = tmp_path / "carry"
    man = qc.split(qc.MODEL, None, carry)
    assert len(man["model"]["parts"]) == 2
    for p in man["model"]["parts"]:
        assert p["bytes"] + (carry / "manifest.json").stat().st_size + 64 * 1024 < 64 << 20   # + manifest + text
    for i in (1, 0):
        qc.stash(i, carry, tmp_path / "stash")
    assert qc.sha256(qc.assemble(tmp_path / "stash")) == qc.sha256(qc.MODEL)
