"""torch.ops.fp4kit: schemas, fake implementations, torch.compile and CUDA graphs.

CPU part (needs torch only): opcheck of every op on CPU tensors, the CPU GEMM against the numpy oracle,
torch.compile(fullgraph=True). GPU part (needs a CUDA device): opcheck on CUDA tensors, CUDA vs CPU op
results, compile on CUDA, one CUDA-graph capture replayed with changing inputs. Skips say why.
"""
import numpy as np
import pytest

import fp4kit

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'fp4kit[torch]')")
import fp4kit.ops  # noqa: E402,F401  (registers torch.ops.fp4kit)
from torch.library import opcheck  # noqa: E402

_GPU = torch.cuda.is_available() and fp4kit.cuda_device_count() > 0
needs_gpu = pytest.mark.skipif(not _GPU, reason="no CUDA device visible to torch and fp4kit")


def _rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _weight(fmt, n, k, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    p, s, ts = torch.ops.fp4kit.quantize(w.to(device), fmt)
    buf = torch.ops.fp4kit.prepack(p, s, ts if fmt == "nvfp4" else None, fmt, n, k)
    return p, s, ts, buf


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_opcheck_cpu(fmt):
    n, k = 40, 320
    w = torch.randn(n, k)
    opcheck(torch.ops.fp4kit.quantize.default, (w, fmt))
    p, s, ts, buf = _weight(fmt, n, k, 1)
    opcheck(torch.ops.fp4kit.prepack.default, (p, s, ts if fmt == "nvfp4" else None, fmt, n, k))
    x = torch.randn(3, k).bfloat16()
    opcheck(torch.ops.fp4kit.gemm.default, (x, buf, fmt, n, k))
    opcheck(torch.ops.fp4kit.gemm.default, (x, buf, fmt, n, k, torch.randn(n).bfloat16()))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_gemm_matches_oracle(fmt, dtype):
    n, k = 72, 2880
    p, s, ts, buf = _weight(fmt, n, k, 2)
    x = torch.randn(5, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    y = torch.ops.fp4kit.gemm(x, buf, fmt, n, k, bias)
    assert y.shape == (5, n) and y.dtype == dtype
    w = fp4kit.dequantize(p.numpy(), s.numpy(), float(ts), fmt)
    ref = fp4kit.reference_gemm(x.float().numpy(), w, bias.float().numpy())
    assert _rel_l2(y.double().numpy(), ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)


def test_compile_fullgraph_cpu():
    n, k = 48, 256
    _, _, _, buf = _weight("nvfp4", n, k, 3)

    def f(x):
        return torch.relu(torch.ops.fp4kit.gemm(x, buf, "nvfp4", n, k)) * 2

    cf = torch.compile(f, fullgraph=True)
    for m in (1, 4, 9):  # changing shapes: the fake implementation carries them
        x = torch.randn(m, k).bfloat16()
        assert torch.equal(cf(x), f(x))


def test_gemm_shape_error():
    n, k = 16, 64
    _, _, _, buf = _weight("nvfp4", n, k, 4)
    with pytest.raises(ValueError, match="last dimension must be k = 64"):
        torch.ops.fp4kit.gemm(torch.randn(2, 32).bfloat16(), buf, "nvfp4", n, k)


@needs_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_opcheck_cuda(fmt):
    n, k = 40, 320
    opcheck(torch.ops.fp4kit.quantize.default, (torch.randn(n, k, device="cuda"), fmt))
    p, s, ts, buf = _weight(fmt, n, k, 5, "cuda")
    opcheck(torch.ops.fp4kit.prepack.default, (p, s, ts if fmt == "nvfp4" else None, fmt, n, k))
    x = torch.randn(3, k, device="cuda").bfloat16()
    opcheck(torch.ops.fp4kit.gemm.default, (x, buf, fmt, n, k))


@needs_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cuda_matches_cpu_op(fmt):
    n, k = 200, 2880
    _, _, _, buf = _weight(fmt, n, k, 6)
    x = torch.randn(7, k).bfloat16()
    y_cpu = torch.ops.fp4kit.gemm(x, buf, fmt, n, k)
    y_gpu = torch.ops.fp4kit.gemm(x.cuda(), buf.cuda(), fmt, n, k)
    assert _rel_l2(y_gpu.double().cpu().numpy(), y_cpu.double().numpy()) < 1e-2


@needs_gpu
def test_compile_fullgraph_cuda():
    n, k = 256, 1024
    _, _, _, buf = _weight("mxfp4", n, k, 7, "cuda")
    f = lambda x: torch.ops.fp4kit.gemm(x, buf, "mxfp4", n, k).float().sum(-1)  # noqa: E731
    cf = torch.compile(f, fullgraph=True)
    for m in (1, 16, 33):
        x = torch.randn(m, k, device="cuda").bfloat16()
        torch.testing.assert_close(cf(x), f(x))


@needs_gpu
@pytest.mark.parametrize("m", [16, 100])
def test_cuda_graph_capture_replay_changing_inputs(m):
    # Large enough that stream-K splits row groups (m = 16) or that the prefill kernel stages X in lane
    # order (m = 100): the captured workspace is fresh memory with only its counters cleared.
    n, k = 4096 + 48, 4096
    _, _, _, buf = _weight("nvfp4", n, k, 8, "cuda")
    x_static = torch.randn(m, k, device="cuda").bfloat16()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as torch.cuda.graph requires
        torch.ops.fp4kit.gemm(x_static, buf, "nvfp4", n, k)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_static = torch.ops.fp4kit.gemm(x_static, buf, "nvfp4", n, k)
    for seed in range(3):
        x_static.copy_(torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16())
        g.replay()
        ref = torch.ops.fp4kit.gemm(x_static, buf, "nvfp4", n, k)  # eager, after the replay
        torch.cuda.synchronize()
        assert torch.equal(y_static, ref)  # same kernels, same order: bitwise equal
