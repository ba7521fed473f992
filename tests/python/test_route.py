"""fp4kit.route on the host (numpy): against a numpy implementation of the definitions (fp64), on fresh
random logits built without near-ties (so the ids must agree exactly), the hand-worked DeepSeek-V3 case,
NaN tokens, float16 logits, and the argument errors. The CUDA kernel is tested against the same
definitions in test_moe_op.py (torch) and tests/cpp/test_moe_gpu.cu.
"""
import numpy as np
import pytest

import fp4kit

RNG = np.random.default_rng()


def spec_route(lg, k, routing, renormalize=True, n_group=1, topk_group=1, rsf=1.0, bias=None):
    """The definitions of fp4kit.route in numpy, fp64, stable sorts (ties to the lower id)."""
    lg = np.asarray(lg, np.float64)
    t, e = lg.shape
    ids = np.zeros((t, k), np.int32)
    w = np.zeros((t, k), np.float64)
    for i in range(t):
        row = lg[i]
        if np.isnan(row).any():
            ids[i], w[i] = -1, np.nan
            continue
        if routing == "softmax":
            top = np.argsort(-row, kind="stable")[:k]
            ex = np.exp(row - row[top[0]])
            ids[i], w[i] = top, ex[top] / (ex[top].sum() if renormalize else ex.sum())
            continue
        score = 1.0 / (1.0 + np.exp(-row))
        key = score + (0.0 if bias is None else np.asarray(bias, np.float64))
        gs = e // n_group
        grouped = -np.sort(-key.reshape(n_group, gs), axis=1)
        gkey = grouped[:, 0] + (grouped[:, 1] if gs > 1 else 0.0)
        keep = np.argsort(-gkey, kind="stable")[:topk_group]
        masked = np.full(e, -np.inf)
        for g in keep:
            masked[g * gs:(g + 1) * gs] = key[g * gs:(g + 1) * gs]
        top = np.argsort(-masked, kind="stable")[:k]
        s = score[top]
        ids[i], w[i] = top, (s / s.sum() if renormalize else s) * rsf
    return ids, w


def well_apart_logits(t, e, n_group=1):
    """Logits in [-3, 3] whose selection keys (and group keys) are far apart: each group a distinct level,
    the levels 6 / n_group apart, experts within a group distinct steps of 0.4 x that / group size (so every
    expert of a higher group beats every expert of a lower one); every row a fresh permutation."""
    gs = e // n_group
    gap = 6.0 / n_group
    out = np.empty((t, e), np.float32)
    for i in range(t):
        levels = RNG.permutation(n_group) * gap - 3.0
        steps = np.concatenate([RNG.permutation(gs) * (0.4 * gap / gs) for _ in range(n_group)])
        out[i] = np.repeat(levels, gs) + steps
    return out


@pytest.mark.parametrize("e,k,renorm", [(128, 4, True), (8, 2, True), (128, 8, False), (1024, 32, True), (3, 3, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_matches_definition(e, k, renorm, dtype):
    lg = (RNG.standard_normal((9, e)) * 2).astype(dtype)
    lg[0] = np.arange(e) % 5  # exact ties: lower ids first
    ids, w = fp4kit.route(lg, k, "softmax", renormalize=renorm)
    assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == w.shape == (9, k)
    rid, rw = spec_route(lg, k, "softmax", renorm)
    np.testing.assert_array_equal(ids, rid)
    np.testing.assert_allclose(w, rw, rtol=5e-5, atol=1e-7)  # fp32 sums of up to E terms against fp64


@pytest.mark.parametrize("e,k,n_group,topk_group,renorm", [(256, 8, 8, 4, True), (256, 8, 8, 8, True),
                                                            (64, 6, 64, 6, False), (40, 3, 5, 2, True)])
def test_sigmoid_grouped_matches_definition(e, k, n_group, topk_group, renorm):
    lg = well_apart_logits(7, e, n_group)
    ids, w = fp4kit.route(lg, k, "sigmoid_grouped", renormalize=renorm, n_group=n_group, topk_group=topk_group,
                          routed_scaling_factor=2.5)
    rid, rw = spec_route(lg, k, "sigmoid_grouped", renorm, n_group, topk_group, 2.5)
    np.testing.assert_array_equal(ids, rid)
    np.testing.assert_allclose(w, rw, rtol=1e-5)


def test_sigmoid_grouped_bias_drops_a_group():
    # Keys (score + bias): 0.85 0.5 | 0.8 0.5 | 0.7 0.75 | 0.5 0.5; groups 2 and 0 kept: experts 0 and 5,
    # not expert 2 (second best overall, its group dropped). Scores 0.75 and 0.5.
    lg = np.zeros((1, 8), np.float32)
    lg[0, 0] = np.log(3.0)
    bias = np.array([0.1, 0, 0.3, 0, 0.2, 0.25, 0, 0], np.float32)
    ids, w = fp4kit.route(lg, 2, "sigmoid_grouped", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                          correction_bias=bias)
    assert ids.tolist() == [[0, 5]]
    np.testing.assert_allclose(w, [[1.5, 1.0]], rtol=1e-6)
    ids, _ = fp4kit.route(lg, 2, "sigmoid_grouped", n_group=4, topk_group=4, correction_bias=bias)
    assert ids.tolist() == [[0, 2]]


def test_nan_token_and_empty_batch():
    lg = RNG.standard_normal((3, 16)).astype(np.float32)
    lg[1, 7] = np.nan
    ids, w = fp4kit.route(lg, 4)
    assert (ids[1] == -1).all() and np.isnan(w[1]).all()
    assert (ids[[0, 2]] >= 0).all() and np.isfinite(w[[0, 2]]).all()
    ids, w = fp4kit.route(np.zeros((0, 16), np.float32), 4)
    assert ids.shape == (0, 4) and w.shape == (0, 4)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda lg: fp4kit.route(lg, 0), ValueError, r"k: must be in \[1, min\(logits.shape\[1\] = 8, 32\)\] \(got 0\)"),
    (lambda lg: fp4kit.route(lg, 9), ValueError, r"k: must be in \[1, min"),
    (lambda lg: fp4kit.route(lg, 2.0), TypeError, "k: must be an int"),
    (lambda lg: fp4kit.route(lg, 2, "topk"), ValueError, 'routing: must be "softmax" or "sigmoid_grouped"'),
    (lambda lg: fp4kit.route(lg, 2, renormalize=1), TypeError, "renormalize: must be a bool"),
    (lambda lg: fp4kit.route(lg, 2, n_group=2), ValueError, 'n_group: applies to routing="sigmoid_grouped" only'),
    (lambda lg: fp4kit.route(lg, 2, correction_bias=np.zeros(8, np.float32)), ValueError,
     'correction_bias: applies to routing="sigmoid_grouped" only'),
    (lambda lg: fp4kit.route(lg, 2, "sigmoid_grouped", n_group=3), ValueError,
     r"^n_group: must divide num_experts = 8 \(got 3\)"),
    (lambda lg: fp4kit.route(lg, 2, "sigmoid_grouped", n_group=4, topk_group=5), ValueError,
     r"topk_group: must be in \[1, n_group = 4\] \(got 5\)"),
    (lambda lg: fp4kit.route(lg, 3, "sigmoid_grouped", n_group=4, topk_group=1), ValueError,
     r"^k: must be <= topk_group \* experts per group = 1 \* 2 \(got 3\)"),
    (lambda lg: fp4kit.route(lg, 2, "sigmoid_grouped", routed_scaling_factor=0.0), ValueError,
     "routed_scaling_factor: must be positive and finite"),
    (lambda lg: fp4kit.route(lg, 2, "sigmoid_grouped", correction_bias=np.zeros(7, np.float32)), ValueError,
     r"correction_bias: shape must be \(8,\), one per expert"),
    (lambda lg: fp4kit.route(lg, 2, "sigmoid_grouped", correction_bias=np.zeros(8, np.float64)), TypeError,
     "correction_bias: dtype must be float32"),
    (lambda lg: fp4kit.route(lg.astype(np.float64), 2), TypeError, "logits: dtype must be float32, float16 or bfloat16"),
    (lambda lg: fp4kit.route(lg[:, ::2], 2), ValueError, "logits: must be C-contiguous"),
    (lambda lg: fp4kit.route(lg[0], 2), ValueError, r"logits: must have 2 dimension\(s\)"),
    (lambda lg: fp4kit.route(np.zeros((2, 1025), np.float32), 2), ValueError, "logits: routing takes 1 to 1024 experts"),
])
def test_argument_errors(call, exc, msg):
    lg = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(exc, match=msg):
        call(lg)
