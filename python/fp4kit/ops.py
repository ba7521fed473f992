"""``torch.ops.fp4kit``: fp4kit as PyTorch custom operators.

Registering the operations with the dispatcher (rather than calling them as plain Python functions)
is what lets them live inside ``torch.compile(fullgraph=True)`` graphs and CUDA graphs: each op has a
schema that states what it reads, writes and returns (none of them mutates an input), a fake (meta)
implementation that computes output shapes without running anything, a CUDA implementation (the
kernels, on the current stream, no host synchronisation) and a CPU implementation (the host code, and
for ``gemm`` the spec-level reference: dequantize, then an fp32 matmul), so the same program runs and
can be checked on a machine without a GPU.

    torch.ops.fp4kit.quantize(w, format, tensor_scale=None) -> (packed, scales, tensor_scale)
    torch.ops.fp4kit.prepack(packed, scales, tensor_scale, format, n, k) -> buffer
    torch.ops.fp4kit.gemm(x, buffer, format, n, k, bias=None) -> y
    torch.ops.fp4kit.fused_moe(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                               b_gate_up=None, b_down=None, alpha=1.702, limit=7.0) -> y
    torch.ops.fp4kit.route(logits, k, routing="softmax", renormalize=True, n_group=1, topk_group=1,
                           routed_scaling_factor=1.0, correction_bias=None) -> (topk_ids, topk_weights)

``fused_moe`` is the Mixture-of-Experts layer for given routing (fp4kit.moe.fused_moe documents it); its
expert weights are the stacked buffers of fp4kit.moe.stack_experts (format "nvfp4"/"mxfp4": uint8 [E, stride]
prepacked; format "bf16": bfloat16 [E, n, k]), and its CPU implementation is fp4kit.moe.moe_reference on the
dequantized (or bfloat16) experts.

The scratch workspaces of the GEMM and of the MoE layer are managed inside the CUDA implementations (like
cuBLAS's): in eager mode one buffer per (device, stream) for each op (the GEMM's zero-filled; the MoE layer's
needs no initialisation: see _moe_workspace), and a fresh one per call while a CUDA graph is being captured, so captured graphs never
share scratch memory with eager calls.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Tuple

import torch

from . import _C, group_size, moe, torch_ops

__all__ = ["dequantize_packed"]

_lib = torch.library.Library("fp4kit", "DEF")
_lib.define("quantize(Tensor w, str format, Tensor? tensor_scale=None) -> (Tensor, Tensor, Tensor)")
_lib.define("prepack(Tensor packed, Tensor scales, Tensor? tensor_scale, str format, int n, int k) -> Tensor")
_lib.define("gemm(Tensor x, Tensor w, str format, int n, int k, Tensor? bias=None) -> Tensor")
_lib.define("fused_moe(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w_gate_up, Tensor w_down, str format, "
            "int inter, str activation, str layout, Tensor? b_gate_up=None, Tensor? b_down=None, "
            "float alpha=1.702, float limit=7.0) -> Tensor")
_lib.define("route(Tensor logits, int k, str routing='softmax', bool renormalize=True, int n_group=1, "
            "int topk_group=1, float routed_scaling_factor=1.0, Tensor? correction_bias=None) -> (Tensor, Tensor)")


# ---- route ------------------------------------------------------------------------------------------
def _route(logits, k, routing="softmax", renormalize=True, n_group=1, topk_group=1, routed_scaling_factor=1.0,
           correction_bias=None):
    return torch_ops.route(logits, k, routing, renormalize, n_group, topk_group, routed_scaling_factor,
                           correction_bias)


_lib.impl("route", _route, "CPU")
_lib.impl("route", _route, "CUDA")


@torch.library.register_fake("fp4kit::route")
def _route_fake(logits, k, routing="softmax", renormalize=True, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                correction_bias=None):
    t = logits.shape[0]
    return (logits.new_empty((t, k), dtype=torch.int32), logits.new_empty((t, k), dtype=torch.float32))


# ---- quantize ---------------------------------------------------------------------------------------
def _quantize(w, format, tensor_scale=None):
    return torch_ops.quantize(w, format, tensor_scale)


_lib.impl("quantize", _quantize, "CPU")
_lib.impl("quantize", _quantize, "CUDA")


@torch.library.register_fake("fp4kit::quantize")
def _quantize_fake(w, format, tensor_scale=None):
    n, k = w.shape
    g = group_size(format)
    return (w.new_empty((n, k // 2), dtype=torch.uint8), w.new_empty((n, k // g), dtype=torch.uint8),
            w.new_empty((1,), dtype=torch.float32))


# ---- prepack ----------------------------------------------------------------------------------------
def _prepack(packed, scales, tensor_scale, format, n, k):
    return torch_ops.prepack(packed, scales, tensor_scale, format, n, k)


_lib.impl("prepack", _prepack, "CPU")
_lib.impl("prepack", _prepack, "CUDA")


@torch.library.register_fake("fp4kit::prepack")
def _prepack_fake(packed, scales, tensor_scale, format, n, k):
    return packed.new_empty((torch_ops._total_bytes(format, n, k),), dtype=torch.uint8)


# ---- gemm -------------------------------------------------------------------------------------------
def dequantize_packed(buffer: torch.Tensor, format: str, n: int, k: int) -> torch.Tensor:
    """Float32 [n, k] weights of a prepacked buffer (host computation; the CPU GEMM and tests use it).

    Per the spec: e2m1 * block scale * tensor scale, with the per-row tensor scale read back from the
    buffer (a row holding a NaN block scale dequantizes to NaN, as its GEMM outputs are)."""
    buf = buffer.detach().to("cpu").contiguous().numpy()
    packed, scales = _C.unpack_cpu(format, n, k, buf)
    w = torch.from_numpy(_C.dequantize_cpu(packed, scales, 1.0, format))
    if format == "nvfp4":
        lay = _C.packed_layout(format, n, k)
        off = lay["out_scale_offset"]
        row = torch.from_numpy(buf[off:off + 4 * n].copy().view("float32")) / 512.0
        w = w * row[:, None]
    return w


def _gemm_cpu(x, w, format, n, k, bias=None):
    if x.shape[-1] != k:
        raise ValueError(f"x: last dimension must be k = {k} (got shape {tuple(x.shape)})")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x: dtype must be torch.bfloat16 or torch.float16 (got {x.dtype})")
    y = x.float() @ dequantize_packed(w, format, n, k).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _gemm_cuda(x, w, format, n, k, bias=None):
    return torch_ops.gemm(x.contiguous(), w, format, n, k, bias=bias)


def _load_cpp_kernels() -> bool:
    """Load libfp4kit_torch (the C++ CUDA kernel of gemm, built when torch was present at build time)."""
    import glob
    import os
    if os.environ.get("FP4KIT_PYTHON_OPS"):  # force the Python kernel (comparisons, debugging)
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    libs = glob.glob(os.path.join(here, "libfp4kit_torch*.so"))
    if not libs:
        return False
    try:
        torch.ops.load_library(libs[0])
    except OSError as e:  # e.g. built against another torch: fall back, and say so
        import warnings
        warnings.warn(f"fp4kit: {libs[0]} did not load ({e}); torch.ops.fp4kit.gemm uses its Python kernel")
        return False
    return True


_lib.impl("gemm", _gemm_cpu, "CPU")
#: True when torch.ops.fp4kit.gemm's CUDA kernel is the C++ one (a few microseconds less host time per
#: call); False when it is _gemm_cuda above. Both check the same rules with the same messages.
CPP_CUDA_KERNEL = _load_cpp_kernels()
if not CPP_CUDA_KERNEL:
    _lib.impl("gemm", _gemm_cuda, "CUDA")


@torch.library.register_fake("fp4kit::gemm")
def _gemm_fake(x, w, format, n, k, bias=None):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must be k = {k}")
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


# ---- fused_moe --------------------------------------------------------------------------------------
def _moe_tensor(t, name: str, dtype: torch.dtype, device: torch.device, ndim: int, why: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor (got {type(t).__name__})")
    if t.dtype != dtype:
        raise TypeError(f"{name}: dtype must be {dtype}{why} (got {t.dtype})")
    if t.device != device:
        raise ValueError(f"{name}: must be on x's device {device} (got {t.device})")
    if t.dim() != ndim:
        raise ValueError(f"{name}: must have {ndim} dimensions (got shape {tuple(t.shape)})")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def _moe_check(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout, b_gate_up, b_down,
               alpha, limit) -> Tuple[int, int, int, int]:
    """The rules of fused_moe, the same on every device (metadata only: no synchronisation). Returns
    (T, H, E, top_k)."""
    bf16 = format == "bf16"
    if not bf16 and format not in ("nvfp4", "mxfp4"):
        raise ValueError(f'format: must be "nvfp4", "mxfp4" or "bf16" (got {format!r})')
    # K multiples: the FP4 group size, or 8 for bf16 experts (16-byte rows).
    g = 8 if bf16 else group_size(format)
    what = "8 (16-byte rows of bf16 experts)" if bf16 else f"the {format} group size {g}"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: must be a torch.Tensor (got {type(x).__name__})")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x: dtype must be torch.bfloat16 or torch.float16 (got {x.dtype})")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x: must be a CPU or CUDA tensor (got {x.device})")
    dev = x.device
    _moe_tensor(x, "x", x.dtype, dev, 2)
    t, h = int(x.shape[0]), int(x.shape[1])
    if isinstance(inter, bool) or not isinstance(inter, int):
        raise TypeError(f"inter: must be an int (got {type(inter).__name__})")
    if inter < 1:
        raise ValueError(f"inter: the intermediate size I must be >= 1 (got {inter})")
    if h < 1 or h % g:
        raise ValueError(f"x: H = x.shape[1] = {h} must be a positive multiple of {what} "
                         "(it is the K of gate_up)")
    if inter % g:
        raise ValueError(f"inter: I = {inter} must be a multiple of {what} (it is the K of down)")
    if activation not in moe.ACTIVATIONS:
        raise ValueError(f"activation: must be one of {moe.ACTIVATIONS} (got {activation!r})")
    if layout not in moe.LAYOUTS:
        raise ValueError(f"layout: must be one of {moe.LAYOUTS} (got {layout!r})")
    for name, v in (("alpha", alpha), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: must be a finite number (got {v!r})")
    if limit <= 0:
        raise ValueError(f"limit: must be positive (got {limit})")
    _moe_tensor(topk_ids, "topk_ids", torch.int32, dev, 2)
    k = int(topk_ids.shape[1])
    if int(topk_ids.shape[0]) != t or k < 1:
        raise ValueError(f"topk_ids: shape must be [T, k] with T = x.shape[0] = {t} and k >= 1 "
                         f"(got {tuple(topk_ids.shape)})")
    _moe_tensor(topk_weights, "topk_weights", torch.float32, dev, 2)
    if tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"topk_weights: shape must be topk_ids' ({t}, {k}) (got {tuple(topk_weights.shape)})")
    e = 0
    for name, buf, n, kk in (("w_gate_up", w_gate_up, 2 * inter, h), ("w_down", w_down, h, inter)):
        if bf16:
            _moe_tensor(buf, name, torch.bfloat16, dev, 3, ' (format "bf16": experts [E, n, k], '
                        "fp4kit.moe.stack_experts)")
            rows = int(buf.shape[0])
        else:
            _moe_tensor(buf, name, torch.uint8, dev, 2, " (stacked experts, fp4kit.moe.stack_experts)")
            rows, stride = int(buf.shape[0]), int(buf.shape[1])
        if name == "w_gate_up":
            e = rows
            if e < 1:
                raise ValueError(f"w_gate_up: needs at least one expert (got shape {tuple(buf.shape)})")
        elif rows != e:
            raise ValueError(f"w_down: must hold one row per expert, E = w_gate_up.shape[0] = {e} (got {rows})")
        if bf16:
            if tuple(buf.shape[1:]) != (n, kk):
                raise ValueError(f"{name}: shape must be (E, {n}, {kk}), one row-major [n, k] bfloat16 matrix per "
                                 f"expert (got {tuple(buf.shape)})")
            continue
        need = torch_ops._total_bytes(format, n, kk)
        if stride < need:
            raise ValueError(f"{name}: each expert's row must hold packed_layout({format!r}, {n}, {kk})"
                             f"[\"total_bytes\"] = {need} bytes (got shape {tuple(buf.shape)}); "
                             "stacked for another format, H or I?")
        if stride % moe.STACK_ALIGN:
            raise ValueError(f"{name}: row stride must be a multiple of {moe.STACK_ALIGN} bytes "
                             f"(got {stride}); build it with fp4kit.moe.stack_experts")
    if k > e:
        raise ValueError(f"topk_ids: k = topk_ids.shape[1] = {k} must be <= the number of experts "
                         f"E = w_gate_up.shape[0] = {e}")
    if dev.type == "cuda":  # the kernels' alignment (any tensor torch allocates has it)
        a = 16 if bf16 else moe.STACK_ALIGN
        for name, v, align in (("x", x, 16), ("w_gate_up", w_gate_up, a), ("w_down", w_down, a)):
            if v.data_ptr() % align:
                raise ValueError(f"{name}: data must be {align}-byte aligned (got address {v.data_ptr():#x}); "
                                 "pass the tensor itself, not an offset view")
    for name, b, n in (("b_gate_up", b_gate_up, 2 * inter), ("b_down", b_down, h)):
        if b is not None:  # BF16 experts: bfloat16 biases, whatever x's dtype
            _moe_tensor(b, name, torch.bfloat16 if bf16 else x.dtype, dev, 2,
                        ' (format "bf16": bfloat16)' if bf16 else " (x's dtype)")
            if tuple(b.shape) != (e, n):
                raise ValueError(f"{name}: shape must be ({e}, {n}), one row per expert (got {tuple(b.shape)})")
    return t, h, e, k


def _fused_moe_cpu(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                   b_gate_up=None, b_down=None, alpha=1.702, limit=7.0):
    t, h, e, k = _moe_check(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                            b_gate_up, b_down, alpha, limit)
    if t == 0:
        return x.new_empty((0, h))
    ids = topk_ids.long()
    # A token is computed when each of its ids is in [0, E) and no expert appears in two of its slots (the
    # kernels give one expert at most one row per token); any other token's row is NaN, as on the GPU.
    in_range = (ids >= 0) & (ids < e)
    repeated = torch.tril(ids[:, :, None] == ids[:, None, :], diagonal=-1).any(dim=2)
    valid = in_range & ~repeated
    ids = torch.where(in_range, ids, torch.zeros_like(ids))  # computed, then overwritten with NaN below
    used = set(torch.unique(ids).tolist())
    if format == "bf16":  # moe_reference reads (as float32) only the experts it uses
        wgu, wd = list(w_gate_up.unbind(0)), list(w_down.unbind(0))
    else:
        # Experts nobody routed to are never read: a zero-stride stand-in of the right shape keeps their place.
        wgu = [dequantize_packed(w_gate_up[i], format, 2 * inter, h) if i in used
               else torch.zeros(()).expand(2 * inter, h) for i in range(e)]
        wd = [dequantize_packed(w_down[i], format, h, inter) if i in used else torch.zeros(()).expand(h, inter)
              for i in range(e)]
    # BF16 experts keep BF16 intermediates whatever x's dtype (the kernels' rule, fp4kit/moe.h).
    mid = torch.bfloat16 if format == "bf16" else None
    y = moe.moe_reference(x, ids, topk_weights, wgu, wd, b_gate_up, b_down, activation, layout, alpha=float(alpha),
                          limit=float(limit), intermediate_dtype=mid)
    bad = ~valid.all(dim=1)
    if bool(bad.any()):
        y[bad] = float("nan")
    return y.contiguous()


@functools.lru_cache(maxsize=4096)
def _moe_ws_bytes(device_index: int, t: int, h: int, inter: int, e: int, k: int, act: str, format: str,
                  gate_up_stride: int, down_stride: int, activation: str, layout: str) -> int:
    with torch.cuda.device(device_index):  # the query is about the current device
        return _C.moe_workspace_bytes(t, h, inter, e, k, act, format, gate_up_stride, down_stride, activation, layout)


# The MoE layer's workspace: scratch the C++ op initialises itself (it clears its counters at the start), so
# one buffer per (device, stream) serves every shape in eager mode (grown, never shrunk, the old one released
# stream-ordered), kept apart from the GEMM's (which must stay zeroed between calls). While a CUDA graph is
# being captured, a fresh buffer from the graph's pool.
_moe_workspaces: Dict[Tuple[int, int], torch.Tensor] = {}


def _moe_workspace(device: torch.device, stream: int, nbytes: int) -> torch.Tensor:
    return torch_ops._workspace(device, stream, nbytes, _moe_workspaces, zero_bytes=0)


def _fused_moe_cuda(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                    b_gate_up=None, b_down=None, alpha=1.702, limit=7.0):
    t, h, e, k = _moe_check(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                            b_gate_up, b_down, alpha, limit)
    dev = x.device
    y = torch.empty_like(x)
    if t == 0:
        return y
    # Bytes between experts: uint8 [E, stride] rows, or bf16 [E, n, k] matrices (n * k * 2).
    gu_stride = int(w_gate_up.stride(0)) * w_gate_up.element_size()
    d_stride = int(w_down.stride(0)) * w_down.element_size()
    stream = torch_ops._stream(dev)
    act = "float16" if x.dtype == torch.float16 else "bfloat16"
    ws_bytes = _moe_ws_bytes(dev.index, t, h, inter, e, k, act, format, gu_stride, d_stride, activation, layout)
    ws = _moe_workspace(dev, stream, ws_bytes) if ws_bytes else None
    args = (t, h, inter, e, k, act, x.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(), format,
            w_gate_up.data_ptr(), gu_stride, b_gate_up.data_ptr() if b_gate_up is not None else 0,
            w_down.data_ptr(), d_stride, b_down.data_ptr() if b_down is not None else 0, activation, layout,
            float(alpha), float(limit), y.data_ptr(), ws.data_ptr() if ws is not None else 0, ws_bytes, stream)
    torch_ops._on_device(dev, _C.fused_moe, *args)
    return y


_lib.impl("fused_moe", _fused_moe_cpu, "CPU")
_lib.impl("fused_moe", _fused_moe_cuda, "CUDA")


@torch.library.register_fake("fp4kit::fused_moe")
def _fused_moe_fake(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                    b_gate_up=None, b_down=None, alpha=1.702, limit=7.0):
    return x.new_empty(x.shape)
