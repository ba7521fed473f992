"""torch.ops.fp4kit.fused_moe, fp4kit.moe.stack_experts and the fused_moe wrappers.

BF16 experts (format "bf16": bfloat16 [E, n, k] stacks) run through the same tests as the FP4 formats where the
test is about the layer, plus their own stacking and argument checks.

CPU part (needs torch only): stack_experts' layout and round trip, the CPU op against fp4kit.moe.moe_reference,
out-of-range and repeated ids, opcheck, torch.compile, argument errors, the eager workspace rule, `import fp4kit`
without torch. GPU part (needs a CUDA device): the fused kernels against moe_reference on the same dequantized
experts (rel-L2 < 1e-2, bf16 out) over formats, activations, gate/up layouts, biases, routing modes and edge-case
routings, T up to 200 (passes of 64 tokens; from 128 on the tensor-core path on Hopper), top-k 1..8, E 8..64 with H and I not multiples of 64; NaN rows for
bad or repeated ids, determinism, workspace reuse across shapes and GEMMs, CUDA-graph replay with changing
routings, torch.compile and opcheck. float16 activations: the CPU op, opcheck and argument errors, and on the GPU
the kernels against the reference at the dense FP16 GEMM tests' gate (rel-L2 < 2e-3; BF16 experts, whose
intermediates stay bfloat16, 1e-2), T = 1, 37, 64, 100, 200. Skips say why.
"""
import math
import subprocess
import sys

import pytest

import fp4kit

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'fp4kit[torch]')")
import fp4kit.ops  # noqa: E402,F401  (registers torch.ops.fp4kit)
from fp4kit import moe  # noqa: E402
from fp4kit.ops import dequantize_packed  # noqa: E402
from fp4kit.weights import FP4Weight, fuse  # noqa: E402
from torch.library import opcheck  # noqa: E402

_GPU = torch.cuda.is_available() and fp4kit.cuda_device_count() > 0
needs_gpu = pytest.mark.skipif(not _GPU, reason="no CUDA device visible to torch and fp4kit")

FORMATS = ["nvfp4", "mxfp4"]
ALL_FORMATS = FORMATS + ["bf16"]  # FP4 experts and BF16 experts
H, I = 160, 96  # multiples of 32 (MXFP4 groups along K), not of 64


def _rel_l2(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


class Layer:
    """E random experts (FP4Weight on the CPU, or bfloat16 tensors for fmt "bf16": the reference's input) and their
    stacked buffers on `device`."""

    def __init__(self, fmt, e, h, i, seed, device="cpu", bias=False, scale_gate_up=1.0, split_gate_up=False,
                 bias_dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(seed)
        self.fmt, self.e, self.h, self.i = fmt, e, h, i
        wgu = [torch.randn(2 * i, h, generator=g) * scale_gate_up / math.sqrt(h) for _ in range(e)]
        wd = [torch.randn(h, i, generator=g) / math.sqrt(i) for _ in range(e)]
        if fmt == "bf16":
            self.wgu = [w.bfloat16() for w in wgu]
        elif split_gate_up:  # NVFP4 gate and up with different tensor scales, fused with per-row scales
            self.wgu = [fuse([FP4Weight.from_float(w[:i] * 4.0, fmt), FP4Weight.from_float(w[i:], fmt)]) for w in wgu]
        else:
            self.wgu = [FP4Weight.from_float(w, fmt) for w in wgu]
        self.wd = [w.bfloat16() for w in wd] if fmt == "bf16" else [FP4Weight.from_float(w, fmt) for w in wd]
        self.bgu = self.bd = None
        if bias:
            self.bgu = (torch.randn(e, 2 * i, generator=g) * 0.5).to(bias_dtype).to(device)
            self.bd = (torch.randn(e, h, generator=g) * 0.1).to(bias_dtype).to(device)
        self.a = moe.stack_experts(self.wgu, device)
        self.b = moe.stack_experts(self.wd, device)

    def run(self, x, ids, wts, activation="silu", layout="concatenated"):
        return moe.fused_moe(x, ids, wts, self.a, self.b, self.fmt, self.i, activation, layout, self.bgu, self.bd)

    def reference(self, x, ids, wts, activation="silu", layout="concatenated"):
        cpu = lambda v: None if v is None else v.cpu()  # noqa: E731
        mid = torch.bfloat16 if self.fmt == "bf16" else None  # BF16 experts: bfloat16 intermediates
        return moe.moe_reference(x.cpu(), ids.cpu(), wts.cpu(), self.wgu, self.wd, cpu(self.bgu), cpu(self.bd),
                                 activation, layout, intermediate_dtype=mid)


def _distinct_ids(t, e, k, g, boost=None):
    """Random ids [t, k], int32, k distinct experts per token; boost {expert: (fraction of tokens, amount)} makes
    those experts likely (skewed routing)."""
    scores = torch.rand(t, e, generator=g)
    for ex, (frac, amount) in (boost or {}).items():
        scores[torch.rand(t, generator=g) < frac, ex] += amount
    return torch.sort(scores, dim=1, descending=True).indices[:, :k].to(torch.int32).contiguous()


def _inputs(t, e, k, h, seed, device="cpu", dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    ids, wts = moe.route_softmax_topk(torch.randn(t, e, generator=g), k, True)
    return x.to(device), ids.contiguous().to(device), wts.contiguous().to(device)


# ---- stack_experts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arrays", ["numpy", "torch"])
def test_stack_experts_layout_and_round_trip(fmt, arrays):
    e, n, k = 3, 2 * I, H
    g = torch.Generator().manual_seed(1)
    ws = []
    for _ in range(e):
        w = torch.randn(n, k, generator=g)
        if arrays == "numpy":
            p, s, ts = fp4kit.quantize(w.numpy(), fmt)
            ws.append(FP4Weight(fmt, p, s, ts if fmt == "nvfp4" else None))
        elif fmt == "nvfp4":  # per-row tensor scales: gate and up quantized separately
            ws.append(fuse([FP4Weight.from_float(w[:I] * 3.0, fmt), FP4Weight.from_float(w[I:], fmt)]))
        else:
            ws.append(FP4Weight.from_float(w, fmt))
    st = moe.stack_experts(ws)
    total = fp4kit.packed_layout(fmt, n, k)["total_bytes"]
    stride = int(st.shape[1])
    assert st.dtype == torch.uint8 and st.device.type == "cpu" and st.is_contiguous()
    assert tuple(st.shape) == (e, stride) and stride % 256 == 0 and total <= stride < total + 256
    assert not st[:, total:].any()  # zero-filled padding
    for i, w in enumerate(ws):
        assert w.prepacked is None  # the FP4Weights are not modified
        assert torch.equal(st[i, :total], w.to("cpu").prepack().prepacked)  # the single-weight prepack, byte for byte
        want = w.dequantize()
        want = want if isinstance(want, torch.Tensor) else torch.from_numpy(want)
        assert torch.equal(dequantize_packed(st[i], fmt, n, k), want)


def test_stack_experts_errors():
    a = FP4Weight.from_float(torch.randn(32, 64), "nvfp4")
    with pytest.raises(ValueError, match="weights: need at least one expert"):
        moe.stack_experts([])
    with pytest.raises(TypeError, match="weights: must be a sequence of FP4Weight"):
        moe.stack_experts(a)
    with pytest.raises(TypeError, match=r"weights\[1\]: must be an FP4Weight \(got Tensor\)"):
        moe.stack_experts([a, torch.zeros(3)])
    with pytest.raises(ValueError, match=r"weights\[1\]: format mxfp4 differs from weights\[0\]'s nvfp4; the experts "
                                         "of one stack must share format and shape"):
        moe.stack_experts([a, FP4Weight.from_float(torch.randn(32, 64), "mxfp4")])
    with pytest.raises(ValueError, match=r"weights\[2\]: shape \(32, 128\) differs from weights\[0\]'s \(32, 64\)"):
        moe.stack_experts([a, a, FP4Weight.from_float(torch.randn(32, 128), "nvfp4")])
    with pytest.raises(ValueError, match="device: must be a CPU or CUDA device"):
        moe.stack_experts([a], "meta")


def test_stack_experts_bf16():
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(2 * I, H, generator=g) for _ in range(3)]
    st = moe.stack_experts(ws)
    assert st.dtype == torch.bfloat16 and st.device.type == "cpu" and st.is_contiguous()
    assert tuple(st.shape) == (3, 2 * I, H)
    for i, w in enumerate(ws):
        assert torch.equal(st[i], w.bfloat16())  # row-major [n, k], rounded to bfloat16
    assert torch.equal(moe.stack_experts([w.bfloat16() for w in ws]), st)
    assert torch.equal(fp4kit.stack_experts(ws, "cpu"), st)
    with pytest.raises(TypeError, match=r"weights\[1\]: must be a torch tensor like weights\[0\] \(got FP4Weight\)"):
        moe.stack_experts([ws[0], FP4Weight.from_float(ws[1], "mxfp4")])
    with pytest.raises(TypeError, match=r"weights\[0\]: a BF16 expert must be a 2-D floating tensor"):
        moe.stack_experts([torch.zeros(4, 8, dtype=torch.int32)])
    with pytest.raises(TypeError, match=r"weights\[1\]: a BF16 expert must be a 2-D floating tensor"):
        moe.stack_experts([ws[0], ws[1][None]])
    with pytest.raises(ValueError, match=r"weights\[2\]: shape \(192, 80\) differs from weights\[0\]'s \(192, 160\)"):
        moe.stack_experts([ws[0], ws[1], ws[2][:, :80]])
    with pytest.raises(ValueError, match="device: must be a CPU or CUDA device"):
        moe.stack_experts(ws, "meta")


# ---- the CPU op ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("activation,layout", [("silu", "concatenated"), ("silu", "interleaved"),
                                               ("swiglu_oai", "interleaved"), ("swiglu_oai", "concatenated")])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_op_is_the_reference(fmt, activation, layout, bias):
    layer = Layer(fmt, 8, H, I, seed=3, bias=bias, scale_gate_up=4.0 if activation == "swiglu_oai" else 1.0,
                  split_gate_up=(fmt == "nvfp4"))
    x, ids, wts = _inputs(9, 8, 3, H, seed=4)
    y = layer.run(x, ids, wts, activation, layout)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (9, H)
    assert torch.equal(y, layer.reference(x, ids, wts, activation, layout))


@pytest.mark.parametrize("fmt", ["mxfp4", "bf16"])
def test_cpu_op_bad_or_repeated_id_gives_nan_row_only(fmt):
    layer = Layer(fmt, 8, H, I, seed=5)
    x, ids, wts = _inputs(7, 8, 3, H, seed=6)
    bad = ids.clone()
    bad[2, 1] = 8
    bad[4, 0] = -1
    bad[5, 2] = bad[5, 0]  # one expert in two slots of a token
    y = layer.run(x, bad, wts)
    assert torch.isnan(y[[2, 4, 5]]).all()
    good = [0, 1, 3, 6]
    assert torch.equal(y[good], layer.run(x[good], ids[good], wts[good]))
    assert torch.equal(y[good], layer.reference(x, ids, wts)[good])


def test_cpu_op_reads_only_routed_experts():
    layer = Layer("nvfp4", 8, H, I, seed=7)
    x, _, wts = _inputs(5, 8, 2, H, seed=8)
    ids = torch.tensor([[3, 5]] * 5, dtype=torch.int32)
    want = layer.run(x, ids, wts)
    for e in (0, 1, 2, 4, 6, 7):  # garbage (NaN block scales) in experts nobody routes to
        layer.a[e].fill_(0xFF)
        layer.b[e].fill_(0xFF)
    assert torch.equal(layer.run(x, ids, wts), want)


def test_cpu_op_empty_batch():
    layer = Layer("nvfp4", 4, H, I, seed=9)
    x, ids, wts = _inputs(0, 4, 2, H, seed=0)
    y = layer.run(x, ids, wts)
    assert tuple(y.shape) == (0, H) and y.dtype == torch.bfloat16


def _bias_dtype(fmt, act_dtype):
    return torch.bfloat16 if fmt == "bf16" else act_dtype  # BF16 experts: bfloat16 biases


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("activation,layout", [("silu", "concatenated"), ("swiglu_oai", "interleaved")])
def test_cpu_op_float16(fmt, activation, layout):
    layer = Layer(fmt, 8, H, I, seed=19, bias=True, bias_dtype=_bias_dtype(fmt, torch.float16),
                  scale_gate_up=4.0 if activation == "swiglu_oai" else 1.0)
    x, ids, wts = _inputs(9, 8, 3, H, seed=21, dtype=torch.float16)
    y = layer.run(x, ids, wts, activation, layout)
    assert y.dtype == torch.float16 and tuple(y.shape) == (9, H)
    ref = layer.reference(x, ids, wts, activation, layout)
    assert ref.dtype == torch.float16 and torch.equal(y, ref)
    # the same layer in bfloat16 (biases converted): the same values up to the two dtypes' roundings
    yb = moe.fused_moe(x.bfloat16(), ids, wts, layer.a, layer.b, fmt, I, activation, layout, layer.bgu.bfloat16(),
                       layer.bd.bfloat16())
    assert yb.dtype == torch.bfloat16 and _rel_l2(yb, y) < 2e-2


def test_moe_reference_float16_saturates():
    # an activation output past the float16 range becomes +-65504 (as the kernel writes it)
    e, h, i = 1, 32, 32
    wgu = [torch.zeros(2 * i, h)]
    wd = [torch.eye(h, i)]
    bgu = torch.zeros(e, 2 * i)
    bgu[0, 0], bgu[0, i] = 1000.0, 1000.0     # silu(1000) * 1000 = 1e6 -> 65504
    bgu[0, 1], bgu[0, i + 1] = 1000.0, -1000.0  # -> -65504
    x = torch.zeros(1, h, dtype=torch.float16)
    y = moe.moe_reference(x, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 1), wgu, wd, bgu, None)
    assert y.dtype == torch.float16
    assert float(y[0, 0]) == 65504.0 and float(y[0, 1]) == -65504.0 and float(y[0, 2]) == 0.0
    assert torch.isinf(moe.moe_reference(x, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 1), wgu, wd, bgu,
                                         None, intermediate_dtype=torch.float32)[0, 0])


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_opcheck_cpu(fmt):
    layer = Layer(fmt, 4, H, I, seed=10, bias=True)
    x, ids, wts = _inputs(3, 4, 2, H, seed=11)
    op = torch.ops.fp4kit.fused_moe.default
    opcheck(op, (x, ids, wts, layer.a, layer.b, fmt, I, "silu", "concatenated"))
    opcheck(op, (x, ids, wts, layer.a, layer.b, fmt, I, "swiglu_oai", "interleaved", layer.bgu, layer.bd, 1.5, 6.0))
    l16 = Layer(fmt, 4, H, I, seed=10, bias=True, bias_dtype=_bias_dtype(fmt, torch.float16))  # float16 activations
    opcheck(op, (x.half(), ids, wts, l16.a, l16.b, fmt, I, "swiglu_oai", "interleaved", l16.bgu, l16.bd))


@pytest.mark.parametrize("routing", ["softmax", "sigmoid_grouped"])
def test_fused_moe_from_logits_cpu(routing):
    e, k = 16, 4
    layer = Layer("nvfp4", e, H, I, seed=12)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(7, H, generator=g).bfloat16()
    logits = torch.randn(7, e, generator=g)
    if routing == "softmax":
        ids, wts = moe.route_softmax_topk(logits, k, False)
        kw = dict(renormalize=False)
    else:
        bias = torch.randn(e, generator=g) * 0.1
        ids, wts = moe.route_sigmoid_grouped_topk(logits, k, 4, 2, 2.5, bias)
        kw = dict(n_group=4, topk_group=2, routed_scaling_factor=2.5, correction_bias=bias)
    y = fp4kit.fused_moe_from_logits(x, logits, k, layer.a, layer.b, "nvfp4", I, routing=routing, **kw)
    assert torch.equal(y, layer.run(x, ids.contiguous(), wts.contiguous()))
    assert torch.equal(y, layer.reference(x, ids, wts))


def test_compile_fullgraph_cpu():
    layer = Layer("mxfp4", 4, H, I, seed=14)

    def f(x, ids, wts):
        return torch.ops.fp4kit.fused_moe(x, ids, wts, layer.a, layer.b, "mxfp4", I, "silu", "concatenated") * 2

    def g(x, ids, wts):  # through the Python wrapper
        return fp4kit.fused_moe(x, ids, wts, layer.a, layer.b, "mxfp4", I) + 1

    cf, cg = torch.compile(f, fullgraph=True), torch.compile(g, fullgraph=True)
    for t in (1, 5, 9):  # changing shapes: the fake implementation carries them
        x, ids, wts = _inputs(t, 4, 2, H, seed=t)
        assert torch.equal(cf(x, ids, wts), f(x, ids, wts))
        assert torch.equal(cg(x, ids, wts), g(x, ids, wts))


def test_argument_errors():
    layer = Layer("nvfp4", 4, H, I, seed=15, bias=True)
    x, ids, wts = _inputs(3, 4, 2, H, seed=16)
    a, b = layer.a, layer.b

    def call(x=x, ids=ids, wts=wts, a=a, b=b, fmt="nvfp4", inter=I, activation="silu", layout="concatenated",
             bgu=None, bd=None, alpha=1.702, limit=7.0):
        return moe.fused_moe(x, ids, wts, a, b, fmt, inter, activation, layout, bgu, bd, alpha, limit)

    with pytest.raises(TypeError, match=r"x: dtype must be torch.bfloat16 or torch.float16 \(got torch.float32\)"):
        call(x=x.float())
    with pytest.raises(TypeError, match=r"b_gate_up: dtype must be torch.float16 \(x's dtype\) \(got torch.bfloat16\)"):
        call(x=x.half(), bgu=layer.bgu)
    with pytest.raises(TypeError, match=r"b_down: dtype must be torch.bfloat16 \(x's dtype\) \(got torch.float16\)"):
        call(bd=layer.bd.half())
    assert call(x=x.half()).dtype == torch.float16  # FP4 experts take float16 activations
    with pytest.raises(ValueError, match=r"x: must have 2 dimensions"):
        call(x=x[None])
    with pytest.raises(ValueError, match=r"x: must be contiguous"):
        call(x=torch.cat([x, x], 1)[:, ::2])
    with pytest.raises(ValueError, match=r"x: H = x.shape\[1\] = 40 must be a positive multiple of the nvfp4 group"):
        call(x=x[:, :40].contiguous())
    with pytest.raises(TypeError, match=r"topk_ids: dtype must be torch.int32 \(got torch.int64\)"):
        call(ids=ids.long())
    with pytest.raises(ValueError, match=r"topk_ids: shape must be \[T, k\] with T = x.shape\[0\] = 3"):
        call(ids=ids[:2])
    with pytest.raises(ValueError, match=r"topk_ids: k = topk_ids.shape\[1\] = 5 must be <= the number of experts"):
        call(ids=torch.zeros(3, 5, dtype=torch.int32), wts=torch.zeros(3, 5))
    with pytest.raises(TypeError, match=r"topk_weights: dtype must be torch.float32 \(got torch.bfloat16\)"):
        call(wts=wts.bfloat16())
    with pytest.raises(ValueError, match=r"topk_weights: shape must be topk_ids' \(3, 2\)"):
        call(wts=wts[:, :1].contiguous())
    with pytest.raises(TypeError, match=r"w_gate_up: dtype must be torch.uint8 \(stacked experts"):
        call(a=a.float())
    with pytest.raises(ValueError, match=r"w_down: must hold one row per expert, E = w_gate_up.shape\[0\] = 4"):
        call(b=b[:3])
    with pytest.raises(ValueError, match=r"w_gate_up: each expert's row must hold packed_layout\('nvfp4', 192, 160\)"):
        call(a=b)  # the down stack where gate_up belongs
    with pytest.raises(ValueError, match=r"w_down: row stride must be a multiple of 256 bytes"):
        call(b=torch.cat([b, torch.zeros(4, 16, dtype=torch.uint8)], 1))
    with pytest.raises(ValueError, match=r"w_down: must be contiguous"):
        call(b=torch.cat([b, b], 1)[:, ::2])
    with pytest.raises(TypeError, match=r"b_gate_up: dtype must be torch.bfloat16 \(x's dtype\)"):
        call(bgu=layer.bgu.float())
    with pytest.raises(ValueError, match=r"b_down: shape must be \(4, 160\), one row per expert"):
        call(bd=layer.bd[:, :80].contiguous())
    with pytest.raises(ValueError, match="activation: must be one of"):
        call(activation="gelu")
    with pytest.raises(ValueError, match="layout: must be one of"):
        call(layout="blocked")
    with pytest.raises(ValueError, match="inter: I = 40 must be a multiple of the nvfp4 group size 16"):
        call(inter=40)
    with pytest.raises(ValueError, match='format: must be "nvfp4", "mxfp4" or "bf16"'):
        call(fmt="int4")
    with pytest.raises(TypeError, match=r'w_gate_up: dtype must be torch.bfloat16 \(format "bf16": experts '):
        call(fmt="bf16")  # FP4 stacks given as BF16 experts
    with pytest.raises(ValueError, match="limit: must be positive"):
        call(limit=0.0)
    with pytest.raises(ValueError, match="alpha: must be a finite number"):
        call(alpha=float("inf"))
    with pytest.raises(ValueError, match="routing: must be one of"):
        fp4kit.fused_moe_from_logits(x, torch.randn(3, 4), 2, a, b, "nvfp4", I, routing="top1")
    with pytest.raises(ValueError, match='n_group: applies to routing="sigmoid_grouped" only'):
        fp4kit.fused_moe_from_logits(x, torch.randn(3, 4), 2, a, b, "nvfp4", I, n_group=2)


def test_argument_errors_bf16():
    layer = Layer("bf16", 4, H, I, seed=17, bias=True)
    x, ids, wts = _inputs(3, 4, 2, H, seed=18)
    a, b = layer.a, layer.b

    def call(x=x, a=a, b=b, fmt="bf16", inter=I):
        return moe.fused_moe(x, ids, wts, a, b, fmt, inter, "silu", "concatenated", layer.bgu, layer.bd)

    assert tuple(call().shape) == (3, H)
    assert call(x=x.half()).dtype == torch.float16  # float16 activations, bfloat16 biases
    with pytest.raises(TypeError, match=r'b_gate_up: dtype must be torch.bfloat16 \(format "bf16": bfloat16\) '
                                        r"\(got torch.float16\)"):
        moe.fused_moe(x.half(), ids, wts, a, b, "bf16", I, "silu", "concatenated", layer.bgu.half(), layer.bd)
    with pytest.raises(TypeError, match=r"w_gate_up: dtype must be torch.uint8 \(stacked experts"):
        call(fmt="mxfp4")  # BF16 experts given as FP4 stacks
    with pytest.raises(TypeError, match=r'w_down: dtype must be torch.bfloat16 \(format "bf16"'):
        call(b=b.float())
    with pytest.raises(ValueError, match=r"w_gate_up: must have 3 dimensions"):
        call(a=a.reshape(4, -1))
    with pytest.raises(ValueError, match=r"w_gate_up: shape must be \(E, 192, 160\), one row-major \[n, k\] bfloat16"):
        call(a=a.transpose(1, 2).contiguous())  # [E, k, n]: transpose checkpoints stored as x @ W first
    with pytest.raises(ValueError, match=r"w_down: must hold one row per expert, E = w_gate_up.shape\[0\] = 4"):
        call(b=b[:3])
    with pytest.raises(ValueError, match=r"w_down: must be contiguous"):
        call(b=b.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match=r"x: H = x.shape\[1\] = 36 must be a positive multiple of 8 \(16-byte rows "
                                         r"of bf16 experts\)"):
        call(x=x[:, :36].contiguous())
    with pytest.raises(ValueError, match=r"inter: I = 44 must be a multiple of 8 \(16-byte rows of bf16 experts\)"):
        call(inter=44)


def test_moe_workspace_one_per_stream_grown_never_shared_with_the_gemm(monkeypatch):
    """The eager MoE workspace: the op initialises what it relies on, so one buffer per (device, stream)
    serves every shape; grown when too small; never the GEMM's (which must stay zeroed)."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(fp4kit.ops, "_moe_workspaces", {})
    dev = torch.device("cpu")
    ws = fp4kit.ops._moe_workspace(dev, 7, 1024)
    assert ws.numel() == 1024
    assert fp4kit.ops._moe_workspace(dev, 7, 512) is ws
    assert fp4kit.ops._moe_workspace(dev, 8, 512) is not ws  # one per stream
    grown = fp4kit.ops._moe_workspace(dev, 7, 2048)
    assert grown.numel() == 2048
    assert fp4kit.ops._moe_workspace(dev, 7, 1024) is grown
    assert not any(w is ws or w is grown for w in fp4kit.torch_ops._workspaces.values())  # not the GEMM's


def test_import_without_torch_keeps_the_moe_names():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import fp4kit\n"
            "names = ('stack_experts', 'fused_moe', 'fused_moe_from_logits')\n"
            "assert all(callable(getattr(fp4kit, n)) for n in names) and set(names) <= set(fp4kit.__all__)\n"
            "assert sys.modules['torch'] is None\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- GPU -------------------------------------------------------------------------------------------------
def _check_gpu(layer, x, ids, wts, activation="silu", layout="concatenated", tol=1e-2):
    y = layer.run(x, ids, wts, activation, layout)
    assert y.device == x.device and y.dtype == x.dtype and tuple(y.shape) == tuple(x.shape)
    assert torch.isfinite(y).all()
    err = _rel_l2(y, layer.reference(x, ids, wts, activation, layout))
    assert err < tol, f"rel-L2 {err:.3g}"
    return y


@needs_gpu
@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("activation,layout", [("silu", "concatenated"), ("silu", "interleaved"),
                                               ("swiglu_oai", "interleaved"), ("swiglu_oai", "concatenated")])
@pytest.mark.parametrize("bias", [False, True])
def test_cuda_matches_reference(fmt, activation, layout, bias):
    layer = Layer(fmt, 8, H, I, seed=20, device="cuda", bias=bias,
                  scale_gate_up=4.0 if activation == "swiglu_oai" else 1.0,  # past the clamps at limit 7
                  split_gate_up=(fmt == "nvfp4"))
    for t, k in ((1, 2), (5, 4), (37, 2)):
        x, ids, wts = _inputs(t, 8, k, H, seed=100 * t + k, device="cuda")
        _check_gpu(layer, x, ids, wts, activation, layout)


@needs_gpu
@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("activation,layout", [("silu", "concatenated"), ("swiglu_oai", "interleaved")])
@pytest.mark.parametrize("bias", [False, True])
def test_cuda_float16_matches_reference(fmt, activation, layout, bias):
    # float16 x and output (FP4 experts: and biases); the kernels round h, the activation and each expert's
    # output to float16 (BF16 experts: bfloat16), the reference rounds the activation only: the dense FP16 GEMM
    # tests' gate (2e-3) still holds, and 1e-2 (the bfloat16 gate) with BF16 experts' bfloat16 intermediates.
    layer = Layer(fmt, 8, H, I, seed=22, device="cuda", bias=bias, bias_dtype=_bias_dtype(fmt, torch.float16),
                  scale_gate_up=4.0 if activation == "swiglu_oai" else 1.0, split_gate_up=(fmt == "nvfp4"))
    for t, k in ((1, 2), (37, 4), (64, 2), (100, 4), (200, 2)):  # 100: two passes of 64; 200: tensor cores on Hopper
        x, ids, wts = _inputs(t, 8, k, H, seed=300 * t + k, device="cuda", dtype=torch.float16)
        y = _check_gpu(layer, x, ids, wts, activation, layout, tol=1e-2 if fmt == "bf16" else 2e-3)
        assert torch.equal(y, layer.run(x, ids, wts, activation, layout))  # deterministic


@needs_gpu
@pytest.mark.parametrize("fmt,e,h,i", [("nvfp4", 8, 176, 48), ("mxfp4", 16, 96, 64), ("nvfp4", 64, 160, 96),
                                       ("mxfp4", 64, 224, 160), ("bf16", 16, 168, 104), ("bf16", 64, 224, 160)])
def test_cuda_shapes_tokens_and_top_k(fmt, e, h, i):
    layer = Layer(fmt, e, h, i, seed=e + h, device="cuda", bias=True)
    # 100, 200, 300: BF16 experts on the tensor-core path (past one 64-token pass); FP4 experts take the
    # tensor-core path on Hopper where the decode path would need 32- or 64-token tiles (about 9+ mean rows
    # per expert: e = 8 from T = 37 at top-2, e = 16 from T = 73 at top-2 or 37 at top-4, ...), else one
    # decode pass; 300: past kMoEDecodePassTokens = 256, the tensor-core path on Hopper (fp4kit/moe.h)
    for t in (1, 5, 37, 64, 100, 200, 300):
        for k in (1, 2, 4, 8):
            x, ids, wts = _inputs(t, e, k, h, seed=1000 * t + k, device="cuda")
            _check_gpu(layer, x, ids, wts)


@needs_gpu
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_cuda_routing_modes(fmt):
    e, k, t = 32, 4, 37
    layer = Layer(fmt, e, H, I, seed=30, device="cuda")
    g = torch.Generator().manual_seed(31)
    x = torch.randn(t, H, generator=g).bfloat16().cuda()
    logits = torch.randn(t, e, generator=g).cuda()
    bias = (torch.randn(e, generator=g) * 0.1).cuda()
    # softmax top-k (gpt-oss, Mixtral, Qwen3)
    y = fp4kit.fused_moe_from_logits(x, logits, k, layer.a, layer.b, fmt, I)
    ids, wts = moe.route_softmax_topk(logits, k, True)  # the same routing, on the same device
    assert _rel_l2(y, layer.reference(x, ids, wts)) < 1e-2
    # DeepSeek-V3: sigmoid scores, grouped top-k, correction bias, scaling
    y = fp4kit.fused_moe_from_logits(x, logits, k, layer.a, layer.b, fmt, I, routing="sigmoid_grouped", n_group=8,
                                     topk_group=3, routed_scaling_factor=2.5, correction_bias=bias)
    ids, wts = moe.route_sigmoid_grouped_topk(logits, k, 8, 3, 2.5, bias)
    assert _rel_l2(y, layer.reference(x, ids, wts)) < 1e-2
    # precomputed ids and weights (any values, weights need not sum to 1)
    ids = _distinct_ids(t, e, k, g)
    wts = torch.rand(t, k, generator=g) * 2 - 0.5
    _check_gpu(layer, x, ids.cuda(), wts.cuda())


@needs_gpu
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_cuda_edge_routings(fmt):
    e = 64
    layer = Layer(fmt, e, H, I, seed=40, device="cuda", bias=True)
    g = torch.Generator().manual_seed(41)
    # most experts get no token; their buffers hold garbage (NaN block scales, NaN weights) that must not be read
    garbage = float("nan") if fmt == "bf16" else 0xFF
    x, _, wts = _inputs(5, e, 2, H, seed=42, device="cuda")
    ids = torch.tensor([[3, 7], [7, 3], [3, 7], [7, 3], [3, 7]], dtype=torch.int32, device="cuda")
    want = layer.run(x, ids, wts)
    saved_a, saved_b = layer.a.clone(), layer.b.clone()
    for ex in range(e):
        if ex not in (3, 7):
            layer.a[ex].fill_(garbage)
            layer.b[ex].fill_(garbage)
    y = _check_gpu(layer, x, ids, wts)
    assert torch.equal(y, want)
    layer.a.copy_(saved_a)
    layer.b.copy_(saved_b)
    for t in (1, 37, 100):
        x, _, wts = _inputs(t, e, 4, H, seed=43 + t, device="cuda")
        # all tokens on one expert (k = 1), and all tokens on the same four experts
        _check_gpu(layer, x, torch.full((t, 1), 11, dtype=torch.int32, device="cuda"), wts[:, :1].contiguous())
        same = torch.tensor([[11, 60, 2, 33]] * t, dtype=torch.int32, device="cuda")
        _check_gpu(layer, x, same, wts)
        # skewed: expert 0 in about 90% of the tokens, expert 1 in about 60%, the rest spread out
        ids = _distinct_ids(t, e, 4, g, boost={0: (0.9, 10.0), 1: (0.6, 5.0)})
        _check_gpu(layer, x, ids.cuda(), wts)


@needs_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
def test_cuda_bad_or_repeated_id_gives_nan_row_only(fmt):
    e = 8
    layer = Layer(fmt, e, H, I, seed=50, device="cuda")
    for t in (7, 100):
        x, ids, wts = _inputs(t, e, 2, H, seed=51 + t, device="cuda")
        bad = ids.clone()
        bad[2, 1] = e
        bad[4, 0] = -1
        bad[5, 1] = bad[5, 0]  # one expert in both slots of a token
        bad[t - 1, 1] = 1 << 30
        y = layer.run(x, bad, wts)
        rows = [2, 4, 5, t - 1]
        assert torch.isnan(y[rows]).all(dim=1).all()
        good = [r for r in range(t) if r not in rows]
        assert torch.isfinite(y[good]).all()
        assert _rel_l2(y[good], layer.reference(x, ids, wts)[good]) < 1e-2


@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "bf16"])
def test_cuda_deterministic_and_empty(fmt):
    layer = Layer(fmt, 16, H, I, seed=60, device="cuda", bias=True)
    x, ids, wts = _inputs(37, 16, 4, H, seed=61, device="cuda")
    y1 = layer.run(x, ids, wts, "swiglu_oai", "interleaved")
    y2 = layer.run(x, ids, wts, "swiglu_oai", "interleaved")
    assert torch.equal(y1, y2)
    x0, ids0, wts0 = _inputs(0, 16, 4, H, seed=0, device="cuda")
    assert tuple(layer.run(x0, ids0, wts0).shape) == (0, H)


@needs_gpu
def test_cuda_workspace_across_shapes_and_gemm():
    """Calls of changing shapes on one stream, with GEMMs in between: each still matches its reference."""
    l1 = Layer("nvfp4", 8, H, I, seed=65, device="cuda")
    l2 = Layer("mxfp4", 16, 96, 64, seed=66, device="cuda", bias=True)
    l3 = Layer("bf16", 16, 96, 64, seed=69, device="cuda", bias=True)
    n, k = 4096 + 48, 4096  # a GEMM large enough to use its workspace (stream-K)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(67))
    p, s, ts = torch.ops.fp4kit.quantize(w.cuda(), "nvfp4")
    buf = torch.ops.fp4kit.prepack(p, s, ts, "nvfp4", n, k)
    xg = torch.randn(16, k, generator=torch.Generator().manual_seed(68)).bfloat16().cuda()
    y_gemm = torch.ops.fp4kit.gemm(xg, buf, "nvfp4", n, k)
    for step, (layer, t, kk) in enumerate([(l1, 1, 2), (l1, 37, 4), (l2, 5, 2), (l3, 37, 4), (l1, 1, 2),
                                           (l2, 100, 8), (l3, 1, 2), (l1, 37, 4), (l1, 37, 4), (l2, 5, 2)]):
        x, ids, wts = _inputs(t, layer.e, kk, layer.h, seed=200 + step, device="cuda")
        _check_gpu(layer, x, ids, wts)
        assert torch.equal(torch.ops.fp4kit.gemm(xg, buf, "nvfp4", n, k), y_gemm), f"GEMM after step {step}"


@needs_gpu
def test_cuda_argument_errors():
    layer = Layer("nvfp4", 4, H, I, seed=70, device="cuda")
    x, ids, wts = _inputs(3, 4, 2, H, seed=71, device="cuda")
    with pytest.raises(TypeError, match=r"x: dtype must be torch.bfloat16 or torch.float16 \(got torch.float32\)"):
        layer.run(x.float(), ids, wts)
    bl16 = Layer("bf16", 4, H, I, seed=72, device="cuda", bias=True)
    with pytest.raises(TypeError, match=r'b_down: dtype must be torch.bfloat16 \(format "bf16": bfloat16\)'):
        moe.fused_moe(x.half(), ids, wts, bl16.a, bl16.b, "bf16", I, "silu", "concatenated", bl16.bgu, bl16.bd.half())
    with pytest.raises(ValueError, match=r"topk_ids: must be on x's device cuda:0 \(got cpu\)"):
        layer.run(x, ids.cpu(), wts)
    shifted = torch.zeros(layer.a.numel() + 16, dtype=torch.uint8, device="cuda")[16:].view(layer.a.shape)
    shifted.copy_(layer.a)  # contiguous, 16 bytes past a 256-byte boundary
    with pytest.raises(ValueError, match=r"w_gate_up: data must be 256-byte aligned"):
        moe.fused_moe(x, ids, wts, shifted, layer.b, "nvfp4", I)
    bl = Layer("bf16", 4, H, I, seed=72, device="cuda")
    shifted = torch.zeros(bl.b.numel() + 4, dtype=torch.bfloat16, device="cuda")[4:].view(bl.b.shape)
    shifted.copy_(bl.b)  # contiguous, 8 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match=r"w_down: data must be 16-byte aligned"):
        moe.fused_moe(x, ids, wts, bl.a, shifted, "bf16", I)
    assert torch.isfinite(moe.fused_moe(x, ids, wts, bl.a, bl.b, "bf16", I)).all()


@needs_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
def test_cuda_graph_capture_replay_changing_routing(fmt):
    e, t, k = 16, 37, 4
    layer = Layer(fmt, e, H, I, seed=80, device="cuda", bias=True)
    x_s, ids_s, wts_s = _inputs(t, e, k, H, seed=81, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as torch.cuda.graph requires
        layer.run(x_s, ids_s, wts_s)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_s = layer.run(x_s, ids_s, wts_s)
    gen = torch.Generator().manual_seed(82)
    routings = [moe.route_softmax_topk(torch.randn(t, e, generator=gen), k, True),
                (torch.tensor([[5, 9, 0, 15]] * t, dtype=torch.int32), torch.full((t, k), 0.25)),  # 4 experts only
                (_distinct_ids(t, e, k, gen, boost={3: (0.8, 10.0)}), torch.rand(t, k, generator=gen))]
    for n, (ids, wts) in enumerate(routings):
        x_s.copy_(torch.randn(t, H, generator=gen).bfloat16())
        ids_s.copy_(ids)
        wts_s.copy_(wts)
        g.replay()
        eager = layer.run(x_s, ids_s, wts_s)
        torch.cuda.synchronize()
        assert torch.isfinite(y_s).all()
        assert _rel_l2(y_s, layer.reference(x_s, ids_s, wts_s)) < 1e-2, f"routing {n}"
        assert torch.equal(y_s, eager)  # same kernels, same order: bitwise equal


@needs_gpu
def test_compile_fullgraph_cuda():
    layer = Layer("mxfp4", 8, H, I, seed=90, device="cuda", bias=True)

    def f(x, ids, wts):
        y = torch.ops.fp4kit.fused_moe(x, ids, wts, layer.a, layer.b, "mxfp4", I, "swiglu_oai", "interleaved",
                                       layer.bgu, layer.bd)
        return y.float().sum(-1)

    cf = torch.compile(f, fullgraph=True)
    for t in (1, 16, 37):
        x, ids, wts = _inputs(t, 8, 2, H, seed=91 + t, device="cuda")
        torch.testing.assert_close(cf(x, ids, wts), f(x, ids, wts))


@needs_gpu
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_opcheck_cuda(fmt):
    layer = Layer(fmt, 8, H, I, seed=95, device="cuda", bias=True)
    x, ids, wts = _inputs(5, 8, 2, H, seed=96, device="cuda")
    op = torch.ops.fp4kit.fused_moe.default
    opcheck(op, (x, ids, wts, layer.a, layer.b, fmt, I, "silu", "concatenated"))
    opcheck(op, (x, ids, wts, layer.a, layer.b, fmt, I, "swiglu_oai", "interleaved", layer.bgu, layer.bd))
    l16 = Layer(fmt, 8, H, I, seed=95, device="cuda", bias=True, bias_dtype=_bias_dtype(fmt, torch.float16))
    opcheck(op, (x.half(), ids, wts, l16.a, l16.b, fmt, I, "swiglu_oai", "interleaved", l16.bgu, l16.bd))


@needs_gpu
def test_cuda_stack_experts_matches_cpu_stack():
    layer = Layer("nvfp4", 4, H, I, seed=97, split_gate_up=True)
    on_gpu = moe.stack_experts([w.to("cuda") for w in layer.wgu])  # prepacked on the GPU
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), layer.a)
    assert torch.equal(moe.stack_experts(layer.wgu, "cuda").cpu(), layer.a)


# ---- fp4kit.route / torch.ops.fp4kit.route: the routing kernel against fp4kit.moe's torch definitions ----
def _route_cases():
    # (routing, E, k, n_group, topk_group, bias, renormalize)
    return [("softmax", 128, 4, 1, 1, False, True), ("softmax", 8, 2, 1, 1, False, False),
            ("softmax", 1024, 32, 1, 1, False, True), ("sigmoid_grouped", 256, 8, 8, 4, True, True),
            ("sigmoid_grouped", 64, 6, 64, 6, True, False), ("sigmoid_grouped", 40, 3, 5, 2, False, True)]


def _well_apart(t, e, n_group, g):
    """Logits in [-3, 3] with every selection key and group key far apart (see tests/python/test_route.py)."""
    gs, gap = e // n_group, 6.0 / n_group
    rows = []
    for _ in range(t):
        levels = torch.randperm(n_group, generator=g).float() * gap - 3.0
        steps = torch.cat([torch.randperm(gs, generator=g).float() * (0.4 * gap / gs) for _ in range(n_group)])
        rows.append(levels.repeat_interleave(gs) + steps)
    return torch.stack(rows)


def _torch_route(lg, k, routing, n_group, topk_group, bias, renorm):
    if routing == "softmax":
        return moe.route_softmax_topk(lg, k, renorm)
    return moe.route_sigmoid_grouped_topk(lg, k, n_group, topk_group, 2.5, bias, renorm)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", _route_cases())
def test_route_matches_torch_definitions(device, dtype, case):
    routing, e, k, n_group, topk_group, with_bias, renorm = case
    g = torch.Generator().manual_seed(e * 31 + k)
    # Softmax: any logits (the keys are the exact logits, ties to the lower id on both sides); sigmoid: keys
    # far apart, so the fp32 kernel and torch's sigmoid cannot order them differently.
    lg = (torch.randn(37, e, generator=g) * 2 if routing == "softmax" else _well_apart(37, e, n_group, g)).to(dtype)
    bias = torch.full((e,), 0.125) if with_bias else None  # the same for every expert: keys stay far apart
    kw = dict(n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.5, correction_bias=bias) \
        if routing == "sigmoid_grouped" else {}
    ids, w = fp4kit.route(lg.to(device), k, routing, renormalize=renorm,
                          **{a: (v.to(device) if isinstance(v, torch.Tensor) else v) for a, v in kw.items()})
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.device.type == device
    rid, rw = _torch_route(lg.float(), k, routing, n_group, topk_group, bias, renorm)
    assert torch.equal(ids.cpu(), rid)
    torch.testing.assert_close(w.cpu(), rw, rtol=5e-5, atol=1e-7)  # fp32 sums of up to E terms, other orders


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_route_nan_token_no_sync_and_moe(device):
    lg = torch.randn(5, 16, device=device)
    lg[2, 3] = float("nan")
    ids, w = fp4kit.route(lg, 4)
    assert (ids[2] == -1).all() and torch.isnan(w[2]).all()
    assert (ids[[0, 1, 3, 4]] >= 0).all() and torch.isfinite(w[[0, 1, 3, 4]]).all()


def test_route_opcheck_and_compile_cpu():
    lg = torch.randn(6, 32)
    opcheck(torch.ops.fp4kit.route.default, (lg, 4), {"routing": "softmax"})
    f = torch.compile(lambda x: torch.ops.fp4kit.route(x, 4), fullgraph=True)
    ids, w = f(lg)
    rid, rw = moe.route_softmax_topk(lg, 4, True)
    assert torch.equal(ids, rid)
    torch.testing.assert_close(w, rw)


@needs_gpu
def test_route_cuda_graph_replay_and_compile():
    lg = torch.randn(9, 128, device="cuda")
    f = torch.compile(lambda x: torch.ops.fp4kit.route(x, 4), fullgraph=True)
    torch.testing.assert_close(f(lg)[1], moe.route_softmax_topk(lg, 4, True)[1])
    static = torch.randn(9, 128, device="cuda")
    fp4kit.route(static, 4)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, w = fp4kit.route(static, 4)
    for _ in range(3):
        static.copy_(torch.randn(9, 128, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        rid, rw = moe.route_softmax_topk(static, 4, True)
        assert torch.equal(ids, rid)
        torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-7)


def test_route_torch_argument_errors():
    lg = torch.randn(4, 8)
    with pytest.raises(TypeError, match="logits: dtype must be one of"):
        fp4kit.route(lg.double(), 2)
    with pytest.raises(ValueError, match="logits: must have 2 dimensions"):
        fp4kit.route(lg[0], 2)
    with pytest.raises(ValueError, match=r"k: must be in \[1, min\(logits.shape\[1\] = 8, 32\)\] \(got 9\)"):
        fp4kit.route(lg, 9)
    with pytest.raises(ValueError, match=r"correction_bias: shape must be \(8,\)"):
        fp4kit.route(lg, 2, "sigmoid_grouped", n_group=2, topk_group=1, correction_bias=torch.zeros(7))
    with pytest.raises(ValueError, match=r"^n_group: must divide num_experts = 8 \(got 3\)"):
        fp4kit.route(lg, 2, "sigmoid_grouped", n_group=3)
