"""fp4kit on torch tensors: quantize, prepack and gemm.

A thin layer over fp4kit._C: CUDA tensors go to the raw-pointer entry points on torch's current stream of
the tensor's device (asynchronous, like any torch op); CPU tensors go to the host implementations.
Arguments are checked here, before anything is launched: a wrong type or dtype raises TypeError, a wrong
device, shape or layout raises ValueError, each naming the argument. No hidden copies: non-contiguous
inputs are rejected rather than copied.

Import this module only where torch is installed (``pip install fp4kit[torch]``).
"""
from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence, Tuple, Union

import torch

from . import _C, group_size

__all__ = ["quantize", "prepack", "gemm", "route"]

_ACT = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_W_DTYPES = {torch.float32: "float32", **_ACT}


def _check(t, name: str, dtypes: Sequence[torch.dtype], device: Optional[torch.device] = None,
           shape: Optional[Tuple[int, ...]] = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor (got {type(t).__name__})")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype must be one of {', '.join(map(str, dtypes))} (got {t.dtype})")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: must be on {device} (got {t.device})")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape must be {tuple(shape)} (got {tuple(t.shape)})")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def _u8(t: torch.Tensor) -> torch.Tensor:
    # Checkpoints store scales as float8_e4m3fn / float8_e8m0fnu; fp4kit reads the raw bytes.
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _on_device(device: torch.device, fn, *args) -> None:
    """fn(*args) with `device` current (the raw entry points launch on the current device); the common case,
    already current, without a device switch on the hot path."""
    if device.index == torch.cuda.current_device():
        fn(*args)
    else:
        with torch.cuda.device(device):
            fn(*args)


@functools.lru_cache(maxsize=1024)
def _total_bytes(format: str, n: int, k: int) -> int:
    return _C.packed_layout(format, n, k)["total_bytes"]


@functools.lru_cache(maxsize=4096)
def _gemm_ws_bytes(device_index: int, m: int, format: str, n: int, k: int, act: str) -> int:
    with torch.cuda.device(device_index):  # the query is about the current device
        return _C.gemm_workspace_bytes(m, format, n, k, act)


@functools.lru_cache(maxsize=4096)
def _gemm_ws_zero_bytes(device_index: int, m: int, format: str, n: int, k: int, act: str) -> int:
    with torch.cuda.device(device_index):
        return _C.gemm_workspace_zero_bytes(m, format, n, k, act)


# One zero-filled workspace per (device, stream) in eager mode: fp4kit leaves it zeroed after every call,
# and calls that may run concurrently (different streams) need their own. Grown, never shrunk; the old one is released
# stream-ordered by torch's caching allocator, so a pending kernel on that stream is not disturbed.
_workspaces: Dict[Tuple[int, int], torch.Tensor] = {}


def _workspace(device: torch.device, stream: int, nbytes: int,
               cache: Optional[Dict[Tuple[int, int], torch.Tensor]] = None,
               zero_bytes: Optional[int] = None) -> torch.Tensor:
    """The scratch buffer of a call on (device, stream): from `cache` (default: the GEMM's), grown when too
    small. `zero_bytes`: the leading bytes the op needs zero when it starts (None: all; 0: none, the op
    initialises what it relies on, as the MoE layer does). The GEMM leaves them zero after every call, so a
    cached buffer is cleared once, when it is made."""
    if torch.cuda.is_current_stream_capturing():
        # Inside a CUDA graph capture: a fresh buffer from the graph's private pool, so the graph never
        # shares scratch memory with eager calls (or other graphs). Its captured memset clears only what
        # the op reads before writing (the GEMM's arrival counters: up to 64 KiB, not megabytes of scratch).
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
        clear = nbytes if zero_bytes is None else min(zero_bytes, nbytes)
        if clear:
            ws[:clear].zero_()
        return ws
    new = torch.empty if zero_bytes == 0 else torch.zeros
    cache = _workspaces if cache is None else cache
    key = (device.index, stream)
    ws = cache.get(key)
    if ws is None or ws.numel() < nbytes:
        ws = new(nbytes, dtype=torch.uint8, device=device)
        cache[key] = ws
    return ws


def quantize(w: torch.Tensor, format: str = "nvfp4", tensor_scale: Union[None, float, torch.Tensor] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize W [N, K] (float32/bfloat16/float16; K % group_size == 0) to the checkpoint layout, on W's device.

    Returns (packed uint8 [N, K/2], scales uint8 [N, K/group], tensor_scale float32 [1]); MXFP4's
    tensor_scale is 1. A given NVFP4 tensor_scale (float or float32 [1] tensor) replaces amax / (6 * 448).
    GPU and CPU results are bit-identical.
    """
    g = group_size(format)
    _check(w, "w", tuple(_W_DTYPES))
    if w.dim() != 2:
        raise ValueError(f"w: must have 2 dimensions [N, K] (got {w.dim()})")
    n, k = w.shape
    if k % g:
        raise ValueError(f"w: K = {k} must be a multiple of the group size {g} of {format}")
    if tensor_scale is not None and format != "nvfp4":
        raise ValueError("tensor_scale: only NVFP4 has a tensor scale")
    if w.device.type == "cpu":
        given = float(tensor_scale) if tensor_scale is not None else None
        packed, scales, ts = _C.quantize_cpu(w, format, given)
        return torch.from_numpy(packed), torch.from_numpy(scales), torch.tensor([ts], dtype=torch.float32)
    if w.device.type != "cuda":
        raise ValueError(f"w: must be a CPU or CUDA tensor (got {w.device})")
    dev = w.device
    with torch.cuda.device(dev):
        given_ptr = 0
        if tensor_scale is not None:
            if not isinstance(tensor_scale, torch.Tensor):
                tensor_scale = torch.tensor([float(tensor_scale)], dtype=torch.float32, device=dev)
            _check(tensor_scale, "tensor_scale", (torch.float32,), dev)
            if tensor_scale.numel() != 1:
                raise ValueError(f"tensor_scale: must hold one value (got {tensor_scale.numel()})")
            given_ptr = tensor_scale.data_ptr()
        packed = torch.empty(n, k // 2, dtype=torch.uint8, device=dev)
        scales = torch.empty(n, k // g, dtype=torch.uint8, device=dev)
        ts = torch.ones(1, dtype=torch.float32, device=dev)
        ws = torch.empty(_C.quantize_workspace_bytes(), dtype=torch.uint8, device=dev)  # scratch (amax)
        if n and k:
            _C.quantize_gpu(format, w.data_ptr(), _W_DTYPES[w.dtype], n, k, packed.data_ptr(), scales.data_ptr(),
                            ts.data_ptr(), ws.data_ptr() if ws.numel() else 0, _stream(dev), given_ptr)
    return packed, scales, ts


def prepack(packed: torch.Tensor, scales: torch.Tensor, tensor_scale: Union[None, float, torch.Tensor],
            format: str, n: int, k: int) -> torch.Tensor:
    """Checkpoint layout -> kernel layout: a uint8 [total_bytes] tensor on the inputs' device (run once per
    weight). tensor_scale (NVFP4 only): None (1.0), a float, a float32 [1] tensor, or float32 [N] (one per
    row, for fused projections whose parts carry different scales)."""
    g = group_size(format)
    scales = _u8(scales)
    _check(packed, "packed", (torch.uint8,), None, (n, k // 2))
    _check(scales, "scales", (torch.uint8,), packed.device, (n, k // g))
    if k % g:
        raise ValueError(f"k: must be a multiple of the group size {g} of {format} (got {k})")
    if tensor_scale is not None and format != "nvfp4":
        # quantize() returns ones for MXFP4; passing them back is harmless (one host sync, offline).
        ones = bool((tensor_scale == 1).all()) if isinstance(tensor_scale, torch.Tensor) else float(tensor_scale) == 1.0
        if not ones:
            raise ValueError("tensor_scale: MXFP4 has no tensor scale (give None or 1.0)")
        tensor_scale = None
    dev = packed.device
    if isinstance(tensor_scale, torch.Tensor):
        _check(tensor_scale, "tensor_scale", (torch.float32,), dev)
        if tensor_scale.numel() not in (1, n):
            raise ValueError(f"tensor_scale: must hold 1 or n = {n} values (got {tensor_scale.numel()})")
    if dev.type == "cpu":
        one, row = None, None
        if isinstance(tensor_scale, torch.Tensor):
            if tensor_scale.numel() == 1:
                one = float(tensor_scale.item())
            else:
                row = tensor_scale.reshape(n).numpy()
        elif tensor_scale is not None:
            one = float(tensor_scale)
        return torch.from_numpy(_C.prepack_cpu(format, packed.numpy(), scales.numpy(), one, row))
    if dev.type != "cuda":
        raise ValueError(f"packed: must be a CPU or CUDA tensor (got {dev})")
    with torch.cuda.device(dev):
        if tensor_scale is not None and not isinstance(tensor_scale, torch.Tensor):
            tensor_scale = torch.tensor([float(tensor_scale)], dtype=torch.float32, device=dev)
        one_ptr = row_ptr = 0
        if tensor_scale is not None:
            if tensor_scale.numel() == 1:
                one_ptr = tensor_scale.data_ptr()
            else:
                row_ptr = tensor_scale.data_ptr()
        # Zero-filled so that no byte of the buffer (alignment gaps included) is ever uninitialised.
        dst = torch.zeros(_total_bytes(format, n, k), dtype=torch.uint8, device=dev)
        _C.prepack_gpu(format, n, k, packed.data_ptr(), scales.data_ptr(), one_ptr, dst.data_ptr(), _stream(dev),
                       row_ptr)
    return dst


def gemm(x: torch.Tensor, packed_buffer: torch.Tensor, format: str, n: int, k: int,
         bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Y[..., n] = X[..., k] @ W^T (+ bias) on the GPU, W given by prepack(). X, bias and Y share X's dtype
    (bfloat16 or float16); all tensors contiguous on X's CUDA device. Returns `out` when given."""
    group_size(format)
    _check(x, "x", tuple(_ACT))
    if x.device.type != "cuda":
        raise ValueError(f"x: must be a CUDA tensor (got {x.device})")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x: last dimension must be k = {k} (got shape {tuple(x.shape)})")
    dev, act = x.device, _ACT[x.dtype]
    _check(packed_buffer, "packed_buffer", (torch.uint8,), dev)
    need = _total_bytes(format, n, k)
    if packed_buffer.numel() < need:
        raise ValueError(f"packed_buffer: must hold {need} bytes for {format} [{n}, {k}] (got {packed_buffer.numel()});"
                         " was it prepacked for another shape?")
    if bias is not None:
        _check(bias, "bias", (x.dtype,), dev, (n,))
    out_shape = tuple(x.shape[:-1]) + (n,)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=dev)
    else:
        _check(out, "out", (x.dtype,), dev, out_shape)
    m = x.numel() // k if k else 0
    if m == 0 or n == 0:
        return out
    stream = _stream(dev)
    ws_bytes = _gemm_ws_bytes(dev.index, m, format, n, k, act)
    ws = None
    if ws_bytes:
        zb = _gemm_ws_zero_bytes(dev.index, m, format, n, k, act) if torch.cuda.is_current_stream_capturing() else None
        ws = _workspace(dev, stream, ws_bytes, zero_bytes=zb)
    args = (m, act, x.data_ptr(), format, n, k, packed_buffer.data_ptr(), bias.data_ptr() if bias is not None else 0,
            out.data_ptr(), ws.data_ptr() if ws is not None else 0, ws_bytes, stream)
    _on_device(dev, _C.gemm, *args)
    return out


def route(logits: torch.Tensor, k: int, routing: str = "softmax", renormalize: bool = True, n_group: int = 1,
          topk_group: int = 1, routed_scaling_factor: float = 1.0,
          correction_bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """MoE routing (fp4kit.route documents it): logits [T, E] (float32, bfloat16 or float16) -> (ids int32
    [T, k], weights float32 [T, k]) on the logits' device; CUDA: one kernel on the current stream, no host
    synchronisation; CPU: the host reference."""
    _check(logits, "logits", tuple(_W_DTYPES))
    if logits.dim() != 2:
        raise ValueError(f"logits: must have 2 dimensions [tokens, experts] (got shape {tuple(logits.shape)})")
    t, e = (int(v) for v in logits.shape)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k: must be an int (got {type(k).__name__})")
    if not 1 <= k <= min(e, 32):
        raise ValueError(f"k: must be in [1, min(logits.shape[1] = {e}, 32)] (got {k})")
    if correction_bias is not None:
        _check(correction_bias, "correction_bias", (torch.float32,), logits.device, (e,))
    if logits.device.type == "cpu":
        ids, w = _C.route_cpu(logits, k, routing, renormalize, n_group, topk_group, float(routed_scaling_factor),
                              correction_bias)
        return torch.from_numpy(ids), torch.from_numpy(w)
    ids = torch.empty((t, k), dtype=torch.int32, device=logits.device)
    w = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    if t == 0:
        return ids, w
    _on_device(logits.device, _C.route, t, e, k, routing, logits.data_ptr(), _W_DTYPES[logits.dtype], renormalize,
               n_group, topk_group, float(routed_scaling_factor),
               correction_bias.data_ptr() if correction_bias is not None else 0, ids.data_ptr(), w.data_ptr(),
               _stream(logits.device))
    return ids, w
