"""GPU path through fp4kit.torch_ops, checked against the host oracle (fp4kit.reference_gemm on the
dequantized weights). Skipped, with the reason printed by `pytest -rs`, without torch or a CUDA device."""
import numpy as np
import pytest

import fp4kit

try:
    import torch
except ImportError:  # the CPU-only install: these tests report as skipped
    torch = None


def _skip_reason():
    if torch is None:
        return "torch is not installed (pip install 'fp4kit[torch]')"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if fp4kit.cuda_device_count() == 0:
        return "fp4kit's CUDA runtime sees no device (is the driver older than the CUDA toolkit fp4kit was built with?)"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
if _REASON is None:
    from fp4kit import torch_ops

FORMATS = ["nvfp4", "mxfp4"]
ACTS = {"bfloat16": (lambda: torch.bfloat16, 1e-2), "float16": (lambda: torch.float16, 2e-3)}
# n and k that miss the tiles on purpose (n % 16, k % 64 / 128), plus a gpt-oss K (2880).
SHAPES = [(200, 2880), (1000, 96), (40, 4128)]
SHAPES_NVFP4_ONLY = [(24, 1040)]  # K % 32 != 0: NVFP4's group of 16 only


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[0] *= 1e-5  # tiny row: NVFP4 subnormal block scales
    if n > 2:
        w[2, :64] = 0  # all-zero blocks
    return w


def _rel_l2(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n,k", [(200, 2880), (7, 96)])
def test_quantize_gpu_bit_identical_to_cpu(fmt, dtype, n, k):
    w = _weights(n, k, seed=n + k).to(getattr(torch, dtype))
    w[1, 5] = float("nan")  # a NaN block: NaN scale, zero codes, and no effect on the tensor scale
    p_cpu, s_cpu, t_cpu = torch_ops.quantize(w, fmt)
    p_gpu, s_gpu, t_gpu = torch_ops.quantize(w.cuda(), fmt)
    assert p_gpu.is_cuda and s_gpu.is_cuda and t_gpu.is_cuda
    assert torch.equal(p_gpu.cpu(), p_cpu)
    assert torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(t_gpu.cpu().view(torch.int32), t_cpu.view(torch.int32))
    if fmt == "nvfp4":  # a given tensor scale is used as is
        p2, s2, t2 = torch_ops.quantize(w.cuda(), fmt, tensor_scale=0.01)
        p1, s1, t1 = torch_ops.quantize(w, fmt, tensor_scale=0.01)
        assert torch.equal(p2.cpu(), p1) and torch.equal(s2.cpu(), s1) and float(t2) == float(t1) == np.float32(0.01)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_prepack_gpu_bit_identical_to_cpu(fmt, n, k):
    packed, scales, ts = fp4kit.quantize(_weights(n, k, seed=7).numpy(), fmt)
    ts_arg = ts if fmt == "nvfp4" else None
    buf_cpu = fp4kit.prepack(packed, scales, ts_arg, fmt)
    buf_gpu = torch_ops.prepack(torch.from_numpy(packed).cuda(), torch.from_numpy(scales).cuda(), ts_arg, fmt, n, k)
    assert buf_gpu.dtype == torch.uint8 and buf_gpu.numel() == buf_cpu.size
    assert np.array_equal(buf_gpu.cpu().numpy(), buf_cpu)


def _gemm_case(fmt, act, m, n, k, with_bias):
    dtype, tol = ACTS[act][0](), ACTS[act][1]
    packed, scales, ts = fp4kit.quantize(_weights(n, k, seed=m * 31 + n).numpy(), fmt)
    w_deq = fp4kit.dequantize(packed, scales, ts, fmt)
    buf = torch_ops.prepack(torch.from_numpy(packed).cuda(), torch.from_numpy(scales).cuda(),
                            ts if fmt == "nvfp4" else None, fmt, n, k)
    g = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poison: every element must be written
    y = torch_ops.gemm(x.cuda(), buf, fmt, n, k, bias=bias.cuda() if with_bias else None, out=out)
    assert y.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    ref = fp4kit.reference_gemm(x.float().numpy(), w_deq, bias.float().numpy() if with_bias else None)
    got = y.double().cpu().numpy()
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} non-finite outputs"
    err = _rel_l2(got, ref)
    assert err < tol, f"rel-L2 {err:.3g} >= {tol} ({fmt}, {act}, m={m}, n={n}, k={k}, bias={with_bias})"
    return x, buf, bias, y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("m", [1, 7, 33])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_gemm_matches_reference(fmt, act, m, n, k, with_bias):
    _gemm_case(fmt, act, m, n, k, with_bias)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("n,k", SHAPES_NVFP4_ONLY)
def test_gemm_nvfp4_k_not_multiple_of_32(act, m, n, k):
    _gemm_case("nvfp4", act, m, n, k, with_bias=True)


def test_gemm_deterministic_and_leading_dims():
    x, buf, bias, y = _gemm_case("nvfp4", "bfloat16", 33, 200, 2880, with_bias=True)
    y2 = torch_ops.gemm(x.cuda().view(3, 11, 2880), buf, "nvfp4", 200, 2880, bias=bias.cuda())
    assert y2.shape == (3, 11, 200)
    assert torch.equal(y2.view(33, 200), y)  # bitwise: the same call gives the same bits


def test_gemm_rejects_bad_arguments():
    n, k = 64, 128
    packed, scales, ts = fp4kit.quantize(_weights(n, k, seed=1).numpy(), "nvfp4")
    buf = torch_ops.prepack(torch.from_numpy(packed).cuda(), torch.from_numpy(scales).cuda(), ts, "nvfp4", n, k)
    x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        torch_ops.gemm(x.cpu(), buf, "nvfp4", n, k)
    with pytest.raises(TypeError, match="x: dtype"):
        torch_ops.gemm(x.float(), buf, "nvfp4", n, k)
    with pytest.raises(ValueError, match="x: must be contiguous"):
        torch_ops.gemm(torch.randn(k, 4, device="cuda", dtype=torch.bfloat16).t(), buf, "nvfp4", n, k)
    with pytest.raises(ValueError, match="x: last dimension must be k"):
        torch_ops.gemm(x[:, :64].contiguous(), buf, "nvfp4", n, k)
    with pytest.raises(ValueError, match="packed_buffer: must hold"):
        torch_ops.gemm(x, buf[:100], "nvfp4", n, k)
    with pytest.raises(TypeError, match="bias: dtype"):
        torch_ops.gemm(x, buf, "nvfp4", n, k, bias=torch.zeros(n, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="out: shape"):
        torch_ops.gemm(x, buf, "nvfp4", n, k, out=torch.empty(4, n + 1, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="format"):
        torch_ops.gemm(x, buf, "fp4", n, k)
    with pytest.raises(ValueError, match="multiple of the group size"):
        torch_ops.quantize(torch.randn(4, 40, device="cuda"), "nvfp4")
