"""Host (numpy) API of fp4kit: runs everywhere, no GPU needed.

Known answers are derived from the format spec (DESIGN.md section 2), not from the implementation.
"""
import numpy as np
import pytest

import fp4kit

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
FORMATS = ["nvfp4", "mxfp4"]


def codes(packed):
    """uint8 [N, K/2] -> E2M1 codes [N, K] (low nibble = even K index)."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0xF, packed >> 4
    return out


def decode_e2m1(c):
    return np.where(c & 8, -1.0, 1.0).astype(np.float32) * E2M1[c & 7]


def rel_l2(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64)))


def test_version():
    assert isinstance(fp4kit.__version__, str) and fp4kit.__version__.count(".") == 2


def test_group_size():
    assert fp4kit.group_size("nvfp4") == 16 and fp4kit.group_size("mxfp4") == 32
    with pytest.raises(ValueError, match="format"):
        fp4kit.group_size("int4")


def test_cuda_device_count_never_raises():
    assert fp4kit.cuda_device_count() >= 0


# ---- known answers ---------------------------------------------------------------------------------------
def test_nvfp4_grid_values_exact():
    # One row spanning the whole E2M1 grid with amax 6: tensor_scale = 6 / (6 * 448) = 1/448, block scale
    # e4m3(6 / (6 / 448)) = 448 = 0x7E, so every element maps back to its own code.
    grid = np.concatenate([E2M1, -E2M1[1:], [0.0]]).astype(np.float32)  # 16 values
    w = grid.reshape(1, 16)
    packed, scales, ts = fp4kit.quantize(w, "nvfp4")
    assert ts == pytest.approx(1.0 / 448.0, rel=1e-6)
    assert scales.tolist() == [[0x7E]]
    expect = np.array([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 0], dtype=np.uint8)
    np.testing.assert_array_equal(codes(packed)[0], expect)
    assert packed[0, 0] == 0x10 and packed[0, 1] == 0x32  # low nibble first
    np.testing.assert_allclose(fp4kit.dequantize(packed, scales, ts, "nvfp4"), w, rtol=1e-6, atol=0)


def test_mxfp4_scale_is_floor_log2_amax_minus_2():
    # Block amax 6 * 2^3 = 48: e = floor(log2 48) - 2 + 127 = 5 - 2 + 127 = 130 (2^3); elements exact.
    row = np.tile(np.concatenate([E2M1, -E2M1]), 2).astype(np.float32) * 8.0
    w = np.stack([row, np.zeros(32, np.float32), row / 1024.0])
    packed, scales, ts = fp4kit.quantize(w, "mxfp4")
    assert ts == 1.0
    assert scales[:, 0].tolist() == [130, 0, 120]  # an all-zero block gets e = 0
    np.testing.assert_array_equal(fp4kit.dequantize(packed, scales, 1.0, "mxfp4"), w)


def test_zero_and_negative_zero_encode_as_plus_zero():
    w = np.zeros((2, 32), np.float32)
    w[1, :] = -0.0
    for fmt in FORMATS:
        packed, scales, ts = fp4kit.quantize(w, fmt)
        assert not packed.any(), fmt
        assert not fp4kit.dequantize(packed, scales, ts, fmt).any()
    assert fp4kit.quantize(w, "nvfp4")[2] == 1.0  # amax == 0 -> tensor scale 1


def test_nan_block_gets_nan_scale():
    w = np.ones((1, 64), np.float32)
    w[0, 3] = np.nan
    _, s_nv, _ = fp4kit.quantize(w, "nvfp4")
    assert s_nv[0, 0] & 0x7F == 0x7F and (s_nv[0, 1:] & 0x7F != 0x7F).all()
    _, s_mx, _ = fp4kit.quantize(w, "mxfp4")
    assert s_mx[0, 0] == 0xFF and s_mx[0, 1] != 0xFF


def test_dequantize_matches_spec_formula():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    packed, scales, ts = fp4kit.quantize(w, "mxfp4")
    ref = decode_e2m1(codes(packed)) * np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=1)
    np.testing.assert_array_equal(fp4kit.dequantize(packed, scales, 1.0, "mxfp4"), ref.astype(np.float32))


def test_reference_gemm_small():
    x = np.array([[1, 2], [3, 4], [-1, 0.5]], np.float32)
    w = np.array([[1, 0], [0, 1], [2, -1], [0.25, 0.25]], np.float32)
    b = np.array([0, 1, 0, -1], np.float32)
    y = fp4kit.reference_gemm(x, w, b)
    assert y.dtype == np.float64 and y.shape == (3, 4)
    np.testing.assert_array_equal(y, x.astype(np.float64) @ w.T.astype(np.float64) + b)
    np.testing.assert_array_equal(fp4kit.reference_gemm(x, w), x.astype(np.float64) @ w.T)


# ---- round trips -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_roundtrip(fmt, dtype):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((33, 256)).astype(dtype)
    packed, scales, ts = fp4kit.quantize(w, fmt)
    g = fp4kit.group_size(fmt)
    assert packed.shape == (33, 128) and scales.shape == (33, 256 // g)
    assert packed.dtype == np.uint8 and scales.dtype == np.uint8
    wq = fp4kit.dequantize(packed, scales, ts, fmt)
    assert wq.dtype == np.float32 and wq.shape == w.shape
    assert rel_l2(wq, w.astype(np.float32)) < 0.15  # E2M1 with per-block scales: ~0.09-0.11 on N(0, 1)
    # Values already on the grid are fixed points (MXFP4: exact; scales are powers of two).
    if fmt == "mxfp4":
        p2, s2, _ = fp4kit.quantize(wq, fmt)
        np.testing.assert_array_equal(fp4kit.dequantize(p2, s2, 1.0, fmt), wq)


def test_given_tensor_scale_is_used():
    w = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    _, _, ts = fp4kit.quantize(w, "nvfp4", tensor_scale=0.125)
    assert ts == 0.125


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(16, 512), (200, 2880), (7, 96), (1, 32)])
def test_prepack_unpack_bit_exact(fmt, n, k):
    rng = np.random.default_rng(n * k)
    g = fp4kit.group_size(fmt)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    if fmt == "nvfp4":
        # finite positive E4M3 scales (0x01..0x7E): prepack rewrites the blocks of negative and zero scales
        # (their own test below)
        scales = rng.integers(1, 0x7F, (n, k // g), dtype=np.uint8)
    else:  # E8M0 within 2^40 of each other: no block is flushed, so unpack restores every byte
        scales = rng.integers(107, 148, (n, k // g), dtype=np.uint8)
    ts = 0.5 if fmt == "nvfp4" else None
    buf = fp4kit.prepack(packed, scales, ts, fmt)
    layout = fp4kit.packed_layout(fmt, n, k)
    assert buf.dtype == np.uint8 and buf.shape == (layout["total_bytes"],)
    assert layout["n_pad"] >= n and layout["n_pad"] % 16 == 0 and layout["k_pad"] >= k
    p2, s2 = fp4kit.unpack(buf, n, k, fmt)
    np.testing.assert_array_equal(p2, packed)
    np.testing.assert_array_equal(s2, scales)
    assert np.array_equal(fp4kit.prepack(packed, scales, ts, fmt), buf)  # deterministic


def test_prepack_unpack_negative_and_zero_scales():
    # NVFP4 blocks with negative or zero scales: prepack stores the sign in the codes and zeroes the codes
    # of zero-scale blocks; unpack gives the same dequantised values, the positive scale byte for a
    # negative one, and the +-0 and NaN scale bytes themselves.
    rng = np.random.default_rng(7)
    n, k = 24, 160
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 256, (n, k // 16), dtype=np.uint8)
    scales[(scales & 0x7F) == 0x7F] = 0x3C  # no NaN here: NaN rows are compared apart below
    scales[0, :3] = [0x00, 0x80, 0x81]
    p2, s2 = fp4kit.unpack(fp4kit.prepack(packed, scales, 1.0, "nvfp4"), n, k, "nvfp4")
    want = fp4kit.dequantize(packed, scales, 1.0, "nvfp4")
    np.testing.assert_array_equal(fp4kit.dequantize(p2, s2, 1.0, "nvfp4"), want)  # +0 == -0
    neg = (scales & 0x80) != 0
    np.testing.assert_array_equal(s2, np.where(neg & ((scales & 0x7F) != 0), scales & 0x7F, scales))
    scales[3, 2] = 0xFF
    p3, s3 = fp4kit.unpack(fp4kit.prepack(packed, scales, 1.0, "nvfp4"), n, k, "nvfp4")
    assert s3[3, 2] == 0xFF


# ---- argument errors -------------------------------------------------------------------------------------
def test_errors_name_the_argument_and_rule():
    w = np.ones((4, 64), np.float32)
    with pytest.raises(TypeError, match=r"w: dtype must be .*float64"):
        fp4kit.quantize(w.astype(np.float64))
    with pytest.raises(TypeError, match=r"w: dtype"):
        fp4kit.quantize(w.astype(np.int32))
    with pytest.raises(ValueError, match=r"w: must have 2 dimension"):
        fp4kit.quantize(w.reshape(-1))
    with pytest.raises(ValueError, match=r"w: must be C-contiguous"):
        fp4kit.quantize(np.asfortranarray(w))
    with pytest.raises(ValueError, match=r"w: must be C-contiguous"):
        fp4kit.quantize(np.ones((4, 128), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=r"multiple of the group size 16"):
        fp4kit.quantize(np.ones((4, 40), np.float32), "nvfp4")
    with pytest.raises(ValueError, match=r"multiple of the group size 32"):
        fp4kit.quantize(np.ones((4, 48), np.float32), "mxfp4")
    with pytest.raises(ValueError, match=r"format: must be"):
        fp4kit.quantize(w, "fp4")
    with pytest.raises(ValueError, match=r"tensor_scale"):
        fp4kit.quantize(w, "mxfp4", tensor_scale=1.0)

    packed, scales, ts = fp4kit.quantize(w)
    with pytest.raises(TypeError, match=r"packed: dtype must be uint8"):
        fp4kit.dequantize(packed.astype(np.int16), scales, ts)
    with pytest.raises(ValueError, match=r"scales: shape must be \(4, 4\)"):
        fp4kit.dequantize(packed, scales[:, :2].copy(), ts)
    with pytest.raises(TypeError, match=r"x: dtype must be float32"):
        fp4kit.reference_gemm(w.astype(np.float16), w)
    with pytest.raises(ValueError, match=r"w: w.shape\[1\] must equal"):
        fp4kit.reference_gemm(w, w[:, :32].copy())
    with pytest.raises(ValueError, match=r"bias: shape must be"):
        fp4kit.reference_gemm(w, w, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"buffer: must hold"):
        fp4kit.unpack(np.zeros(16, np.uint8), 4, 64, "nvfp4")
    p_mx, s_mx, ts_mx = fp4kit.quantize(w, "mxfp4")
    assert np.array_equal(fp4kit.prepack(p_mx, s_mx, ts_mx, "mxfp4"), fp4kit.prepack(p_mx, s_mx, None, "mxfp4"))
    with pytest.raises(ValueError, match=r"tensor_scale: MXFP4 has no tensor scale"):
        fp4kit.prepack(p_mx, s_mx, 2.0, "mxfp4")
    with pytest.raises(ValueError):  # from the core: K rule
        fp4kit.packed_layout("mxfp4", 16, 48)


def test_tuning_table_round_trip(tmp_path):
    path = tmp_path / "h200.tuning"
    path.write_text("fp4kit-tuning 1\ndevice NVIDIA H200\nnvfp4 bf16 8192 8192 16 m16_r1_w8_b3_c4x2\n")
    fp4kit.load_tuning_table(str(path))
    try:
        assert fp4kit.dispatch_config("nvfp4", "bfloat16", 9, 8192, 8192, "NVIDIA H200").startswith("m16_r1_w8_b3_c4x2: tuning table")
        assert "smallest n_tiles" in fp4kit.dispatch_config("nvfp4", "bfloat16", 9, 8192, 8192, "NVIDIA A100-SXM4-80GB",
                                                            cc_major=8, sms=108)
        path.write_text("fp4kit-tuning 1\ndevice X\nnvfp4 bf16 8192 8192 16 no_such_config\n")
        with pytest.raises(ValueError, match="line 3: 'no_such_config' is not a config"):
            fp4kit.load_tuning_table(str(path))
        # the good table stays loaded
        assert "tuning table" in fp4kit.dispatch_config("nvfp4", "bfloat16", 16, 8192, 8192, "NVIDIA H200")
    finally:
        fp4kit.clear_tuning_table()
    assert "smallest n_tiles" in fp4kit.dispatch_config("nvfp4", "bfloat16", 8, 8192, 8192, "NVIDIA H200")
    # From 9 tokens on Hopper, the prefill kernel's narrow tiles where its time model is the faster.
    assert "the prefill kernel, m64n16 wgmmas" in fp4kit.dispatch_config("nvfp4", "bfloat16", 9, 8192, 8192, "NVIDIA H200")


def test_dispatch_config_by_compute_capability():
    # The wgmma prefill kernel from m = 33 on cc 9.x; on sm_80-89 the mma.sync prefill kernel from m = 65,
    # except on layers of >= 2^28 weights (the decode kernel in 64-token blocks).
    assert fp4kit.dispatch_config("nvfp4", "bfloat16", 4096, 8192, 8192, "NVIDIA H200").startswith("p")
    a100 = fp4kit.dispatch_config("nvfp4", "bfloat16", 4096, 8192, 8192, "NVIDIA A100-SXM4-80GB", cc_major=8, sms=108)
    assert a100.startswith("a128_"), a100
    a100 = fp4kit.dispatch_config("nvfp4", "bfloat16", 64, 8192, 8192, "NVIDIA A100-SXM4-80GB", cc_major=8, sms=108)
    assert a100.startswith("m64_"), a100
    a100 = fp4kit.dispatch_config("nvfp4", "bfloat16", 4096, 57344, 8192, "NVIDIA A100-SXM4-80GB", cc_major=8, sms=108)
    assert a100.startswith("m64_"), a100
    with pytest.raises(ValueError, match="cc_major: must be >= 8"):
        fp4kit.dispatch_config("nvfp4", "bfloat16", 1, 64, 64, "x", cc_major=7)
