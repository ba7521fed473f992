"""FP4Weight, fuse, the nibble-order check and the checkpoint loaders (ModelOpt, compressed-tensors, gpt-oss).

Tiny checkpoints are written into tmp_path from weights quantized with fp4kit.quantize, then loaded back:
packed bytes and scales must come back bit-exact and dequantize exactly as fp4kit.dequantize of the
originals. numpy only, except the tests marked for torch (float8 scale tensors, torch arrays), which skip
without it; the loader tests skip without the safetensors package.
"""
import json
import re

import numpy as np
import pytest

import fp4kit
from fp4kit.loaders import (load_compressed_tensors_checkpoint, load_gpt_oss_experts, load_modelopt_checkpoint,
                             load_modelopt_experts)
from fp4kit.weights import (FP4Weight, check_nibble_order, deinterleave_gate_up, fuse, interleave_gate_up,
                            swap_nibbles)

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def _safetensors():
    return pytest.importorskip("safetensors.numpy", reason="the checkpoint loaders need safetensors "
                               "(pip install 'fp4kit[loaders]')")


def _torch():
    return pytest.importorskip("torch", reason="this test needs torch (pip install 'fp4kit[torch]')")


def _rand(n, k, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((n, k)) * scale).astype(np.float32)


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _write_json(path, obj):
    path.write_text(json.dumps(obj))


# ---- FP4Weight -------------------------------------------------------------------------------------------
def test_from_modelopt_bit_exact():
    w = _rand(48, 128, 0)
    p, s, ts = fp4kit.quantize(w, "nvfp4")
    fw = FP4Weight.from_modelopt(p, s, np.array(ts, np.float32))
    assert fw.format == "nvfp4" and fw.shape == (48, 128) and fw.device == "cpu"
    _eq(fw.packed, p)
    _eq(fw.scales, s)
    _eq(fw.tensor_scale, np.full(48, ts, np.float32))
    _eq(fw.dequantize(), fp4kit.dequantize(p, s, ts, "nvfp4"))
    assert fw.nbytes == p.nbytes + s.nbytes + 48 * 4


def test_from_compressed_tensors_uses_reciprocal_global_scale():
    w = _rand(16, 64, 1)
    p, s, ts = fp4kit.quantize(w, "nvfp4")
    g = np.array([1.0 / ts], np.float32)  # compressed-tensors stores the reciprocal of ModelOpt's scale
    fw = FP4Weight.from_compressed_tensors(p, s, g)
    expect_ts = np.float32(1.0 / np.float64(g[0]))
    assert fw.tensor_scale[0] == expect_ts and expect_ts == pytest.approx(ts, rel=1e-6)
    _eq(fw.dequantize(), fp4kit.dequantize(p, s, float(expect_ts), "nvfp4"))
    for bad in (0.0, -2.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="weight_global_scale: must be positive and finite"):
            FP4Weight.from_compressed_tensors(p, s, np.array([bad], np.float32))


def test_from_gpt_oss_low_nibble_is_even_element():
    # gpt-oss's reference decoder: element 2i = LUT[byte & 0xF], element 2i+1 = LUT[byte >> 4].
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, 0] = 0x21  # element 0: code 1 (0.5), element 1: code 2 (1.0)
    blocks[0, 0, 1] = 0xF7  # element 2: code 7 (6.0), element 3: code 15 (-6.0)
    scales = np.array([[128]], np.uint8)  # 2^(128 - 127) = 2
    fw = FP4Weight.from_gpt_oss(blocks, scales)
    assert fw.format == "mxfp4" and fw.shape == (1, 32) and fw.tensor_scale is None
    row = fw.dequantize()[0]
    _eq(row[:4], [1.0, 2.0, 12.0, -12.0])
    assert not row[4:].any()


def test_from_gpt_oss_is_a_reshape():
    w = _rand(40, 96, 2)
    p, s, _ = fp4kit.quantize(w, "mxfp4")
    fw = FP4Weight.from_gpt_oss(p.reshape(40, 3, 16), s)
    _eq(fw.packed, p)
    _eq(fw.dequantize(), fp4kit.dequantize(p, s, 1.0, "mxfp4"))


def test_from_float_and_prepack_numpy():
    w = _rand(24, 64, 3)
    for fmt in ("nvfp4", "mxfp4"):
        fw = FP4Weight.from_float(w, fmt)
        p, s, ts = fp4kit.quantize(w, fmt)
        _eq(fw.packed, p)
        assert fw.prepack() is fw and fw.prepacked.dtype == np.uint8
        assert fw.prepacked.shape == (fp4kit.packed_layout(fmt, 24, 64)["total_bytes"],)
        _eq(fw.prepacked, fp4kit.prepack(p, s, ts if fmt == "nvfp4" else None, fmt))


def test_repr_is_honest():
    fw = FP4Weight.from_float(_rand(8, 32, 4), "nvfp4")
    r = repr(fw)
    for part in ("nvfp4", "shape=(8, 32)", "packed=uint8[8, 16]", "scales=uint8[8, 2]", "tensor_scale=float32[8]",
                 "arrays=numpy", "device=cpu", "prepacked=no", f"nbytes={fw.nbytes}"):
        assert part in r, (part, r)
    assert "prepacked=uint8[" in repr(fw.prepack())


def test_constructor_errors_name_tensor_and_rule():
    p, s, ts = fp4kit.quantize(_rand(64, 256, 5), "nvfp4")
    with pytest.raises(ValueError, match=re.escape("weight_scale: shape must be (64, 16) for weight of shape "
                                                   "(64, 128) (K = 256, one scale per 16 values), got (64, 8)")):
        FP4Weight.from_modelopt(p, s[:, :8].copy(), ts)
    with pytest.raises(TypeError, match="weight: dtype must be uint8 or float4_e2m1fn_x2 \\(got int8\\)"):
        FP4Weight.from_modelopt(p.view(np.int8), s, ts)
    with pytest.raises(TypeError, match="weight_scale: dtype must be uint8 or float8_e4m3fn \\(got float32\\)"):
        FP4Weight.from_modelopt(p, s.astype(np.float32), ts)
    with pytest.raises(ValueError, match="weight: must have 2 dimensions"):
        FP4Weight.from_modelopt(p.reshape(-1), s, ts)
    with pytest.raises(ValueError, match="weight: K = 2 \\* weight.shape\\[1\\] = 24 must be a multiple of the "
                                         "group size 16"):
        FP4Weight.from_modelopt(p[:, :12].copy(), s[:, :1].copy(), ts)
    with pytest.raises(ValueError, match="weight_scale_2: must hold one value"):
        FP4Weight.from_modelopt(p, s, np.ones(2, np.float32))
    with pytest.raises(TypeError, match="weight_scale_2: dtype must be a floating type"):
        FP4Weight.from_modelopt(p, s, np.ones(1, np.int32))
    with pytest.raises(ValueError, match="weight_scale_2: must be positive and finite"):
        FP4Weight.from_modelopt(p, s, -1.0)
    with pytest.raises(TypeError, match="weight: must be a numpy array or a torch tensor \\(got list\\)"):
        FP4Weight.from_modelopt(p.tolist(), s, ts)
    with pytest.raises(ValueError, match="weight: must be contiguous"):
        FP4Weight.from_modelopt(np.asfortranarray(p), s, ts)
    with pytest.raises(ValueError, match="format: must be"):
        FP4Weight("int4", p, s)
    with pytest.raises(ValueError, match="tensor_scale: shape must be \\(64,\\)"):
        FP4Weight("nvfp4", p, s, np.ones(3, np.float32))
    with pytest.raises(TypeError, match="tensor_scale: dtype must be float32"):
        FP4Weight("nvfp4", p, s, np.ones(64, np.float64))
    pm, sm, _ = fp4kit.quantize(_rand(64, 256, 5), "mxfp4")
    with pytest.raises(ValueError, match="tensor_scale: MXFP4 has no tensor scale"):
        FP4Weight("mxfp4", pm, sm, 0.5)
    with pytest.raises(ValueError, match=re.escape("blocks: shape must be (N, K/32, 16)")):
        FP4Weight.from_gpt_oss(pm.reshape(64, 16, 8), sm)
    with pytest.raises(ValueError, match=re.escape("scales: shape must be (64, 8) for blocks of shape (64, 8, 16), "
                                                   "got (64, 4)")):
        FP4Weight.from_gpt_oss(pm.reshape(64, 8, 16), sm[:, :4].copy())
    with pytest.raises(TypeError, match="scales: dtype must be uint8 or float8_e8m0fnu"):
        FP4Weight.from_gpt_oss(pm.reshape(64, 8, 16), sm.astype(np.int32))


# ---- fuse, interleave, nibble order ----------------------------------------------------------------------
def test_fused_qkv_keeps_per_row_tensor_scales():
    parts = [fp4kit.quantize(_rand(n, 128, 10 + i, scale), "nvfp4")
             for i, (n, scale) in enumerate([(32, 1.0), (16, 30.0), (16, 1e-3)])]
    assert len({ts for _, _, ts in parts}) == 3  # three different tensor scales
    fused = fuse([FP4Weight.from_modelopt(p, s, ts) for p, s, ts in parts])
    assert fused.shape == (64, 128)
    _eq(fused.tensor_scale, np.concatenate([np.full(p.shape[0], ts, np.float32) for p, _, ts in parts]))
    expect = np.concatenate([fp4kit.dequantize(p, s, ts, "nvfp4") for p, s, ts in parts])
    _eq(fused.dequantize(), expect)  # bit-exact: no scale was shared between parts
    fused.prepack()
    _eq(fused.prepacked, fp4kit.prepack(fused.packed, fused.scales, None, "nvfp4",
                                        row_tensor_scale=fused.tensor_scale))


def test_fuse_mxfp4_concatenates_and_rejects_mixtures():
    a, b = (FP4Weight.from_float(_rand(n, 64, n), "mxfp4") for n in (8, 24))
    f = fuse([a, b])
    assert f.tensor_scale is None and f.shape == (32, 64)
    _eq(f.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))
    nv = FP4Weight.from_float(_rand(8, 64, 1), "nvfp4")
    with pytest.raises(ValueError, match="weights\\[1\\]: format nvfp4 differs from weights\\[0\\]'s mxfp4"):
        fuse([a, nv])
    with pytest.raises(ValueError, match="weights\\[1\\]: K = 128 differs from weights\\[0\\]'s K = 64"):
        fuse([a, FP4Weight.from_float(_rand(8, 128, 1), "mxfp4")])
    with pytest.raises(ValueError, match="weights: need at least one"):
        fuse([])
    with pytest.raises(TypeError, match="weights\\[0\\]: must be an FP4Weight"):
        fuse([np.zeros((2, 2))])


def test_gate_up_interleave_round_trip():
    fw = FP4Weight.from_float(_rand(64, 64, 6), "nvfp4")
    d = deinterleave_gate_up(fw)
    w = fw.dequantize()
    _eq(d.dequantize(), np.concatenate([w[0::2], w[1::2]]))
    back = interleave_gate_up(d)
    _eq(back.packed, fw.packed)
    _eq(back.scales, fw.scales)
    bias = np.arange(12, dtype=np.float32).reshape(2, 6)  # [E, 2I]
    _eq(deinterleave_gate_up(bias, axis=1), [[0, 2, 4, 1, 3, 5], [6, 8, 10, 7, 9, 11]])
    _eq(interleave_gate_up(deinterleave_gate_up(bias, axis=1), axis=1), bias)
    with pytest.raises(ValueError, match="x: length along axis 0 must be even"):
        deinterleave_gate_up(np.zeros((3, 4)))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_nibble_order_self_check(fmt):
    w = _rand(4, 256, 7)
    p, s, ts = fp4kit.quantize(w, fmt)
    good = FP4Weight(fmt, p, s, ts if fmt == "nvfp4" else None)
    assert check_nibble_order(good, w[2], row=2) == "ok"
    ref_bf16 = (w[1].view(np.uint32) & 0xFFFF0000).view(np.float32)  # a truncated-BF16 reference row
    assert check_nibble_order(good, ref_bf16, row=1) == "ok"
    swapped = FP4Weight(fmt, swap_nibbles(p), s, ts if fmt == "nvfp4" else None)  # a checkpoint with swapped nibbles
    assert check_nibble_order(swapped, w[0]) == "swapped"
    fixed = FP4Weight(fmt, swap_nibbles(p), s, ts if fmt == "nvfp4" else None, swap_nibbles=True)
    _eq(fixed.packed, p)
    assert check_nibble_order(fixed, w[0]) == "ok"
    with pytest.raises(ValueError, match="row 0: matches the reference in neither nibble order"):
        check_nibble_order(good, w[3])  # another row's reference
    zeros = FP4Weight(fmt, np.zeros_like(p), s, ts if fmt == "nvfp4" else None)
    with pytest.raises(ValueError, match="row 0: reads the same in both nibble orders"):
        check_nibble_order(zeros, np.zeros(256, np.float32))
    with pytest.raises(ValueError, match="reference_row: must hold K = 256 values"):
        check_nibble_order(good, w[0, :128])
    with pytest.raises(ValueError, match="row: must be in \\[0, 4\\)"):
        check_nibble_order(good, w[0], row=4)


# ---- checkpoints on disk ---------------------------------------------------------------------------------
def _modelopt_dir(tmp_path, save):
    """Two shards: layer 0 attention (q, k, v, o quantized; o with a bias), mlp.gate and lm_head unquantized."""
    quantized, tensors = {}, [{}, {}]
    for i, (name, n) in enumerate([("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)]):
        p, s, ts = fp4kit.quantize(_rand(n, 64, 20 + i, 10.0 ** (i - 2)), "nvfp4")
        mod = f"model.layers.0.self_attn.{name}"
        quantized[mod] = (p, s, ts)
        shard = tensors[i % 2]
        shard[mod + ".weight"] = p
        shard[mod + ".weight_scale"] = s
        shard[mod + ".weight_scale_2"] = np.array(ts, np.float32)
    tensors[1]["model.layers.0.self_attn.o_proj.bias"] = np.arange(64, dtype=np.float32)
    tensors[1]["model.layers.0.mlp.gate.weight"] = _rand(4, 64, 30)
    tensors[0]["lm_head.weight"] = _rand(100, 64, 31)
    tensors[0]["model.embed_tokens.weight"] = _rand(100, 64, 32)
    for i, t in enumerate(tensors):
        save(t, str(tmp_path / f"model-0000{i + 1}-of-00002.safetensors"))
    _write_json(tmp_path / "hf_quant_config.json", {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "*.mlp.gate"]}})
    return quantized, {k: v for t in tensors for k, v in t.items()}


def _check_modelopt(out, quantized, raw):
    fp4 = {k: v for k, v in out.items() if isinstance(v, FP4Weight)}
    assert sorted(fp4) == sorted(quantized)
    for mod, (p, s, ts) in quantized.items():
        _eq(np.asarray(fp4[mod].packed), p)
        _eq(np.asarray(fp4[mod].scales), s)
        _eq(np.asarray(fp4[mod].dequantize()), fp4kit.dequantize(p, s, ts, "nvfp4"))
    for name in ("lm_head.weight", "model.layers.0.mlp.gate.weight", "model.embed_tokens.weight",
                 "model.layers.0.self_attn.o_proj.bias"):
        assert not isinstance(out[name], FP4Weight)
        _eq(np.asarray(out[name]), raw[name])
    assert "lm_head" not in out and "model.layers.0.mlp.gate" not in out
    assert len(out) == len(quantized) + 4


def test_modelopt_checkpoint_numpy(tmp_path):
    st = _safetensors()
    quantized, raw = _modelopt_dir(tmp_path, st.save_file)
    out = load_modelopt_checkpoint(tmp_path, framework="numpy")
    _check_modelopt(out, quantized, raw)
    assert all(isinstance(v.packed, np.ndarray) for v in out.values() if isinstance(v, FP4Weight))
    _check_modelopt(load_modelopt_checkpoint(tmp_path), quantized, raw)  # default: torch tensors when installed
    # The loaded q, k, v fuse exactly, each keeping its own tensor scale.
    qkv = fuse([out[f"model.layers.0.self_attn.{x}_proj"] for x in "qkv"])
    _eq(qkv.dequantize(), np.concatenate([fp4kit.dequantize(*quantized[f"model.layers.0.self_attn.{x}_proj"], "nvfp4")
                                          for x in "qkv"]))


def test_modelopt_checkpoint_float8_scales(tmp_path):
    torch = _torch()
    _safetensors()
    from safetensors.torch import save_file

    def save(tensors, path):  # the dtypes ModelOpt writes: float8_e4m3fn scales, a bfloat16 lm_head
        t = {k: torch.from_numpy(v) for k, v in tensors.items()}
        t = {k: v.view(torch.float8_e4m3fn) if k.endswith(".weight_scale") else v for k, v in t.items()}
        if "model.layers.0.self_attn.q_proj.weight" in t and hasattr(torch, "float4_e2m1fn_x2"):
            # packed bytes typed as float4_e2m1fn_x2 read as well
            t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"].view(
                torch.float4_e2m1fn_x2)
        if "lm_head.weight" in t:
            t["lm_head.weight"] = t["lm_head.weight"].to(torch.bfloat16)
        save_file(t, path)
    quantized, raw = _modelopt_dir(tmp_path, save)
    raw["lm_head.weight"] = torch.from_numpy(raw["lm_head.weight"]).to(torch.bfloat16).float().numpy()
    out_pt = load_modelopt_checkpoint(tmp_path, framework="pt")
    q = out_pt["model.layers.0.self_attn.q_proj"]
    assert isinstance(q.packed, torch.Tensor) and q.scales.dtype == torch.uint8
    assert out_pt["lm_head.weight"].dtype == torch.bfloat16
    out_pt["lm_head.weight"] = out_pt["lm_head.weight"].float()
    _check_modelopt(out_pt, quantized, raw)
    out_dev = load_modelopt_checkpoint(tmp_path, device="cpu")  # device: torch tensors placed by safetensors
    assert out_dev["model.layers.0.self_attn.k_proj"].device == "cpu"
    # numpy path: float8 scales arrive as raw bytes, bfloat16 widened exactly to float32.
    out_np = load_modelopt_checkpoint(tmp_path, framework="numpy")
    assert out_np["lm_head.weight"].dtype == np.float32
    _check_modelopt(out_np, quantized, raw)


def test_modelopt_checkpoint_errors(tmp_path):
    st = _safetensors()
    with pytest.raises(FileNotFoundError, match="hf_quant_config.json: not found"):
        load_modelopt_checkpoint(tmp_path, framework="numpy")
    cfg = tmp_path / "hf_quant_config.json"
    for text, msg in [("{", "not valid JSON"), ("[]", "must hold a JSON object"),
                      ("{}", 'needs a "quantization" object'),
                      ('{"quantization": {"quant_algo": "FP8"}}', 'quant_algo must be "NVFP4" \\(got \'FP8\'\\)'),
                      ('{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}', "group_size must be 16"),
                      ('{"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}}',
                       "exclude_modules must be a list")]:
        cfg.write_text(text)
        with pytest.raises(ValueError, match=msg):
            load_modelopt_checkpoint(tmp_path, framework="numpy")
    cfg.write_text('{"quantization": {"quant_algo": "NVFP4"}}')
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors files"):
        load_modelopt_checkpoint(tmp_path, framework="numpy")
    p, s, ts = fp4kit.quantize(_rand(16, 64, 40), "nvfp4")
    ts = np.array(ts, np.float32)
    cases = [
        ({"a.weight": p, "a.weight_scale": s}, "a: quantized module is missing weight_scale_2"),
        ({"a.weight_scale": s, "a.weight_scale_2": ts}, "a: quantized module is missing weight "),
        ({"a.weight": p, "a.weight_scale": s[:, :2].copy(), "a.weight_scale_2": ts},
         re.escape("a.weight_scale: shape must be (16, 4) for weight of shape (16, 32)")),
        ({"a.weight": p, "a.weight_scale": s.astype(np.float32), "a.weight_scale_2": ts},
         "a.weight_scale: dtype must be uint8 or float8_e4m3fn"),
        ({"a.weight": p, "a.weight_scale": s, "a.weight_scale_2": np.zeros(1, np.float32)},
         "a.weight_scale_2: must be positive and finite"),
        ({"lm_head.weight": p, "lm_head.weight_scale": s, "lm_head.weight_scale_2": ts},
         "lm_head: matches the config's exclusion 'lm_head' but carries FP4 tensors"),
        ({"a.weight": p}, "a.weight: uint8 \\(packed FP4\\?\\) but the module has none of weight_scale"),
    ]
    cfg.write_text('{"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}}')
    for tensors, msg in cases:
        for f in tmp_path.glob("*.safetensors"):
            f.unlink()
        st.save_file(tensors, str(tmp_path / "model.safetensors"))
        with pytest.raises((ValueError, TypeError), match=msg):
            load_modelopt_checkpoint(tmp_path, framework="numpy")
    st.save_file({"a.weight": p}, str(tmp_path / "model.safetensors"))
    st.save_file({"a.weight": p}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match="a.weight: stored twice, in extra.safetensors and model.safetensors"):
        load_modelopt_checkpoint(tmp_path, framework="numpy")
    with pytest.raises(ValueError, match="device: needs torch tensors"):
        load_modelopt_checkpoint(tmp_path, device="cpu", framework="numpy")
    with pytest.raises(ValueError, match="framework: must be"):
        load_modelopt_checkpoint(tmp_path, framework="tf")


def test_modelopt_shard_index_selects_files(tmp_path):
    st = _safetensors()
    quantized, raw = _modelopt_dir(tmp_path, st.save_file)
    st.save_file({"lm_head.weight": _rand(2, 64, 50)}, str(tmp_path / "consolidated.safetensors"))  # not a shard
    names = {n: f.name for f in tmp_path.glob("model-*.safetensors") for n in st.load_file(str(f))}
    _write_json(tmp_path / "model.safetensors.index.json", {"metadata": {}, "weight_map": names})
    _check_modelopt(load_modelopt_checkpoint(tmp_path, framework="numpy"), quantized, raw)


def _compressed_dir(tmp_path, fmt="nvfp4-pack-quantized", ignore=("lm_head",)):
    st = _safetensors()
    parts, tensors = {}, {}
    for i, name in enumerate(["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]):
        p, s, ts = fp4kit.quantize(_rand(32, 128, 60 + i, 3.0 ** i), "nvfp4")
        parts[name] = (p, s, ts)
        tensors.update({name + ".weight_packed": p, name + ".weight_scale": s,
                        name + ".weight_global_scale": np.array([1.0 / ts], np.float32),
                        name + ".input_global_scale": np.array([1.0], np.float32)})
    tensors["lm_head.weight"] = _rand(10, 128, 70)
    st.save_file(tensors, str(tmp_path / "model.safetensors"))
    _write_json(tmp_path / "config.json", {"architectures": ["LlamaForCausalLM"], "quantization_config": {
        "quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore), "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                                           "strategy": "tensor_group"}}}}})
    return parts, tensors


def test_compressed_tensors_checkpoint(tmp_path):
    parts, tensors = _compressed_dir(tmp_path)
    out = load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    for name, (p, s, _) in parts.items():
        fw = out[name]
        _eq(fw.packed, p)
        _eq(fw.scales, s)
        ts = float(np.float32(1.0 / np.float64(tensors[name + ".weight_global_scale"][0])))
        _eq(fw.dequantize(), fp4kit.dequantize(p, s, ts, "nvfp4"))
        _eq(out[name + ".input_global_scale"], [1.0])
    _eq(out["lm_head.weight"], tensors["lm_head.weight"])
    gate_up = fuse([out["model.layers.0.mlp.gate_proj"], out["model.layers.0.mlp.up_proj"]])
    _eq(gate_up.dequantize(), np.concatenate([out[n].dequantize() for n in parts]))


def test_compressed_tensors_errors(tmp_path):
    _compressed_dir(tmp_path, fmt="pack-quantized")
    with pytest.raises(ValueError, match='format must be "nvfp4-pack-quantized" \\(got \'pack-quantized\'\\)'):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    _compressed_dir(tmp_path, ignore=("re:.*gate_proj$",))
    with pytest.raises(ValueError, match="model.layers.0.mlp.gate_proj: matches the config's exclusion"):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = []
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    _write_json(tmp_path / "config.json", cfg)
    with pytest.raises(ValueError, match="config_groups.group_0.weights.group_size must be 16"):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    _write_json(tmp_path / "config.json", {"architectures": []})
    with pytest.raises(ValueError, match='needs a "quantization_config" object'):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    st = _safetensors()
    _compressed_dir(tmp_path)
    p, s, _ = fp4kit.quantize(_rand(16, 64, 80), "nvfp4")
    st.save_file({"a.weight_packed": p, "a.weight_global_scale": np.array([2.0], np.float32)},
                 str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="a: quantized module is missing weight_scale"):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")
    st.save_file({"a.weight_packed": p, "a.weight_scale": s, "a.weight_global_scale": np.array([-2.0], np.float32)},
                 str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="a.weight_global_scale: must be positive and finite"):
        load_compressed_tensors_checkpoint(tmp_path, framework="numpy")


E, H, I = 3, 64, 32  # experts, hidden size, intermediate size (gpt-oss: 32/128, 2880, 2880)


def _gpt_oss_tensors(layer=1):
    pre = f"model.layers.{layer}.mlp.experts."
    gu = [fp4kit.quantize(_rand(2 * I, H, 90 + e), "mxfp4") for e in range(E)]
    dn = [fp4kit.quantize(_rand(H, I, 95 + e), "mxfp4") for e in range(E)]
    tensors = {
        pre + "gate_up_proj_blocks": np.stack([p for p, _, _ in gu]).reshape(E, 2 * I, H // 32, 16),
        pre + "gate_up_proj_scales": np.stack([s for _, s, _ in gu]),
        pre + "gate_up_proj_bias": _rand(E, 2 * I, 99),
        pre + "down_proj_blocks": np.stack([p for p, _, _ in dn]).reshape(E, H, I // 32, 16),
        pre + "down_proj_scales": np.stack([s for _, s, _ in dn]),
        pre + "down_proj_bias": _rand(E, H, 98),
    }
    return gu, dn, tensors


@pytest.mark.parametrize("deinterleave", [True, False])
def test_gpt_oss_experts_from_directory(tmp_path, deinterleave):
    st = _safetensors()
    gu, dn, tensors = _gpt_oss_tensors()
    st.save_file(tensors, str(tmp_path / "model.safetensors"))
    _write_json(tmp_path / "config.json", {"quantization_config": {"quant_method": "mxfp4"}})
    ex = load_gpt_oss_experts(tmp_path, layer=1, deinterleave=deinterleave, framework="numpy")
    assert ex.num_experts == E and ex.interleaved is not deinterleave
    for e in range(E):
        w = fp4kit.dequantize(gu[e][0], gu[e][1], 1.0, "mxfp4")
        if deinterleave:
            w = np.concatenate([w[0::2], w[1::2]])  # [gate; up]
        assert ex.gate_up[e].shape == (2 * I, H) and ex.down[e].shape == (H, I)
        _eq(ex.gate_up[e].dequantize(), w)
        _eq(ex.down[e].packed, dn[e][0])
        _eq(ex.down[e].dequantize(), fp4kit.dequantize(dn[e][0], dn[e][1], 1.0, "mxfp4"))
        if not deinterleave:
            _eq(ex.gate_up[e].packed, gu[e][0])
    bias = tensors["model.layers.1.mlp.experts.gate_up_proj_bias"]
    _eq(ex.gate_up_bias, np.concatenate([bias[:, 0::2], bias[:, 1::2]], axis=1) if deinterleave else bias)
    _eq(ex.down_bias, tensors["model.layers.1.mlp.experts.down_proj_bias"])
    if deinterleave:  # back to gpt-oss's order
        _eq(interleave_gate_up(ex.gate_up[0]).packed, gu[0][0])


def test_gpt_oss_experts_from_mapping_and_errors():
    _, dn, tensors = _gpt_oss_tensors(layer=0)
    ex = load_gpt_oss_experts(tensors, layer=0)  # a mapping works as well as a directory
    _eq(ex.down[2].packed, dn[2][0])
    pre = "model.layers.0.mlp.experts."
    with pytest.raises(ValueError, match="model.layers.5.mlp.experts.gate_up_proj_blocks: missing from the tensors"):
        load_gpt_oss_experts(tensors, layer=5)
    bad = dict(tensors)
    bad[pre + "down_proj_scales"] = bad[pre + "down_proj_scales"][:, :32]
    with pytest.raises(ValueError, match=re.escape(f"{pre}down_proj_scales: shape must be (3, 64, 1) for "
                                                   f"{pre}gate_up_proj_blocks of shape (3, 64, 2, 16)")):
        load_gpt_oss_experts(bad, layer=0)
    bad = dict(tensors)
    bad[pre + "gate_up_proj_blocks"] = bad[pre + "gate_up_proj_blocks"].reshape(E, 2 * I, H // 16, 8)
    with pytest.raises(ValueError, match=re.escape(f"{pre}gate_up_proj_blocks: shape must be (E, N, K/32, 16)")):
        load_gpt_oss_experts(bad, layer=0)
    bad = dict(tensors)
    bad[pre + "down_proj_scales"] = bad[pre + "down_proj_scales"].astype(np.int16)
    with pytest.raises(TypeError, match=f"{pre}down_proj_blocks/_scales, expert 0: scales: dtype must be uint8"):
        load_gpt_oss_experts(bad, layer=0)


def test_gpt_oss_mapping_to_device():
    torch = _torch()
    _, dn, tensors = _gpt_oss_tensors(layer=2)
    ex = load_gpt_oss_experts(tensors, layer=2, device="cpu")
    assert isinstance(ex.down[1].packed, torch.Tensor) and isinstance(ex.gate_up_bias, torch.Tensor)
    _eq(ex.down[1].packed.numpy(), dn[1][0])
    bias = tensors["model.layers.2.mlp.experts.gate_up_proj_bias"]
    _eq(ex.gate_up_bias.numpy(), np.concatenate([bias[:, 0::2], bias[:, 1::2]], axis=1))


def test_gpt_oss_directory_errors(tmp_path):
    st = _safetensors()
    _, _, tensors = _gpt_oss_tensors(layer=0)
    st.save_file(tensors, str(tmp_path / "model.safetensors"))
    _write_json(tmp_path / "config.json", {"quantization_config": {"quant_method": "modelopt"}})
    with pytest.raises(ValueError, match='quant_method must be "mxfp4"'):
        load_gpt_oss_experts(tmp_path, layer=0, framework="numpy")
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match=f"model.layers.3.mlp.experts.gate_up_proj_blocks: missing from {tmp_path}"):
        load_gpt_oss_experts(tmp_path, layer=3, framework="numpy")


# ---- torch arrays (CPU) ----------------------------------------------------------------------------------
def test_torch_weights_on_cpu():
    torch = _torch()
    w = torch.from_numpy(_rand(32, 64, 110))
    fw = FP4Weight.from_float(w, "nvfp4")
    p, s, ts = fp4kit.quantize(w.numpy(), "nvfp4")
    assert isinstance(fw.packed, torch.Tensor) and fw.tensor_scale.dtype == torch.float32
    _eq(fw.packed.numpy(), p)
    deq = fw.dequantize()
    assert isinstance(deq, torch.Tensor) and deq.dtype == torch.float32
    _eq(deq.numpy(), fp4kit.dequantize(p, s, ts, "nvfp4"))
    # float8_e4m3fn scales are read as their raw bytes.
    fm = FP4Weight.from_modelopt(torch.from_numpy(p), torch.from_numpy(s).view(torch.float8_e4m3fn),
                                 torch.tensor(ts, dtype=torch.float32))
    _eq(fm.scales.numpy(), s)
    fw.prepack()
    _eq(fw.prepacked.numpy(), fp4kit.prepack(p, s, ts, "nvfp4"))
    assert "arrays=torch" in repr(fw) and "device=cpu" in repr(fw)
    moved = FP4Weight.from_modelopt(p, s, ts).to("cpu")  # numpy -> torch
    assert isinstance(moved.packed, torch.Tensor) and moved.device == "cpu"
    _eq(moved.dequantize().numpy(), deq.numpy())
    assert check_nibble_order(fw, w[5].to(torch.bfloat16), row=5) == "ok"
    mixed = fuse([fw, moved])
    _eq(mixed.dequantize().numpy(), np.concatenate([deq.numpy(), deq.numpy()]))
    with pytest.raises(ValueError, match="weights\\[1\\]: arrays on cpu \\(ndarray\\)"):
        fuse([fw, FP4Weight.from_modelopt(p, s, ts)])
    with pytest.raises(TypeError, match="weight_scale: must be the same kind of array as weight"):
        FP4Weight.from_modelopt(torch.from_numpy(p), s, ts)


# ---- ModelOpt per-expert NVFP4 modules -------------------------------------------------------------------
def _expert_modules(e, i, h, layer=0, prefix="model.layers.{layer}.mlp.experts.{expert}.",
                    names=("gate_proj", "up_proj", "down_proj")):
    """{module: FP4Weight} as load_modelopt_checkpoint returns it, gate and up of different magnitudes (so
    their tensor scales differ), and the dequantized float matrices."""
    mods, ref = {}, {}
    for x in range(e):
        for j, (proj, n, k) in enumerate(zip(names, (i, i, h), (h, h, i))):
            p, sc, ts = fp4kit.quantize(_rand(n, k, 100 * x + j, 10.0 ** (j - 1)), "nvfp4")
            key = prefix.format(layer=layer, expert=x) + proj
            mods[key] = FP4Weight.from_modelopt(p, sc, np.array(ts, np.float32))
            ref[key] = fp4kit.dequantize(p, sc, ts, "nvfp4")
    return mods, ref


@pytest.mark.parametrize("names,prefix", [
    (("gate_proj", "up_proj", "down_proj"), "model.layers.{layer}.mlp.experts.{expert}."),   # Qwen3-MoE, DeepSeek
    (("w1", "w3", "w2"), "model.layers.{layer}.block_sparse_moe.experts.{expert}.")])       # Mixtral
def test_modelopt_experts_from_modules(names, prefix):
    mods, ref = _expert_modules(3, 32, 64, layer=2, prefix=prefix, names=names)
    mods["model.layers.2.mlp.gate"] = np.zeros((3, 64), np.float32)  # other tensors are ignored
    ex = load_modelopt_experts(mods, 2, prefix=prefix, names=names)
    assert ex.num_experts == 3
    for x in range(3):
        pre = prefix.format(layer=2, expert=x)
        assert ex.gate_up[x].shape == (64, 64) and ex.down[x].shape == (64, 32)
        _eq(ex.gate_up[x].dequantize(), np.concatenate([ref[pre + names[0]], ref[pre + names[1]]]))
        _eq(ex.down[x].dequantize(), ref[pre + names[2]])


def test_modelopt_experts_errors():
    mods, _ = _expert_modules(2, 32, 64)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.experts.0.gate_proj: missing \(no experts of layer 1"):
        load_modelopt_experts(mods, 1)
    bad = dict(mods)
    del bad["model.layers.0.mlp.experts.1.down_proj"]
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.1.down_proj: missing \(expert 1 of 2\)"):
        load_modelopt_experts(bad, 0)
    bad = dict(mods)
    bad["model.layers.0.mlp.experts.0.up_proj"] = np.zeros((32, 64), np.float32)
    with pytest.raises(ValueError, match="up_proj: must be an NVFP4 module"):
        load_modelopt_experts(bad, 0)
    bad = dict(mods)
    bad["model.layers.0.mlp.experts.0.up_proj"] = FP4Weight.from_float(_rand(32, 64, 9), "mxfp4")
    with pytest.raises(ValueError, match="up_proj: must be NVFP4"):
        load_modelopt_experts(bad, 0)
    bad = dict(mods)
    bad["model.layers.0.mlp.experts.1.down_proj"] = FP4Weight.from_float(_rand(64, 48, 9), "nvfp4")
    with pytest.raises(ValueError, match="expert 1: gate and up must be"):
        load_modelopt_experts(bad, 0)
    more, _ = _expert_modules(1, 16, 64)
    bad = dict(mods)
    for proj in ("gate_proj", "up_proj"):
        bad[f"model.layers.0.mlp.experts.1.{proj}"] = more[f"model.layers.0.mlp.experts.0.{proj}"]
    bad["model.layers.0.mlp.experts.1.down_proj"] = FP4Weight.from_float(_rand(64, 16, 9), "nvfp4")
    with pytest.raises(ValueError, match="every expert of a layer has one shape"):
        load_modelopt_experts(bad, 0)
    with pytest.raises(ValueError, match="names: must be three module names"):
        load_modelopt_experts(mods, 0, names=("gate_proj", "up_proj"))
    with pytest.raises(ValueError, match="layer: must be an int >= 0"):
        load_modelopt_experts(mods, -1)


def test_modelopt_experts_from_directory(tmp_path):
    st = _safetensors()
    tensors, ref = {}, {}
    for x in range(2):
        for j, (proj, n, k) in enumerate((("gate_proj", 32, 64), ("up_proj", 32, 64), ("down_proj", 64, 32))):
            p, sc, ts = fp4kit.quantize(_rand(n, k, 10 * x + j), "nvfp4")
            mod = f"model.layers.0.mlp.experts.{x}.{proj}"
            tensors[mod + ".weight"], tensors[mod + ".weight_scale"] = p, sc
            tensors[mod + ".weight_scale_2"] = np.array(ts, np.float32)
            ref[mod] = fp4kit.dequantize(p, sc, ts, "nvfp4")
    st.save_file(tensors, str(tmp_path / "model.safetensors"))
    _write_json(tmp_path / "hf_quant_config.json", {"quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    ex = load_modelopt_experts(tmp_path, 0, framework="numpy")
    assert ex.num_experts == 2
    for x in range(2):
        pre = f"model.layers.0.mlp.experts.{x}."
        _eq(ex.gate_up[x].dequantize(), np.concatenate([ref[pre + "gate_proj"], ref[pre + "up_proj"]]))
        _eq(ex.down[x].dequantize(), ref[pre + "down_proj"])
