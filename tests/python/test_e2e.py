"""fp4kit.e2e: the decoder runtime against itself and against dequantized weights, on the CPU (tiny preset, the
CPU reference GEMM); the CUDA-graph decode step against the eager one on a GPU. About 10 s on 2 cores."""
import copy
import dataclasses
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'fp4kit[torch]')")
import fp4kit  # noqa: E402
from fp4kit import e2e  # noqa: E402
from fp4kit import nn as fnn  # noqa: E402

_GPU = torch.cuda.is_available() and fp4kit.cuda_device_count() > 0
TINY = e2e.PRESETS["tiny"]
LINEARS = ("qkv", "o", "gate_up", "down")


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _ids(batch, n, seed=1, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, TINY.vocab, (batch, n), generator=g, device=device)


@pytest.fixture(scope="module")
def models():
    return {v: e2e.build_model(TINY, v, "cpu", seed=0) for v in e2e.VARIANTS}


def test_presets_match_real_shapes():
    # (N, K) from shapes.json: dense llama-3.1-8b and llama-3.3-70b
    real = {"llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
            "llama-3.3-70b": {"qkv": (10240, 8192), "o": (8192, 8192), "gate_up": (57344, 8192), "down": (8192, 28672)}}
    for name, shapes in real.items():
        assert e2e.PRESETS[name].linear_shapes() == shapes
    assert (e2e.PRESETS["llama-3.1-8b"].layers, e2e.PRESETS["llama-3.3-70b"].layers) == (32, 80)
    assert e2e.PRESETS["llama-3.1-8b"].vocab == e2e.PRESETS["llama-3.3-70b"].vocab == 128256

def test_memory_estimate_and_fit_rule():
    gib = 1 << 30
    l70, free = e2e.PRESETS["llama-3.3-70b"], 139 * gib   # an H200: about 139 GiB usable
    bf = e2e.memory_estimate(l70, "bf16", 64, 512, 256)
    assert bf["weights"] > 141e9 and bf["kv_cache"] == 2 * 2 * 80 * 64 * 8 * 768 * 128
    assert bf["total"] == bf["weights"] + bf["kv_cache"] + bf["activations"] > free   # BF16 70B at batch 64: no
    assert e2e.memory_estimate(l70, "nvfp4", 64, 512, 256)["total"] < free             # NVFP4 at full depth: yes
    n = e2e.max_layers(l70, "bf16", 64, 512, 256, free)
    assert 40 <= n < 80
    assert e2e.memory_estimate(dataclasses.replace(l70, layers=n), "bf16", 64, 512, 256)["total"] <= free
    assert e2e.memory_estimate(dataclasses.replace(l70, layers=n + 1), "bf16", 64, 512, 256)["total"] > free
    l8 = e2e.PRESETS["llama-3.1-8b"]
    assert e2e.memory_estimate(l8, "bf16", 64, 512, 256)["total"] < free
    assert e2e.memory_estimate(l8, "nvfp4", 1, 512, 256)["weights"] < 0.4 * e2e.weight_bytes(l8, "bf16")


def test_weights_random_bf16_and_fp4_as_convert(models):
    bf = models["bf16"]
    w = bf.layers[0].gate_up.weight
    assert w.dtype == torch.bfloat16 and (w != 0).float().mean() > 0.99 and 0.015 < float(w.float().std()) < 0.025
    assert isinstance(bf.layers[0].qkv, torch.nn.Linear) and isinstance(bf.lm_head, torch.nn.Linear)
    for fmt in ("nvfp4", "mxfp4"):
        q = models[fmt]
        conv = fnn.convert(copy.deepcopy(bf), fmt, exclude=["lm_head"])
        assert not isinstance(q.lm_head, fnn.Linear) and torch.equal(q.lm_head.weight, bf.lm_head.weight)
        assert torch.equal(q.embed.weight, bf.embed.weight)
        for i in range(TINY.layers):
            for n in LINEARS:
                mod = getattr(q.layers[i], n)
                assert isinstance(mod, fnn.Linear) and mod.format == fmt
                assert torch.equal(mod.weight_packed, getattr(conv.layers[i], n).weight_packed)


@pytest.mark.parametrize("variant", ["bf16", "nvfp4"])
def test_decode_with_cache_matches_full_forward(models, variant):
    model = models[variant]
    ids = _ids(2, 14)
    with torch.no_grad():
        full = model(ids)                                               # [2, 14, vocab]
        cache = e2e.KVCache(TINY, 2, 16, "cpu")
        last = model(ids[:, :9], cache, last_only=True)[:, 0]
        assert _rel(last, full[:, 8]) < 1e-2
        for p in range(9, 14):
            logits = model.step(ids[:, p], torch.full((2,), p), cache)
            assert logits.shape == (2, TINY.vocab) and logits.dtype == torch.bfloat16
            assert _rel(logits, full[:, p]) < 2e-2, p


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_model_matches_dequantized_bf16_model(models, fmt):
    q, bf = models[fmt], models["bf16"]
    ref = copy.deepcopy(bf)
    for i in range(TINY.layers):
        for n in LINEARS:
            getattr(ref.layers[i], n).weight.copy_(getattr(q.layers[i], n).dequantized_weight().to(torch.bfloat16))
    ids = _ids(2, 12, seed=2)
    with torch.no_grad():
        yq, yr, yb = q(ids), ref(ids), bf(ids)
    assert _rel(yq, yr) < 2e-2
    assert _rel(yq, yb) > 2 * _rel(yq, yr)   # the FP4 weights do differ from the BF16 ones


def test_greedy_generation(models):
    prompt = _ids(3, 10, seed=3)
    for v in ("bf16", "nvfp4"):
        out = e2e.generate(models[v], prompt, 6)
        assert out.shape == (3, 6) and out.dtype == torch.long
        assert int(out.min()) >= 0 and int(out.max()) < TINY.vocab
    # greedy with the KV cache == greedy by full forwards over the growing sequence
    out = e2e.generate(models["bf16"], prompt, 6)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, models["bf16"](seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 10:])
    with pytest.raises(ValueError, match="gen: must be >= 1"):
        e2e.generate(models["bf16"], prompt, 0)


def test_cli_writes_json_on_cpu(tmp_path, capsys):
    path = tmp_path / "e2e.json"
    rc = e2e.main(["--model", "tiny", "--device", "cpu", "--batches", "1,2", "--prompt", "8", "--gen", "3",
                   "--commit", "abc1234", "--json", str(path)])
    assert rc == 0
    rep = json.loads(path.read_text())
    assert rep["tool"] == "fp4kit.e2e" and rep["commit"] == "abc1234" and rep["device"].startswith("cpu")
    assert rep["config"]["models"]["tiny"]["layers"] == 2 and rep["config"]["cuda_graph"] is False
    rows = rep["rows"]
    assert [(r["variant"], r["batch"]) for r in rows] == [(v, b) for v in e2e.VARIANTS for b in (1, 2)]
    for r in rows:
        assert {"model", "variant", "layers", "batch", "prompt", "gen", "prefill_ms", "decode_tok_s", "peak_gib",
                "ratio_vs_bf16"} <= set(r)
        assert r["model"] == "tiny" and r["prompt"] == 8 and r["gen"] == 3 and r["decode_tok_s"] > 0
        assert r["ratio_vs_bf16"] > 0 and (r["variant"] != "bf16" or r["ratio_vs_bf16"] == 1.0)
    assert "decode tok/s" in capsys.readouterr().out
    assert e2e.main(["--model", "nope", "--device", "cpu"]) == 2
    assert e2e.main(["--model", "tiny", "--device", "cpu", "--variants", "fp8"]) == 2


def test_partial_reports_steps_and_plan(tmp_path, capsys):
    seen = []
    rep = e2e.run(["tiny"], ["bf16", "nvfp4"], [1, 2], prompt=8, gen=2, device="cpu", log=lambda s: None,
                  notes=["a note"], step="llama70b-a", on_update=lambda r: seen.append(json.loads(json.dumps(r))))
    assert [len(r["rows"]) for r in seen] == [1, 2, 3, 4] and all(r["partial"] for r in seen)
    assert "partial" not in rep and rep["config"]["notes"] == ["a note"] and rep["config"]["step"] == "llama70b-a"
    assert seen[-1]["rows"][-1]["ratio_vs_bf16"] == rep["rows"][-1]["ratio_vs_bf16"] > 0
    assert all(r["build_s"] >= 0 and r["seconds"] > 0 for r in rep["rows"])
    assert e2e.main(["--plan"]) == 0 and "llama70b-fit: llama-3.3-70b at 64 layers" in capsys.readouterr().out
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rep))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- e2e-table:begin -->\n<!-- e2e-table:end -->\n")
    assert e2e.main(["--from-json", str(path), "--readme", str(readme)]) == 0   # tiny: the default marker
    assert "| tiny | 2 | 2 |" in readme.read_text() and "- a note" in readme.read_text()


def test_markdown_and_plot(tmp_path):
    rep = e2e.run(["tiny"], ["bf16", "mxfp4"], [1, 2], prompt=8, gen=2, device="cpu", commit="abc1234",
                  log=lambda s: None)
    md = e2e.markdown(rep).splitlines()
    assert md[2].startswith("| model | layers | batch |") and len(md) == 4 + 2
    assert "| tiny | 2 | 2 |" in md[-1] and "x)" in md[-1]
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (needed for --plot only)")
    e2e.plot(rep, str(tmp_path / "p" / "e2e.png"))
    assert (tmp_path / "p" / "e2e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compiled_decode_step_matches_eager(models):
    import shutil
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler for torch.compile's CPU backend")
    prompt = _ids(2, 10, seed=5)
    out = e2e.generate(models["nvfp4"], prompt, 5, compile=True)
    assert torch.equal(out, e2e.generate(models["nvfp4"], prompt, 5))


def _decode_eager_and_graph(model, prompt):
    """Greedy decode of 8 tokens eagerly and through the captured step: {graph: (ids, logits of 7 steps)}."""
    runs = {}
    for graph in (False, True):
        r = e2e.Runner(model, prompt.shape[0], e2e.cache_len(prompt.shape[1], 8), 8, graph=graph)
        r.prefill(prompt)
        r.prepare()
        logits = []
        for _ in range(7):
            r.step()
            logits.append(r.logits.clone())
        torch.cuda.synchronize()
        runs[graph] = (r.out[:, :8].clone(), torch.stack(logits))
        assert (r._g is not None) == graph
    return runs


@pytest.mark.skipif(not _GPU, reason="no CUDA GPU (torch.cuda.is_available() is False or fp4kit sees no device)")
@pytest.mark.parametrize("variant", ["bf16", "nvfp4", "mxfp4"])
def test_cuda_graph_decode_matches_eager(variant):
    model = e2e.build_model(TINY, variant, "cuda", seed=0)
    prompt = _ids(3, 20, seed=4, device="cuda")
    runs = _decode_eager_and_graph(model, prompt)
    assert torch.equal(runs[True][0], runs[False][0])
    assert _rel(runs[True][1], runs[False][1]) < 1e-3
    # and the CUDA decode agrees with a full forward on the GPU
    with torch.no_grad():
        full = model(torch.cat([prompt, runs[True][0][:, :-1]], 1))
    assert _rel(runs[True][1][-1], full[:, -1]) < 2e-2


# ---- MoE blocks (gpt-oss-style) ------------------------------------------------------------------------------
TINY_MOE = e2e.PRESETS["tiny-moe"]


def test_moe_presets_and_weight_bytes():
    g = e2e.PRESETS["gpt-oss-120b"]   # shapes.json: E 128, top-k 4, H = I = 2880, SwiGLU, interleaved, biases
    assert (g.experts, g.top_k, g.hidden, g.intermediate, g.layers) == (128, 4, 2880, 2880, 36)
    assert (g.moe_activation, g.moe_layout, g.moe_bias) == ("swiglu_oai", "interleaved", True)
    model = e2e.build_model(TINY_MOE, "mxfp4", "cpu", seed=0)
    blk = model.layers[0]
    # the weights the model holds are what weight_bytes counts
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert held == e2e.weight_bytes(TINY_MOE, "mxfp4")
    assert blk.w_gate_up.shape[0] == blk.w_down.shape[0] == TINY_MOE.experts
    with pytest.raises(NotImplementedError, match="FP4 experts only"):
        e2e.build_model(TINY_MOE, "bf16", "cpu")
    with pytest.raises(ValueError, match="top_k: must be in"):
        dataclasses.replace(TINY_MOE, top_k=9)


@pytest.mark.parametrize("variant", ["nvfp4", "mxfp4"])
def test_moe_decode_with_cache_matches_full_forward(variant):
    model = e2e.build_model(TINY_MOE, variant, "cpu", seed=0)
    ids = _ids(2, 12, seed=6)
    with torch.no_grad():
        full = model(ids)
        cache = e2e.KVCache(TINY_MOE, 2, 16, "cpu")
        last = model(ids[:, :8], cache, last_only=True)[:, 0]
        assert _rel(last, full[:, 7]) < 1e-2
        for p in range(8, 12):
            logits = model.step(ids[:, p], torch.full((2,), p), cache)
            assert logits.shape == (2, TINY_MOE.vocab) and torch.isfinite(logits.float()).all()
            assert _rel(logits, full[:, p]) < 2e-2, p


def test_moe_block_is_the_reference_moe():
    """One MoE block's MLP against fp4kit.moe.moe_reference on its dequantized experts, routed by hand."""
    from fp4kit import moe
    from fp4kit.ops import dequantize_packed
    model = e2e.build_model(TINY_MOE, "nvfp4", "cpu", seed=1)
    blk, c = model.layers[1], TINY_MOE
    # x small (the RMSNorm makes the MLP's input independent of its scale), so that x + MLP(x) in BF16 keeps
    # the MLP's digits
    x = (1e-3 * torch.randn(5, 1, c.hidden, generator=torch.Generator().manual_seed(3))).bfloat16()
    with torch.no_grad():
        got = blk.mlp(x, c.eps)
        h = e2e._rms(x, blk.mlp_norm, c.eps).reshape(-1, c.hidden)
        # The spec's softmax top-k (ties to the lower id, as the block's routing kernel breaks them)
        ids, wts = moe.route_softmax_topk(blk.router(h).float(), c.top_k, True)
        gu = [dequantize_packed(blk.w_gate_up[e], "nvfp4", 2 * c.intermediate, c.hidden) for e in range(c.experts)]
        dn = [dequantize_packed(blk.w_down[e], "nvfp4", c.hidden, c.intermediate) for e in range(c.experts)]
        ref = moe.moe_reference(h, ids, wts, gu, dn, blk.b_gate_up, blk.b_down, c.moe_activation, c.moe_layout)
    assert _rel(got - x, ref.view(x.shape)) < 2e-2


@pytest.mark.skipif(not _GPU, reason="no CUDA GPU (torch.cuda.is_available() is False or fp4kit sees no device)")
def test_cuda_graph_moe_decode_matches_eager():
    model = e2e.build_model(TINY_MOE, "mxfp4", "cuda", seed=0)
    runs = _decode_eager_and_graph(model, _ids(3, 20, seed=4, device="cuda"))
    assert torch.equal(runs[True][0], runs[False][0])
    assert _rel(runs[True][1], runs[False][1]) < 1e-3
