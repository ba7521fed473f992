"""tools/ab_compare.py on synthetic A/B JSON: rows match on their identity fields, medians per side,
head / base, and the geometric mean. Standard library only."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _mod():
    spec = importlib.util.spec_from_file_location("fp4kit_ab_compare", ROOT / "tools" / "ab_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, commit, rows):
    path.write_text(json.dumps({"commit": commit, "rows": rows}))
    return str(path)


def test_medians_and_ratios(tmp_path, capsys):
    ab = _mod()
    row = lambda layer, m, us: {"op": "gemm", "model": "llama", "layer": layer, "format": "nvfp4", "act": "bf16",
                                "m": m, "config": "c0", "us": us, "cublas_us": 50.0}
    files = [
        _write(tmp_path / "ab_base_r1.json", "aaa", [row("o", 1, 20.0), row("qkv", 1, 30.0)]),
        _write(tmp_path / "ab_head_r1.json", "bbb", [row("o", 1, 18.0), row("qkv", 1, 33.0)]),
        _write(tmp_path / "ab_base_r2.json", "aaa", [row("o", 1, 22.0), row("qkv", 1, 30.0)]),
        _write(tmp_path / "ab_head_r2.json", "bbb", [row("o", 1, 18.0), row("qkv", 1, 33.0), row("down", 1, 9.0)]),
    ]
    times, commits, _ = ab.collect(files)
    assert commits == {"base": "aaa", "head": "bbb"}
    rows = {dict(k)["layer"]: (b, h, r) for k, b, h, r in ab.compare(times)}
    assert set(rows) == {"o", "qkv"}  # "down" has no base side
    assert rows["o"] == pytest.approx((21.0, 18.0, 18.0 / 21.0))
    assert rows["qkv"] == pytest.approx((30.0, 33.0, 1.1))
    assert ab.main(["ab_compare"] + files) == 0
    out = capsys.readouterr().out
    assert "base aaa  head bbb" in out
    assert f"{(18.0 / 21.0 * 1.1) ** 0.5:.3f}" in out.splitlines()[-1]


def test_moe_rows_match_on_T(tmp_path):
    ab = _mod()
    row = lambda T, us: {"op": "moe", "model": "gpt-oss-120b", "format": "mxfp4", "T": T, "us": us}
    files = [_write(tmp_path / "ab_base_r1.json", "a", [row(1, 44.0), row(4, 87.0)]),
             _write(tmp_path / "ab_head_r1.json", "b", [row(4, 80.0), row(1, 40.0)])]
    rows = {dict(k)["T"]: r for k, _, _, r in ab.compare(ab.collect(files)[0])}
    assert rows == pytest.approx({1: 40.0 / 44.0, 4: 80.0 / 87.0})


def test_a_file_of_neither_side_is_an_error(tmp_path):
    ab = _mod()
    f = _write(tmp_path / "run.json", "a", [])
    with pytest.raises(SystemExit, match="ab_base or ab_head"):
        ab.collect([f])


def test_dispatch_rows_match_on_the_shape(tmp_path, capsys):
    ab = _mod()
    row = lambda cfg, us, dispatch: {"op": "gemm", "model": "llama", "layer": "qkv", "format": "nvfp4",
                                     "act": "bf16", "m": 256, "config": cfg, "dispatch": dispatch, "us": us}
    files = [_write(tmp_path / "ab_base_r1.json", "a", [row("p256", 88.0, True), row("p64", 120.0, False)]),
             _write(tmp_path / "ab_head_r1.json", "b", [row("p128_k8", 79.2, True), row("p64", 121.2, False)])]
    times = ab.collect(files)[0]
    rows = {dict(k)["config"]: r for k, _, _, r in ab.compare(times)}
    assert rows == pytest.approx({"*": 0.9, "p64": 1.01})  # the pick changed, the shape still compares
    assert ab.main(["ab_compare"] + files) == 0
    assert "p256->p128_k8" in capsys.readouterr().out
