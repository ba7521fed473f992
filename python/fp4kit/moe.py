"""Mixture-of-experts, spec level: routing, token alignment, activations and a reference MoE layer.

These are the definitions the fused MoE GPU kernel is tested against (torch, any device; float32 math):

    ids, w = route_softmax_topk(logits, k, renormalize)                 # gpt-oss, Mixtral, Qwen3
    ids, w = route_sigmoid_grouped_topk(logits, k, n_group, topk_group,
                                        routed_scaling_factor, correction_bias)   # DeepSeek-V3
    a = align_tokens(ids, num_experts, block)                           # sorting for the grouped GEMM
    y = moe_reference(x, ids, w, w_gate_up, w_down, b_gate_up, b_down, activation, layout)

and the fused layer that runs it (torch.ops.fp4kit.fused_moe: the fp4kit kernels on CUDA, this reference on
the CPU), on experts stacked once into one prepacked buffer per projection:

    w_gate_up = stack_experts(gate_up_weights, "cuda")                  # uint8 [E, stride], n = 2I, k = H
    w_down = stack_experts(down_weights, "cuda")                        # uint8 [E, stride], n = H, k = I
    y = fused_moe(x, ids, w, w_gate_up, w_down, "mxfp4", inter, "swiglu_oai", "interleaved", b_gu, b_d)
    y = fused_moe(x, ids, w, stack_experts(gate_up_bf16), stack_experts(down_bf16), "bf16", inter)  # BF16 experts
    y = fused_moe_from_logits(x, router_logits, k, w_gate_up, w_down, "nvfp4", inter, routing="softmax")

Ties: every top-k here (experts and DeepSeek's groups) is a stable descending sort, so among equal scores
the lower expert (group) id is chosen first, and the returned ids are ordered by descending score.
Bad input raises ValueError (shape, value) or TypeError (dtype, type), naming the argument and the rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from . import _check_softmax_args
from .weights import FP4Weight, _same_format_list

__all__ = ["route_softmax_topk", "route_sigmoid_grouped_topk", "align_tokens", "MoEAlignment", "touched_experts",
           "expert_weight_bytes", "touched_weight_bytes", "silu_and_mul", "swiglu_oai", "moe_reference",
           "stack_experts", "fused_moe", "fused_moe_from_logits"]

LAYOUTS = ("concatenated", "interleaved")
ACTIVATIONS = ("silu", "swiglu_oai")


# ---- validation helpers ---------------------------------------------------------------------------------
def _tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: must be a torch tensor (got {type(x).__name__})")
    return x


def _float_tensor(x: Any, name: str, ndim: int) -> torch.Tensor:
    _tensor(x, name)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name}: dtype must be floating (float32, bfloat16 or float16; got {x.dtype})")
    if x.dim() != ndim:
        raise ValueError(f"{name}: must have {ndim} dimensions (got shape {tuple(x.shape)})")
    return x


def _int(v: Any, name: str, lo: int, hi: Optional[int] = None, rule: str = "") -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: must be an int (got {type(v).__name__})")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {rng}{rule} (got {v})")
    return v


def _no_nan(x: torch.Tensor, name: str) -> None:
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{name}: must not contain NaN")


def _topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last dim, descending; ties: lower index first (stable sort)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def _logits(logits: Any, k: Any) -> Tuple[torch.Tensor, int]:
    _float_tensor(logits, "logits", 2)
    e = int(logits.shape[1])
    if e < 1:
        raise ValueError("logits: needs at least one expert (shape [T, E], E >= 1)")
    _no_nan(logits, "logits")
    return logits.float(), _int(k, "k", 1, e, f" (the number of experts, logits.shape[1] = {e})")


# ---- routing ---------------------------------------------------------------------------------------------
def route_softmax_topk(logits: torch.Tensor, k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: the k experts with the largest logits [T, E]; weights softmax(logits) at those experts,
    renormalized to sum 1 per token when `renormalize` (equal to a softmax over the selected logits, gpt-oss's
    formulation; Mixtral and Qwen3 also renormalize). Returns (topk_ids int32 [T, k], topk_weights float32
    [T, k]), ids by descending logit, ties to the lower expert id."""
    lg, k = _logits(logits, k)
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: must be a bool (got {type(renormalize).__name__})")
    ids = _topk(lg, k)
    if renormalize:
        w = torch.softmax(lg.gather(1, ids), dim=-1)
    else:
        w = torch.softmax(lg, dim=-1).gather(1, ids)
    return ids.to(torch.int32), w


def route_sigmoid_grouped_topk(logits: torch.Tensor, k: int, n_group: int, topk_group: int,
                               routed_scaling_factor: float = 1.0,
                               correction_bias: Optional[torch.Tensor] = None,
                               renormalize: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing. scores = sigmoid(logits [T, E]); selection uses scores + correction_bias [E];
    the E experts form n_group consecutive groups, a group's score is the sum of its top-2 selection scores
    (top-1 if a group has one expert); the topk_group best groups are kept, and the k best experts among them
    chosen. Weights = the chosen scores (without the bias), renormalized to sum 1 (unless renormalize=False),
    times routed_scaling_factor. Returns (topk_ids int32 [T, k], topk_weights float32 [T, k]), ids by
    descending selection score; ties (groups and experts) go to the lower id."""
    lg, k = _logits(logits, k)
    e = int(lg.shape[1])
    _int(n_group, "n_group", 1, e, f" (the number of experts, logits.shape[1] = {e})")
    if e % n_group:
        raise ValueError(f"n_group: must divide the number of experts {e} (got {n_group})")
    _int(topk_group, "topk_group", 1, n_group, f" (n_group = {n_group})")
    gsize = e // n_group
    if k > topk_group * gsize:
        raise ValueError(f"k: must be <= topk_group * experts per group = {topk_group} * {gsize} "
                         f"= {topk_group * gsize} (got {k})")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise TypeError(f"routed_scaling_factor: must be a number (got {type(routed_scaling_factor).__name__})")
    if not (math.isfinite(routed_scaling_factor) and routed_scaling_factor > 0):
        raise ValueError(f"routed_scaling_factor: must be positive and finite (got {routed_scaling_factor})")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: must be a bool (got {type(renormalize).__name__})")
    scores = torch.sigmoid(lg)
    sel = scores
    if correction_bias is not None:
        _float_tensor(correction_bias, "correction_bias", 1)
        if tuple(correction_bias.shape) != (e,):
            raise ValueError(f"correction_bias: shape must be ({e},), one per expert "
                             f"(got {tuple(correction_bias.shape)})")
        if not bool(torch.isfinite(correction_bias).all()):
            raise ValueError("correction_bias: must be finite")
        sel = scores + correction_bias.float().to(scores.device)
    t = int(lg.shape[0])
    grouped = sel.reshape(t, n_group, gsize)
    top2 = torch.sort(grouped, dim=-1, descending=True).values[..., :min(2, gsize)]
    groups = _topk(top2.sum(-1), topk_group)                                    # [T, topk_group]
    keep = torch.zeros(t, n_group, dtype=torch.bool, device=lg.device).scatter_(1, groups, True)
    masked = sel.masked_fill(~keep.repeat_interleave(gsize, dim=1), float("-inf"))
    ids = _topk(masked, k)
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w * float(routed_scaling_factor)


# ---- token alignment -------------------------------------------------------------------------------------
@dataclass
class MoEAlignment:
    """The sorting structure of a grouped GEMM over experts (see align_tokens).

    sorted_ids int32 [P]: flat (token, slot) indices token * k + slot, grouped by expert (ascending expert id,
    ascending flat index within an expert), each expert's segment padded with `sentinel` (= T * k) to a
    multiple of `block`; expert_offsets int32 [E + 1]: expert e's segment is sorted_ids[offsets[e]:offsets[e+1]]
    (all multiples of block, offsets[E] = P); expert_counts int32 [E]: (token, slot) pairs per expert, without
    padding; block_experts int32 [P / block]: the expert of each block; touched int32: the experts with at
    least one token, ascending."""
    sorted_ids: torch.Tensor
    expert_offsets: torch.Tensor
    expert_counts: torch.Tensor
    block_experts: torch.Tensor
    touched: torch.Tensor
    sentinel: int
    block: int
    num_tokens: int
    top_k: int


def _ids(topk_ids: Any, num_experts: Any) -> torch.Tensor:
    _tensor(topk_ids, "topk_ids")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids: dtype must be an integer type, int32 or int64 (got {topk_ids.dtype})")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids: must have 2 dimensions [T, k] (got shape {tuple(topk_ids.shape)})")
    _int(num_experts, "num_experts", 1)
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids: expert ids must be in [0, num_experts) = [0, {num_experts}) "
                         f"(got min {int(topk_ids.min())}, max {int(topk_ids.max())})")
    return topk_ids.long()


def align_tokens(topk_ids: torch.Tensor, num_experts: int, block: int) -> MoEAlignment:
    """Sort the (token, slot) pairs of topk_ids [T, k] by expert and pad each expert's segment to a multiple of
    `block` (the grouped GEMM's M tile); experts without tokens get an empty segment. See MoEAlignment."""
    ids = _ids(topk_ids, num_experts)
    _int(block, "block", 1)
    t, k = int(ids.shape[0]), int(ids.shape[1])
    flat = ids.reshape(-1)
    dev = flat.device
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    offsets = torch.zeros(num_experts + 1, dtype=torch.long, device=dev)
    offsets[1:] = torch.cumsum(padded, 0)
    starts = torch.cumsum(counts, 0) - counts                                   # unpadded segment starts
    experts = flat[order]
    dest = offsets[experts] + torch.arange(flat.numel(), device=dev) - starts[experts]
    sentinel = t * k
    sorted_ids = torch.full((int(offsets[-1]),), sentinel, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    block_experts = torch.repeat_interleave(torch.arange(num_experts, device=dev), padded // block)
    return MoEAlignment(sorted_ids, offsets.to(torch.int32), counts.to(torch.int32),
                        block_experts.to(torch.int32), torch.nonzero(counts).reshape(-1).to(torch.int32),
                        sentinel, block, t, k)


def touched_experts(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The experts that at least one token routes to, ascending (int32): their weights are what a decode step
    must stream."""
    ids = _ids(topk_ids, num_experts)
    return torch.nonzero(torch.bincount(ids.reshape(-1), minlength=num_experts)).reshape(-1).to(torch.int32)


def expert_weight_bytes(format: str, hidden: int, intermediate: int, bias: bool = False) -> int:
    """Bytes of one expert's weights in the checkpoint layout: gate_up [2I, H] and down [H, I].

    "bf16": 2 bytes per value. "nvfp4": packed nibbles + one E4M3 scale per 16 values + three float32 tensor
    scales (gate, up, down). "mxfp4": packed nibbles + one E8M0 scale per 32 values. bias=True adds the
    bfloat16 biases (2I + H values)."""
    h = _int(hidden, "hidden", 1)
    i = _int(intermediate, "intermediate", 1)
    values = 3 * h * i
    if format == "bf16":
        n = 2 * values
    elif format in ("nvfp4", "mxfp4"):
        g = 16 if format == "nvfp4" else 32
        for name, kdim in (("hidden", h), ("intermediate", i)):
            if kdim % g:
                raise ValueError(f"{name}: must be a multiple of the {format} group size {g} (got {kdim})")
        n = values // 2 + values // g + (12 if format == "nvfp4" else 0)
    else:
        raise ValueError(f'format: must be "nvfp4", "mxfp4" or "bf16" (got {format!r})')
    return n + (2 * (2 * i + h) if bias else 0)


def touched_weight_bytes(topk_ids: torch.Tensor, num_experts: int, format: str, hidden: int, intermediate: int,
                         bias: bool = False) -> int:
    """Expert weight bytes one MoE call must read at least once: touched experts * expert_weight_bytes."""
    return int(touched_experts(topk_ids, num_experts).numel()) * expert_weight_bytes(format, hidden, intermediate,
                                                                                      bias)


# ---- activations -----------------------------------------------------------------------------------------
def _split(gate_up: Any, layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    _tensor(gate_up, "gate_up")
    if not gate_up.dtype.is_floating_point:
        raise TypeError(f"gate_up: dtype must be floating (got {gate_up.dtype})")
    if gate_up.dim() < 1 or int(gate_up.shape[-1]) % 2:
        raise ValueError(f"gate_up: last dimension must be even, 2I = gate + up (got shape {tuple(gate_up.shape)})")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS} (got {layout!r})")
    x = gate_up.float()
    if layout == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    i = int(x.shape[-1]) // 2
    return x[..., :i], x[..., i:]


def silu_and_mul(gate_up: torch.Tensor, layout: str = "concatenated") -> torch.Tensor:
    """silu(gate) * up for gate_up [..., 2I]: layout "concatenated" ([gate | up] halves) or "interleaved"
    (even = gate, odd = up). Computed in float32; returns [..., I] in gate_up's dtype."""
    g, u = _split(gate_up, layout)
    return (torch.nn.functional.silu(g) * u).to(gate_up.dtype)


def swiglu_oai(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0,
               layout: str = "interleaved") -> torch.Tensor:
    """gpt-oss SwiGLU: g = clamp(gate, max=limit), u = clamp(up, -limit, limit); g * sigmoid(alpha * g) * (u + 1).
    gate_up [..., 2I] in either layout (gpt-oss checkpoints: "interleaved"). Computed in float32; returns
    [..., I] in gate_up's dtype."""
    for name, v in (("alpha", alpha), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: must be a finite number (got {v!r})")
    if limit <= 0:
        raise ValueError(f"limit: must be positive (got {limit})")
    g, u = _split(gate_up, layout)
    g = g.clamp(max=float(limit))
    u = u.clamp(-float(limit), float(limit))
    return (g * torch.sigmoid(float(alpha) * g) * (u + 1.0)).to(gate_up.dtype)


# ---- reference MoE ---------------------------------------------------------------------------------------
def _expert(w: Any, name: str, shape: Optional[Tuple[int, int]], device: torch.device) -> torch.Tensor:
    """One expert weight as float32 [N, K] on `device` (an FP4Weight dequantized exactly)."""
    if isinstance(w, FP4Weight):
        d = w.dequantize()
        d = d if isinstance(d, torch.Tensor) else torch.from_numpy(d)
    elif isinstance(w, torch.Tensor):
        if not w.dtype.is_floating_point or w.dim() != 2:
            raise TypeError(f"{name}: a tensor expert must be a 2-D floating tensor (got {w.dtype}, "
                            f"shape {tuple(w.shape)})")
        d = w
    else:
        raise TypeError(f"{name}: must be an FP4Weight or a torch tensor (got {type(w).__name__})")
    if shape is not None and tuple(d.shape) != shape:
        raise ValueError(f"{name}: shape must be {shape} (got {tuple(d.shape)})")
    return d.to(device=device, dtype=torch.float32)


def _shape_of(w: Any, name: str) -> Tuple[int, ...]:
    if not isinstance(w, (FP4Weight, torch.Tensor)):
        raise TypeError(f"{name}: must be an FP4Weight or a torch tensor (got {type(w).__name__})")
    return tuple(w.shape)


def _bias(b: Any, name: str, e: int, n: int, device: torch.device) -> Optional[torch.Tensor]:
    if b is None:
        return None
    if isinstance(b, (list, tuple)):
        b = torch.stack([_tensor(v, f"{name}[{i}]").float().to(device) for i, v in enumerate(b)])
    _float_tensor(b, name, 2)
    if tuple(b.shape) != (e, n):
        raise ValueError(f"{name}: shape must be ({e}, {n}), one row per expert (got {tuple(b.shape)})")
    return b.to(device=device, dtype=torch.float32)


def moe_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  w_gate_up: Sequence[Any], w_down: Sequence[Any], b_gate_up: Any = None, b_down: Any = None,
                  activation: str = "silu", layout: str = "concatenated", *, alpha: float = 1.702,
                  limit: float = 7.0, intermediate_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Y[t] = sum_j topk_weights[t, j] * (down_e(act(gate_up_e(x[t]) + b_gate_up[e])) + b_down[e]),
    e = topk_ids[t, j]: Y [T, H] in x's dtype.

    x [T, H] (bfloat16, float16 or float32); topk_ids [T, k] int; topk_weights [T, k] float. w_gate_up: E experts
    [2I, H], w_down: E experts [H, I], each an FP4Weight (any format, dequantized exactly) or a floating tensor.
    b_gate_up [E, 2I] and b_down [E, H] (optional; a tensor or a list of per-expert rows) are added after their
    GEMM. activation "silu" (silu_and_mul) or "swiglu_oai" (alpha, limit); layout "concatenated" or
    "interleaved" for gate_up's rows (and b_gate_up). Math in float32 as the kernel does: the activation output
    is rounded to intermediate_dtype (default: x's dtype when 16-bit, else bfloat16; pass torch.float32 for
    none; float16 saturates at +-65504 as the kernel does, see fp4kit/moe.h), the weighted sum over the top-k
    slots is taken in slot order, then Y is rounded to x's dtype."""
    _float_tensor(x, "x", 2)
    t, h = int(x.shape[0]), int(x.shape[1])
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: must be one of {ACTIVATIONS} (got {activation!r})")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS} (got {layout!r})")
    for name, ws in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if not isinstance(ws, (list, tuple)) or not ws:
            raise TypeError(f"{name}: must be a non-empty list of experts (FP4Weight or tensors)")
    e = len(w_gate_up)
    if len(w_down) != e:
        raise ValueError(f"w_down: must hold one weight per expert, {e} like w_gate_up (got {len(w_down)})")
    s = _shape_of(w_gate_up[0], "w_gate_up[0]")
    if len(s) != 2 or s[1] != h or s[0] % 2:
        raise ValueError(f"w_gate_up[0]: shape must be (2I, H) with H = x.shape[1] = {h} (got {s})")
    i2 = s[0]
    i = i2 // 2
    ids = _ids(topk_ids, e)
    if tuple(ids.shape[:1]) != (t,):
        raise ValueError(f"topk_ids: shape must be [T, k] with T = x.shape[0] = {t} (got {tuple(ids.shape)})")
    k = int(ids.shape[1])
    _float_tensor(topk_weights, "topk_weights", 2)
    if tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"topk_weights: shape must be topk_ids' ({t}, {k}) (got {tuple(topk_weights.shape)})")
    if intermediate_dtype is None:
        intermediate_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    if not isinstance(intermediate_dtype, torch.dtype) or not intermediate_dtype.is_floating_point:
        raise TypeError(f"intermediate_dtype: must be a floating torch dtype (got {intermediate_dtype!r})")
    dev = x.device
    bgu = _bias(b_gate_up, "b_gate_up", e, i2, dev)
    bd = _bias(b_down, "b_down", e, h, dev)
    ids = ids.to(dev)
    xf = x.float()
    slots = torch.zeros(t, k, h, dtype=torch.float32, device=dev)
    for ex in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == ex, as_tuple=True)
        wgu = _expert(w_gate_up[ex], f"w_gate_up[{ex}]", (i2, h), dev)
        wd = _expert(w_down[ex], f"w_down[{ex}]", (h, i), dev)
        hid = xf[tok] @ wgu.T
        if bgu is not None:
            hid = hid + bgu[ex]
        act = silu_and_mul(hid, layout) if activation == "silu" else swiglu_oai(hid, alpha, limit, layout)
        if intermediate_dtype == torch.float16:  # the kernel saturates (clamp keeps NaN)
            act = act.clamp(-65504.0, 65504.0)
        y = act.to(intermediate_dtype).float() @ wd.T
        if bd is not None:
            y = y + bd[ex]
        slots[tok, slot] = y
    out = torch.zeros(t, h, dtype=torch.float32, device=dev)
    wts = topk_weights.float().to(dev)
    for j in range(k):
        out += wts[:, j:j + 1] * slots[:, j]
    return out.to(x.dtype)


# ---- stacked experts and the fused layer -----------------------------------------------------------------
#: Bytes between consecutive experts of a stacked buffer are a multiple of this (the kernel's alignment).
STACK_ALIGN = 256


def stack_experts(weights: Sequence[Union[FP4Weight, torch.Tensor]],
                  device: Union[None, str, torch.device] = None) -> torch.Tensor:
    """Prepack E experts of one projection into one uint8 tensor [E, stride], the layout fused_moe reads.

    BF16 experts: when `weights` are E floating torch tensors [N, K] of one shape, the result is their stack
    as one contiguous bfloat16 tensor [E, N, K] on `device` (values rounded to bfloat16 if they are not), the
    layout fused_moe reads with format "bf16" (row-major weights as checkpoints ship them; no prepack). A
    ready [E, N, K] bfloat16 tensor can be passed to fused_moe as it is.

    weights: E FP4Weights of one format and one shape (N, K) (gate_up: (2I, H); down: (H, I)), numpy or torch
    arrays. Each is prepacked (fp4kit.torch_ops.prepack: on the GPU for CUDA tensors, on the host for CPU ones)
    on `device` (default: the weights' device, which must then be one for all) with its per-row tensor scales,
    and written to row e; stride = packed_layout(format, N, K)["total_bytes"] rounded up to a multiple of 256,
    the padding zero-filled. The FP4Weights are not modified. Run once per layer, not per call."""
    from . import torch_ops
    if isinstance(weights, (str, bytes, FP4Weight, torch.Tensor)) or not hasattr(weights, "__iter__"):
        raise TypeError(f"weights: must be a sequence of FP4Weight or of torch tensors (BF16 experts), one per expert "
                        f"(got {type(weights).__name__})")
    weights = list(weights)
    if weights and isinstance(weights[0], torch.Tensor):
        return _stack_bf16(weights, device)
    weights = _same_format_list(weights, "expert", "the experts of one stack must share format and shape",
                                same_k_only=False)
    first = weights[0]
    if device is None:
        for i, w in enumerate(weights[1:], 1):
            if w.device != first.device:
                raise ValueError(f"weights[{i}]: on {w.device}, weights[0] on {first.device}; give `device` "
                                 "to stack experts held on different devices")
        device = first.device
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: not a torch device ({device!r}: {e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: must be a CPU or CUDA device (got {dev})")
    n, k = first.shape
    total = torch_ops._total_bytes(first.format, n, k)
    stride = -(-total // STACK_ALIGN) * STACK_ALIGN
    out = torch.zeros(len(weights), stride, dtype=torch.uint8, device=dev)
    for e, w in enumerate(weights):
        moved = w.to(dev)  # a new FP4Weight (torch tensors on dev); `w` keeps its arrays and its `prepacked`
        buf = torch_ops.prepack(moved.packed, moved.scales, moved.tensor_scale, w.format, n, k)
        out[e, :total].copy_(buf)
    return out


def _stack_bf16(weights: List[Any], device: Union[None, str, torch.device]) -> torch.Tensor:
    """stack_experts for BF16 experts: E floating tensors [N, K] -> contiguous bfloat16 [E, N, K]."""
    first = weights[0]
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"weights[{i}]: must be a torch tensor like weights[0] (got {type(w).__name__}); "
                            "a stack holds FP4Weights or bfloat16 tensors, not both")
        if not w.dtype.is_floating_point or w.dim() != 2:
            raise TypeError(f"weights[{i}]: a BF16 expert must be a 2-D floating tensor [N, K] (got {w.dtype}, "
                            f"shape {tuple(w.shape)})")
        if w.shape != first.shape:
            raise ValueError(f"weights[{i}]: shape {tuple(w.shape)} differs from weights[0]'s {tuple(first.shape)}; "
                             "the experts of one stack must share their shape")
        if device is None and w.device != first.device:
            raise ValueError(f"weights[{i}]: on {w.device}, weights[0] on {first.device}; give `device` "
                             "to stack experts held on different devices")
    try:
        dev = torch.device(device) if device is not None else first.device
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: not a torch device ({device!r}: {e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: must be a CPU or CUDA device (got {dev})")
    return torch.stack([w.to(device=dev, dtype=torch.bfloat16) for w in weights]).contiguous()


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, format: str, inter: int, activation: str = "silu",
              layout: str = "concatenated", b_gate_up: Optional[torch.Tensor] = None,
              b_down: Optional[torch.Tensor] = None, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """The MoE layer for given routing: Y[t] = sum_j topk_weights[t, j] * down_e(act(gate_up_e(x[t]))), e =
    topk_ids[t, j] (see moe_reference), through torch.ops.fp4kit.fused_moe. Returns a new Y [T, H], x's dtype.

    x bfloat16 or float16 [T, H], contiguous; topk_ids int32 [T, k]; topk_weights float32 [T, k] (route_softmax_topk and
    route_sigmoid_grouped_topk return both); w_gate_up, w_down: stack_experts() buffers of the E experts' gate_up
    (2I x H) and down (H x I) weights, both in `format`: "nvfp4" or "mxfp4" (uint8 [E, stride], prepacked), or
    "bf16" (bfloat16 [E, 2I, H] and [E, H, I], contiguous, row-major as checkpoints ship them; H and I
    multiples of 8; the same layer through fp4kit's BF16 expert kernel, the baseline FP4 is measured against);
    inter = I; activation "silu"
    (silu(gate) * up) or "swiglu_oai" (gpt-oss, with alpha and limit); layout of the gate_up rows (and of
    b_gate_up): "concatenated" ([gate; up]) or "interleaved" (gate, up alternating, as gpt-oss stores them);
    b_gate_up [E, 2I] and b_down [E, H]: optional biases of x's dtype (bfloat16 with format "bf16"). All
    tensors on x's device.

    CUDA: the fused kernels on the current stream; no host synchronisation and no allocation other than Y (and
    the zero-filled workspace, once per stream), so it can be captured in a CUDA graph and compiled with
    torch.compile(fullgraph=True). The h and activation intermediates and each expert's output are rounded to
    x's dtype (as unfused layers of that dtype would; format "bf16": to bfloat16, and float16 x is used exactly,
    as two bfloat16 terms on the tensor cores); in float16, h and the activation output saturate at
    +-65504 instead of overflowing (exact for swiglu_oai, whose clamps lie inside the range; see
    include/fp4kit/moe.h), each expert's output and Y do not. A token with an expert id outside [0, E), or with one expert in
    two of its slots, gets a NaN row (reporting it would need a host synchronisation); the other tokens are
    unaffected. CPU: moe_reference on the dequantized (or bfloat16) experts (same rules, same errors, same NaN
    rows).
    Bad arguments raise TypeError (type, dtype) or ValueError (shape, device, value) naming the argument."""
    from . import ops as _ops  # noqa: F401  (registers torch.ops.fp4kit)
    return torch.ops.fp4kit.fused_moe(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation,
                                      layout, b_gate_up, b_down, alpha, limit)


ROUTINGS = ("softmax", "sigmoid_grouped")


def fused_moe_from_logits(x: torch.Tensor, router_logits: torch.Tensor, k: int, w_gate_up: torch.Tensor,
                          w_down: torch.Tensor, format: str, inter: int, activation: str = "silu",
                          layout: str = "concatenated", b_gate_up: Optional[torch.Tensor] = None,
                          b_down: Optional[torch.Tensor] = None, alpha: float = 1.702, limit: float = 7.0, *,
                          routing: str = "softmax", renormalize: bool = True, n_group: int = 1,
                          topk_group: int = 1, routed_scaling_factor: float = 1.0,
                          correction_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Route router_logits [T, E] to k experts per token, then fused_moe (same arguments after `k`).

    routing "softmax": route_softmax_topk(router_logits, k, renormalize) (gpt-oss, Mixtral, Qwen3).
    routing "sigmoid_grouped": route_sigmoid_grouped_topk(router_logits, k, n_group, topk_group,
    routed_scaling_factor, correction_bias, renormalize) (DeepSeek-V3). The routing checks router_logits for
    NaN on the host (a synchronisation): to capture a CUDA graph, route with fp4kit.route (the same
    definitions in one kernel, no synchronisation: a NaN logit gives that token a NaN row) and call
    fused_moe."""
    if routing == "softmax":
        _check_softmax_args(n_group, topk_group, routed_scaling_factor, correction_bias)
        ids, wts = route_softmax_topk(router_logits, k, renormalize)
    elif routing == "sigmoid_grouped":
        ids, wts = route_sigmoid_grouped_topk(router_logits, k, n_group, topk_group, routed_scaling_factor,
                                              correction_bias, renormalize)
    else:
        raise ValueError(f"routing: must be one of {ROUTINGS} (got {routing!r})")
    return fused_moe(x, ids.contiguous(), wts.contiguous(), w_gate_up, w_down, format, inter, activation, layout,
                     b_gate_up, b_down, alpha, limit)
