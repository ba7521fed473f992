"""fp4kit.moe: routing, token alignment, activations and the reference MoE layer (torch, CPU).

Routing is checked against brute-force loops written here in float64 Python (ties: the lower expert or
group id wins, as documented in fp4kit.moe); moe_reference against a naive per-token, per-slot loop.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fp4kit.moe needs torch (pip install 'fp4kit[torch]')")

from fp4kit import moe  # noqa: E402
from fp4kit.weights import FP4Weight, deinterleave_gate_up, fuse, interleave_gate_up  # noqa: E402


# ---- brute-force routing -----------------------------------------------------------------------------------
def _argmax_first(vals, allowed):
    """Index of the largest value among `allowed` indices; the lowest index among equals."""
    best = None
    for i in allowed:
        if best is None or vals[i] > vals[best]:
            best = i
    return best


def _pick(vals, k, allowed=None):
    left = list(range(len(vals))) if allowed is None else list(allowed)
    out = []
    for _ in range(k):
        b = _argmax_first(vals, left)
        out.append(b)
        left.remove(b)
    return out


def _brute_softmax(logits, k, renormalize):
    ids, ws = [], []
    for row in logits.double().tolist():
        m = max(row)
        ex = [math.exp(v - m) for v in row]
        p = [v / sum(ex) for v in ex]
        sel = _pick(row, k)
        w = [p[i] for i in sel]
        if renormalize:
            w = [v / sum(w) for v in w]
        ids.append(sel)
        ws.append(w)
    return ids, ws


def _brute_grouped(logits, k, n_group, topk_group, scale, bias=None):
    ids, ws = [], []
    e = logits.shape[1]
    gs = e // n_group
    b = [0.0] * e if bias is None else bias.double().tolist()
    for row in logits.double().tolist():
        s = [1.0 / (1.0 + math.exp(-v)) for v in row]
        sel = [s[i] + b[i] for i in range(e)]
        gscore = []
        for g in range(n_group):
            members = sorted(sel[g * gs:(g + 1) * gs], reverse=True)
            gscore.append(sum(members[:2]))
        groups = _pick(gscore, topk_group)
        allowed = sorted(i for g in groups for i in range(g * gs, (g + 1) * gs))
        chosen = _pick(sel, k, allowed)
        w = [s[i] for i in chosen]
        ids.append(chosen)
        ws.append([v / sum(w) * scale for v in w])
    return ids, ws


def _check_route(got, want):
    ids, w = got
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == want[0]
    np.testing.assert_allclose(w.numpy(), np.array(want[1]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("renormalize", [True, False])
def test_softmax_topk_matches_brute_force(k, renormalize):
    logits = torch.randn(37, 32, generator=torch.Generator().manual_seed(k)) * 3
    _check_route(moe.route_softmax_topk(logits, k, renormalize), _brute_softmax(logits, k, renormalize))


def test_softmax_topk_bf16_logits_and_renormalized_is_softmax_over_selected():
    logits = (torch.randn(5, 16, generator=torch.Generator().manual_seed(1)) * 2).bfloat16()
    ids, w = moe.route_softmax_topk(logits, 4, True)
    _check_route((ids, w), _brute_softmax(logits.float(), 4, True))
    sel = logits.float().gather(1, ids.long())  # gpt-oss: softmax over the selected top-k logits
    torch.testing.assert_close(w, torch.softmax(sel, -1))
    np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, rtol=1e-6)


def test_softmax_topk_ties_go_to_lower_expert_id():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0], [0.0] * 5, [-1.0, 5.0, -1.0, 5.0, -1.0]])
    ids, w = moe.route_softmax_topk(logits, 2, True)
    assert ids.tolist() == [[1, 2], [0, 1], [1, 3]]
    np.testing.assert_allclose(w.numpy(), 0.5)
    ids, _ = moe.route_softmax_topk(logits, 4, False)
    assert ids.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3], [1, 3, 0, 2]]
    _check_route(moe.route_softmax_topk(logits, 3, False), _brute_softmax(logits, 3, False))


@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_topk_matches_brute_force(with_bias):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(37, 64, generator=g) * 2
    bias = torch.randn(64, generator=g) * 0.5 if with_bias else None
    for k, n_group, topk_group in ((8, 8, 4), (4, 4, 2), (2, 8, 1), (6, 1, 1)):
        got = moe.route_sigmoid_grouped_topk(logits, k, n_group, topk_group, 2.5, bias)
        assert torch.equal(got[0], moe.route_sigmoid_grouped_topk(logits.T.contiguous().T, k, n_group,
                                                                  topk_group, 2.5, bias)[0])
        _check_route(got, _brute_grouped(logits, k, n_group, topk_group, 2.5, bias))
        np.testing.assert_allclose(got[1].sum(-1).numpy(), 2.5, rtol=1e-5)


def test_grouped_topk_bias_steers_selection_not_weights():
    # 4 experts in 2 groups; without bias group 0 (experts 0, 1) wins, the bias moves the choice to group 1.
    logits = torch.tensor([[2.0, 1.0, 0.0, -0.5]])
    ids, w = moe.route_sigmoid_grouped_topk(logits, 2, 2, 1, 1.0)
    assert ids.tolist() == [[0, 1]]
    bias = torch.tensor([0.0, 0.0, 1.0, 1.0])
    ids, w = moe.route_sigmoid_grouped_topk(logits, 2, 2, 1, 3.0, bias)
    assert ids.tolist() == [[2, 3]]
    s = torch.sigmoid(torch.tensor([0.0, -0.5]))
    torch.testing.assert_close(w[0], s / s.sum() * 3.0)  # weights use the scores without the bias
    ids, w = moe.route_sigmoid_grouped_topk(logits, 2, 2, 1, 3.0, bias, renormalize=False)
    torch.testing.assert_close(w[0], s * 3.0)


def test_grouped_topk_group_score_is_top2_sum_and_ties():
    # group 0: one strong expert (sum of top-2 small); group 1: two medium ones (sum of top-2 larger).
    logits = torch.tensor([[4.0, -4.0, -4.0, 1.0, 1.0, -4.0]])
    ids, _ = moe.route_sigmoid_grouped_topk(logits, 1, 2, 1, 1.0)
    assert ids.tolist() == [[3]]  # the best expert overall (0) is in the losing group; tie 3 = 4 -> 3
    zeros = torch.zeros(2, 16)  # all tied: groups 0, 1 win, then experts 0, 1, 2 (lower ids first)
    ids, w = moe.route_sigmoid_grouped_topk(zeros, 3, 4, 2, 1.0)
    assert ids.tolist() == [[0, 1, 2]] * 2
    _check_route((ids, w), _brute_grouped(zeros, 3, 4, 2, 1.0))
    bias = torch.zeros(16)
    bias[12:] = 1.0  # group 3 wins, then the tie among its experts is broken by id
    ids, _ = moe.route_sigmoid_grouped_topk(zeros, 3, 4, 1, 1.0, bias)
    assert ids.tolist() == [[12, 13, 14]] * 2


def test_routing_errors():
    lg = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"k: must be in \[1, 8\]"):
        moe.route_softmax_topk(lg, 9, True)
    with pytest.raises(TypeError, match="k: must be an int"):
        moe.route_softmax_topk(lg, 2.0, True)
    with pytest.raises(TypeError, match="logits: must be a torch tensor"):
        moe.route_softmax_topk(lg.numpy(), 2, True)
    with pytest.raises(TypeError, match="logits: dtype must be floating"):
        moe.route_softmax_topk(lg.int(), 2, True)
    with pytest.raises(ValueError, match="logits: must have 2 dimensions"):
        moe.route_softmax_topk(lg[0], 2, True)
    with pytest.raises(ValueError, match="logits: must not contain NaN"):
        moe.route_softmax_topk(torch.full((1, 8), float("nan")), 2, True)
    with pytest.raises(TypeError, match="renormalize: must be a bool"):
        moe.route_softmax_topk(lg, 2, 1)
    with pytest.raises(ValueError, match="n_group: must divide the number of experts 8"):
        moe.route_sigmoid_grouped_topk(lg, 2, 3, 1, 1.0)
    with pytest.raises(ValueError, match=r"topk_group: must be in \[1, 4\]"):
        moe.route_sigmoid_grouped_topk(lg, 2, 4, 5, 1.0)
    with pytest.raises(ValueError, match=r"k: must be <= topk_group \* experts per group = 1 \* 2 = 2"):
        moe.route_sigmoid_grouped_topk(lg, 3, 4, 1, 1.0)
    with pytest.raises(ValueError, match="routed_scaling_factor: must be positive"):
        moe.route_sigmoid_grouped_topk(lg, 2, 4, 2, 0.0)
    with pytest.raises(ValueError, match=r"correction_bias: shape must be \(8,\)"):
        moe.route_sigmoid_grouped_topk(lg, 2, 4, 2, 1.0, torch.zeros(4))
    with pytest.raises(ValueError, match="correction_bias: must be finite"):
        moe.route_sigmoid_grouped_topk(lg, 2, 4, 2, 1.0, torch.full((8,), float("inf")))


# ---- align_tokens ------------------------------------------------------------------------------------------
def _check_alignment(ids, e, block):
    a = moe.align_tokens(ids, e, block)
    t, k = ids.shape
    sid, off = a.sorted_ids.tolist(), a.expert_offsets.tolist()
    assert a.sentinel == t * k and a.block == block and (a.num_tokens, a.top_k) == (t, k)
    assert len(off) == e + 1 and off[0] == 0 and off[-1] == len(sid)
    assert all(o % block == 0 for o in off) and all(b >= a_ for a_, b in zip(off, off[1:]))
    real = [v for v in sid if v != a.sentinel]
    assert sorted(real) == list(range(t * k))  # every (token, slot) exactly once
    flat = ids.reshape(-1).tolist()
    for ex in range(e):
        seg = sid[off[ex]:off[ex + 1]]
        members = [v for v in seg if v != a.sentinel]
        n = flat.count(ex)
        assert members == [i for i in range(t * k) if flat[i] == ex]  # ascending flat index
        assert seg == members + [a.sentinel] * (len(seg) - n)  # padding at the end only
        assert len(seg) == -(-n // block) * block  # padded to the next multiple, empty if unused
        assert a.expert_counts[ex].item() == n
    assert a.block_experts.tolist() == [ex for ex in range(e) for _ in range((off[ex + 1] - off[ex]) // block)]
    assert a.touched.tolist() == sorted(set(flat))
    assert moe.touched_experts(ids, e).tolist() == sorted(set(flat))
    for tensor in (a.sorted_ids, a.expert_offsets, a.expert_counts, a.block_experts, a.touched):
        assert tensor.dtype == torch.int32
    return a


@pytest.mark.parametrize("t,k,e,block", [(1, 4, 32, 16), (37, 2, 8, 16), (37, 8, 64, 64), (5, 1, 4, 1),
                                         (200, 4, 16, 128)])
def test_align_tokens_invariants(t, k, e, block):
    g = torch.Generator().manual_seed(t * 1000 + k)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    _check_alignment(ids, e, block)


def test_align_tokens_edge_cases():
    a = _check_alignment(torch.full((37, 1), 3, dtype=torch.int32), 8, 16)  # all tokens on one expert
    assert a.expert_offsets.tolist() == [0, 0, 0, 0, 48, 48, 48, 48, 48] and a.touched.tolist() == [3]
    assert a.sorted_ids[37:].tolist() == [37] * 11
    a = _check_alignment(torch.tensor([[0, 5]], dtype=torch.int64), 6, 4)  # experts 1..4 have no tokens
    assert a.sorted_ids.tolist() == [0, 2, 2, 2, 1, 2, 2, 2] and a.block_experts.tolist() == [0, 5]
    a = _check_alignment(torch.tensor([[2, 2], [2, 2]]), 3, 2)  # duplicate ids in a row are two slots
    assert a.sorted_ids.tolist() == [0, 1, 2, 3]
    a = moe.align_tokens(torch.zeros(0, 4, dtype=torch.int32), 8, 16)  # no tokens at all
    assert a.sorted_ids.numel() == 0 and a.expert_offsets.tolist() == [0] * 9 and a.touched.numel() == 0


def test_align_tokens_errors():
    ids = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match=r"topk_ids: expert ids must be in \[0, num_experts\) = \[0, 2\)"):
        moe.align_tokens(torch.tensor([[0, 2]]), 2, 16)
    with pytest.raises(ValueError, match=r"topk_ids: expert ids must be in"):
        moe.align_tokens(torch.tensor([[-1, 0]]), 2, 16)
    with pytest.raises(TypeError, match="topk_ids: dtype must be an integer type"):
        moe.align_tokens(ids.float(), 2, 16)
    with pytest.raises(ValueError, match=r"topk_ids: must have 2 dimensions \[T, k\]"):
        moe.align_tokens(ids[0], 2, 16)
    with pytest.raises(ValueError, match="block: must be >= 1"):
        moe.align_tokens(ids, 2, 0)
    with pytest.raises(ValueError, match="num_experts: must be >= 1"):
        moe.align_tokens(ids, 0, 16)


def test_weight_bytes():
    h, i = 64, 96
    for fmt in ("nvfp4", "mxfp4"):
        parts = [FP4Weight.from_float(torch.randn(n, kk), fmt) for n, kk in ((2 * i, h), (h, i))]
        blocks = sum(p.packed.numel() + p.scales.numel() for p in parts)
        assert moe.expert_weight_bytes(fmt, h, i) == blocks + (12 if fmt == "nvfp4" else 0)
    assert moe.expert_weight_bytes("bf16", h, i) == 2 * 3 * h * i
    assert moe.expert_weight_bytes("bf16", h, i, bias=True) == 2 * 3 * h * i + 2 * (2 * i + h)
    # gpt-oss-120b: 2880 x 2880, MXFP4: 3 * 2880^2 * (1/2 + 1/32) bytes per expert
    assert moe.expert_weight_bytes("mxfp4", 2880, 2880) == 3 * 2880 * 2880 * 17 // 32
    ids = torch.tensor([[0, 3], [3, 5], [0, 5]])
    assert moe.touched_weight_bytes(ids, 8, "mxfp4", h, i) == 3 * moe.expert_weight_bytes("mxfp4", h, i)
    with pytest.raises(ValueError, match='format: must be "nvfp4", "mxfp4" or "bf16"'):
        moe.expert_weight_bytes("fp8", h, i)
    with pytest.raises(ValueError, match="intermediate: must be a multiple of the mxfp4 group size 32"):
        moe.expert_weight_bytes("mxfp4", 64, 48)


# ---- activations -------------------------------------------------------------------------------------------
def test_silu_and_mul_known_values_and_layouts():
    g = torch.tensor([0.0, 1.0, -2.0])
    u = torch.tensor([5.0, 2.0, 3.0])
    want = torch.tensor([0.0, 2.0 / (1 + math.exp(-1.0)), 3 * -2.0 / (1 + math.exp(2.0))])
    torch.testing.assert_close(moe.silu_and_mul(torch.cat([g, u])), want)
    torch.testing.assert_close(moe.silu_and_mul(torch.stack([g, u], -1).reshape(-1), "interleaved"), want)
    out = moe.silu_and_mul(torch.cat([g, u]).bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == (3,)


def test_swiglu_oai_clamps_at_limit():
    def ref(gv, uv, alpha=1.702, limit=7.0):
        gc, uc = min(gv, limit), max(-limit, min(uv, limit))
        return gc / (1 + math.exp(-alpha * gc)) * (uc + 1)
    pairs = [(0.0, 0.0), (1.0, 1.0), (7.0, 7.0), (10.0, 20.0), (100.0, -100.0), (-3.0, 6.9), (-20.0, 1.0),
             (7.5, -7.5)]
    g = torch.tensor([p[0] for p in pairs])
    u = torch.tensor([p[1] for p in pairs])
    got = moe.swiglu_oai(torch.stack([g, u], -1).reshape(-1))  # gpt-oss default: interleaved
    np.testing.assert_allclose(got.numpy(), [ref(a, b) for a, b in pairs], rtol=1e-6, atol=1e-7)
    sat = ref(7.0, 7.0)
    assert got[3].item() == pytest.approx(sat) and got[2].item() == pytest.approx(sat)  # clamped to 7
    assert got[4].item() == pytest.approx(7.0 / (1 + math.exp(-1.702 * 7)) * -6.0)  # up clamps at -7
    assert got[6].item() == pytest.approx(-20.0 / (1 + math.exp(1.702 * 20)) * 2.0)  # gate has no lower clamp
    got2 = moe.swiglu_oai(torch.cat([g, u]), 1.0, 2.0, layout="concatenated")
    np.testing.assert_allclose(got2.numpy(), [ref(a, b, 1.0, 2.0) for a, b in pairs], rtol=1e-6, atol=1e-7)


def test_interleaved_equals_concatenated_through_deinterleave():
    x = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(3)) * 6
    conc = deinterleave_gate_up(x, axis=2)
    for fn in (moe.silu_and_mul, moe.swiglu_oai):
        assert torch.equal(fn(x, layout="interleaved"), fn(conc, layout="concatenated"))
    assert torch.equal(interleave_gate_up(conc, axis=2), x)


def test_activation_errors():
    with pytest.raises(ValueError, match="gate_up: last dimension must be even"):
        moe.silu_and_mul(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="layout: must be one of"):
        moe.silu_and_mul(torch.zeros(4), "split")
    with pytest.raises(TypeError, match="gate_up: dtype must be floating"):
        moe.swiglu_oai(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="limit: must be positive"):
        moe.swiglu_oai(torch.zeros(4), limit=-1.0)
    with pytest.raises(ValueError, match="alpha: must be a finite number"):
        moe.swiglu_oai(torch.zeros(4), alpha=float("nan"))


# ---- moe_reference -----------------------------------------------------------------------------------------
def _deq(w):
    if isinstance(w, FP4Weight):
        d = w.dequantize()
        return (d if isinstance(d, torch.Tensor) else torch.from_numpy(d)).double()
    return w.double()


def _naive(x, ids, wts, wgu, wd, bgu=None, bd=None, act="silu", layout="concatenated", round_to=None):
    """Per token, per slot, float64 matrix-vector products."""
    t, h = x.shape
    out = torch.zeros(t, h, dtype=torch.float64)
    for ti in range(t):
        for j in range(ids.shape[1]):
            e = int(ids[ti, j])
            hid = _deq(wgu[e]) @ x[ti].double()
            if bgu is not None:
                hid = hid + bgu[e].double()
            if layout == "interleaved":
                g, u = hid[0::2], hid[1::2]
            else:
                g, u = hid.chunk(2)
            if act == "silu":
                a = g / (1 + torch.exp(-g)) * u
            else:
                g, u = g.clamp(max=7.0), u.clamp(-7.0, 7.0)
                a = g * torch.sigmoid(1.702 * g) * (u + 1)
            if round_to is not None:
                a = a.to(round_to).double()
            y = _deq(wd[e]) @ a
            if bd is not None:
                y = y + bd[e].double()
            out[ti] += float(wts[ti, j]) * y
    return out


def _experts(e, h, i, fmt, seed, split_gate_up=False):
    g = torch.Generator().manual_seed(seed)
    wgu = [torch.randn(2 * i, h, generator=g) / math.sqrt(h) for _ in range(e)]
    wd = [torch.randn(h, i, generator=g) / math.sqrt(i) for _ in range(e)]
    if fmt == "bf16":
        return [w.bfloat16() for w in wgu], [w.bfloat16() for w in wd]
    if split_gate_up:  # NVFP4 gate and up quantized separately: different tensor scales, fused per row
        q = [fuse([FP4Weight.from_float(w[:i] * 3.0, fmt), FP4Weight.from_float(w[i:], fmt)]) for w in wgu]
    else:
        q = [FP4Weight.from_float(w, fmt) for w in wgu]
    return q, [FP4Weight.from_float(w, fmt) for w in wd]


def _route(t, e, k, seed):
    logits = torch.randn(t, e, generator=torch.Generator().manual_seed(seed))
    return moe.route_softmax_topk(logits, k, True)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_moe_reference_matches_naive_loop(fmt, k):
    e, h, i = 8, 64, 32
    wgu, wd = _experts(e, h, i, fmt, seed=k, split_gate_up=(fmt == "nvfp4"))
    for t in (1, 37):
        x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
        ids, wts = _route(t, e, k, seed=t + k)
        y = moe.moe_reference(x, ids, wts, wgu, wd, intermediate_dtype=torch.float32)
        assert y.dtype == torch.float32 and y.shape == (t, h)
        torch.testing.assert_close(y.double(), _naive(x, ids, wts, wgu, wd), rtol=1e-4, atol=1e-5)
        yb = moe.moe_reference(x.bfloat16(), ids, wts, wgu, wd)  # bf16 intermediate and output
        assert yb.dtype == torch.bfloat16
        want = _naive(x.bfloat16().float(), ids, wts, wgu, wd, round_to=torch.bfloat16)
        torch.testing.assert_close(yb.double(), want, rtol=2e-2, atol=2e-2)


def test_moe_reference_rounds_intermediate_to_bf16_by_default():
    e, h, i = 4, 32, 32
    wgu, wd = _experts(e, h, i, "bf16", seed=5)
    x = torch.randn(9, h, generator=torch.Generator().manual_seed(2))
    ids, wts = _route(9, e, 2, seed=4)
    y = moe.moe_reference(x, ids, wts, wgu, wd)  # float32 x: intermediate still rounded to bf16
    torch.testing.assert_close(y.double(), _naive(x, ids, wts, wgu, wd, round_to=torch.bfloat16),
                               rtol=1e-4, atol=1e-5)
    y32 = moe.moe_reference(x, ids, wts, wgu, wd, intermediate_dtype=torch.float32)
    assert not torch.equal(y, y32)


@pytest.mark.parametrize("t", [1, 37])
def test_moe_reference_gpt_oss_like(t):
    """MXFP4 experts with biases, interleaved gate/up rows and swiglu_oai, as a gpt-oss checkpoint has them."""
    e, h, i, k = 8, 64, 64, 4
    g = torch.Generator().manual_seed(11)
    _, wd = _experts(e, h, i, "mxfp4", seed=12)
    wgu = [FP4Weight.from_float(torch.randn(2 * i, h, generator=g) * 0.5, "mxfp4") for _ in range(e)]  # big g/u
    bgu = (torch.randn(e, 2 * i, generator=g) * 0.5).bfloat16()
    bd = (torch.randn(e, h, generator=g) * 0.1).bfloat16()
    x = torch.randn(t, h, generator=g).bfloat16()
    ids, wts = moe.route_softmax_topk(torch.randn(t, e, generator=g), k, True)
    kw = dict(activation="swiglu_oai", layout="interleaved")
    y = moe.moe_reference(x, ids, wts, wgu, wd, bgu, bd, intermediate_dtype=torch.float32, **kw)
    want = _naive(x.float(), ids, wts, wgu, wd, bgu, bd, act="swiglu_oai", layout="interleaved")
    hid = torch.stack([x[ti].float() @ _deq(wgu[int(ids[ti, 0])]).float().T for ti in range(t)])
    assert (hid[:, 0::2] > 7).any() and (hid[:, 1::2].abs() > 7).any()  # the clamps at limit 7 are exercised
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)  # y is bf16
    # the same experts deinterleaved to [gate; up] (weights and bias) give the same layer
    y_conc = moe.moe_reference(x, ids, wts, [deinterleave_gate_up(w) for w in wgu], wd,
                               deinterleave_gate_up(bgu, axis=1), list(bd), activation="swiglu_oai",
                               layout="concatenated", intermediate_dtype=torch.float32)
    torch.testing.assert_close(y_conc.float(), y.float(), rtol=1e-2, atol=1e-2)


def test_moe_reference_weights_and_unused_experts():
    e, h, i = 4, 32, 16
    wgu, wd = _experts(e, h, i, "bf16", seed=1)
    x = torch.randn(3, h)
    ids = torch.tensor([[1, 1], [1, 2], [2, 1]], dtype=torch.int32)  # expert 0 and 3 unused: may be anything
    wts = torch.tensor([[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]])
    bad = list(wgu)
    bad[3] = "not loaded"
    y = moe.moe_reference(x, ids, wts, bad, wd, intermediate_dtype=torch.float32)
    torch.testing.assert_close(y.double(), _naive(x, ids, wts, wgu, wd), rtol=1e-5, atol=1e-6)
    one = moe.moe_reference(x[:1], torch.tensor([[1]]), torch.ones(1, 1), wgu, wd, intermediate_dtype=torch.float32)
    torch.testing.assert_close(y[0], one[0], rtol=1e-6, atol=1e-6)  # 0.25 + 0.75 of the same expert


def test_moe_reference_errors():
    e, h, i = 2, 32, 32
    wgu, wd = _experts(e, h, i, "bf16", seed=0)
    x = torch.randn(2, h)
    ids = torch.tensor([[0, 1], [1, 0]])
    wts = torch.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="activation: must be one of"):
        moe.moe_reference(x, ids, wts, wgu, wd, activation="gelu")
    with pytest.raises(ValueError, match="layout: must be one of"):
        moe.moe_reference(x, ids, wts, wgu, wd, layout="blocked")
    with pytest.raises(ValueError, match=r"w_gate_up\[0\]: shape must be \(2I, H\) with H = x.shape\[1\] = 16"):
        moe.moe_reference(x[:, :16], ids, wts, wgu, wd)
    with pytest.raises(ValueError, match="w_down: must hold one weight per expert, 2"):
        moe.moe_reference(x, ids, wts, wgu, wd[:1])
    with pytest.raises(ValueError, match=r"w_down\[1\]: shape must be \(32, 32\)"):
        moe.moe_reference(x, ids, wts, wgu, [wd[0], wd[1][:, :16]])
    with pytest.raises(ValueError, match=r"topk_ids: expert ids must be in \[0, num_experts\) = \[0, 2\)"):
        moe.moe_reference(x, ids + 1, wts, wgu, wd)
    with pytest.raises(ValueError, match=r"topk_weights: shape must be topk_ids' \(2, 2\)"):
        moe.moe_reference(x, ids, wts[:, :1], wgu, wd)
    with pytest.raises(ValueError, match=r"topk_ids: shape must be \[T, k\] with T = x.shape\[0\] = 2"):
        moe.moe_reference(x, ids[:1], wts[:1], wgu, wd)
    with pytest.raises(ValueError, match=r"b_gate_up: shape must be \(2, 64\)"):
        moe.moe_reference(x, ids, wts, wgu, wd, b_gate_up=torch.zeros(2, 32))
    with pytest.raises(TypeError, match=r"w_gate_up\[1\]: must be an FP4Weight or a torch tensor"):
        moe.moe_reference(x, ids, wts, [wgu[0], wgu[1].float().numpy()], wd)
    with pytest.raises(TypeError, match="w_gate_up: must be a non-empty list"):
        moe.moe_reference(x, ids, wts, [], wd)
    with pytest.raises(TypeError, match="x: dtype must be floating"):
        moe.moe_reference(x.int(), ids, wts, wgu, wd)
